"""The faulty line of an engine function (a maintainer's A): which line of the function a
defect's ``file:line`` cites, by evidence, never by a table of line numbers.

Two sources of evidence; a declared anchor (2) that resolves is cited first, since the binding's reading of
the code is stronger evidence than the spectrum of a few examples (whose discriminating line can be a branch the
failing example happened to take); the spectrum (1) cites the line where nothing is declared:

1. *Spectrum-based fault localization.* :func:`trace_lines` records the lines of the engine function's
   own code objects (its body and the functions, lambdas and comprehensions nested in it; ``sys.settrace``
   restricted to them, so torch's frames are not traced) that execute in one example. Over the failing
   example(s) of a finding (its shrunk input) and a few passing examples of the same finding, each line
   gets its Ochiai suspiciousness ``ef / sqrt(F · (ef + ep))`` (``ef`` / ``ep``: failing / passing runs
   that executed it, ``F`` the failing runs; :func:`ochiai`). The cited line is the top one when it
   *discriminates*: a passing example went past it without running it (it took another branch; a passing
   example that stopped earlier — a declared guard raising — is no evidence about the lines below), it
   scores higher than every line that all runs execute, and it is the last such line in the order of the
   source among equals (the branch's statement, not its ``if``) — :func:`spectrum_line`.
2. *A declared anchor.* Where failing and passing examples run the same lines (tensor code without
   branches: a wrong value computed on every path), the spectrum cannot tell one line from another. A
   binding may declare, per engine function, a regular expression of its faulty source line
   (``Binding.fault_anchors``); :func:`anchor_line` resolves it in the *installed* engine's source of
   that function at run time, so a fork's checkout gets its own line number. A declared pattern that no
   line of the function matches anymore resolves to nothing (the engine changed: the function is cited).

Without either, the function's ``def`` line stays the citation and the report says so ("no single line;
the function"). :func:`localize` returns ``{"line", "evidence": "spectrum" | "anchor" | "function",
"text", "score", "runs": {"failing", "passing"}}``; line numbers are those of the installed source file
(the engine site makes the file relative to the engine's package).
"""

from __future__ import annotations

import inspect
import math
import re
import sys
import types
from typing import Any, Callable, Iterable


def code_objects(fn: Any) -> set:
    """The code objects of ``fn`` (unwrapped: an engine decorator's ``functools.wraps``; a bound method's
    function) and of every function, lambda and comprehension nested in it."""
    target = inspect.unwrap(getattr(fn, "__func__", fn))
    code = getattr(target, "__code__", None)
    out, stack = set(), [code] if code is not None else []
    while stack:
        c = stack.pop()
        if c in out:
            continue
        out.add(c)
        stack += [k for k in c.co_consts if isinstance(k, types.CodeType)]
    return out


def has_branches(fn: Any) -> bool:
    """Whether ``fn``'s code (:func:`code_objects`) holds a conditional jump (an ``if``, a conditional
    expression, a ``while``, ``and`` / ``or``): without one every example runs the same lines (barring an
    exception), so passing examples cannot discriminate and are not worth running."""
    import dis

    return any("JUMP" in ins.opname and "IF" in ins.opname
               for code in code_objects(fn) for ins in dis.get_instructions(code))


def trace_lines(fns: Iterable[Any], thunk: Callable[[], Any]) -> tuple[set, Any, BaseException | None]:
    """Run ``thunk()`` recording the lines executed in the code of ``fns`` (:func:`code_objects`):
    ``({(filename, line)}, result, exception)`` — the exception is caught and returned (the example's
    verdict is the caller's). Frames of any other code are not traced line by line (the global trace
    function returns None for them), so the cost is one call event per Python call plus one line event per
    executed line of the engine function."""
    codes = set()
    for fn in fns:
        codes |= code_objects(fn)
    seen: set = set()

    def local(frame, event, arg):
        if event == "line":
            seen.add((frame.f_code.co_filename, frame.f_lineno))
        return local

    def glob(frame, event, arg):
        if frame.f_code in codes:
            seen.add((frame.f_code.co_filename, frame.f_lineno))
            return local
        return None

    old = sys.gettrace()
    sys.settrace(glob)
    result, error = None, None
    try:
        result = thunk()
    except Exception as exc:  # noqa: BLE001 - the example's outcome is the caller's to judge
        error = exc
    finally:
        sys.settrace(old)
    return seen, result, error


def ochiai(failing: list[set], passing: list[set]) -> dict:
    """Ochiai suspiciousness of every line executed by a failing run: ``ef / sqrt(F · (ef + ep))``."""
    total_f = len(failing)
    lines = set().union(*failing) if failing else set()
    out = {}
    for ln in lines:
        ef = sum(ln in run for run in failing)
        ep = sum(ln in run for run in passing)
        out[ln] = ef / math.sqrt(total_f * (ef + ep)) if ef else 0.0
    return out


def spectrum_line(failing: list[set], passing: list[set]) -> tuple[Any, float] | None:
    """The most suspicious line (:func:`ochiai`) and its score when it discriminates: some passing run
    did not execute it, and it scores above every line all runs executed. Among lines of the top score, the
    last in source order (a branch's body after its test). None: no passing run, or no line discriminates
    (every failing line ran in every passing example too)."""
    if not failing or not passing:
        return None
    scores = ochiai(failing, passing)
    if not scores:
        return None
    def branch(ln) -> bool:  # a passing run went past this line without running it: another branch taken
        return any(ln not in run and any(o[0] == ln[0] and o[1] > ln[1] for o in run) for run in passing)

    everywhere = [s for ln, s in scores.items() if all(ln in run for run in passing)]
    floor = max(everywhere) if everywhere else 0.0
    cands = {ln: s for ln, s in scores.items() if branch(ln)}
    if not cands:
        return None
    top = max(cands.values())
    if top <= floor + 1e-12:
        return None
    best = max((ln for ln, s in cands.items() if abs(s - top) <= 1e-12), key=lambda ln: (ln[0], ln[1]))
    return best, top


def source_span(fn: Any) -> tuple[str, list[str], int] | None:
    """``(source file, source lines, first line number)`` of ``fn`` (unwrapped), or None."""
    target = inspect.unwrap(getattr(fn, "__func__", fn))
    try:
        path = inspect.getsourcefile(target)
        lines, first = inspect.getsourcelines(target)
    except (TypeError, OSError):
        return None
    return (path or "", lines, int(first)) if path else None


def anchor_line(fn: Any, pattern: str) -> tuple[int, str] | None:
    """``(line number, stripped source line)`` of the first line of ``fn``'s installed source that
    ``pattern`` (a regular expression) matches, or None (no such line: the engine changed, or no source)."""
    span = source_span(fn)
    if span is None:
        return None
    _, lines, first = span
    rx = re.compile(pattern)
    for i, text in enumerate(lines):
        if rx.search(text):
            return first + i, text.strip()
    return None


def line_text(path: str, line: int) -> str:
    """The stripped source line ``line`` of ``path`` ("" when it cannot be read)."""
    import linecache

    return linecache.getline(path, line).strip()


def localize(fn: Any, failing: list[set] | None = None, passing: list[set] | None = None,
             anchors: Iterable[str] = ()) -> dict:
    """The cited line of engine function ``fn`` (see the module docstring): every declared anchor that resolves
    in ``fn``'s source (or, for an anchor ``(callable, pattern)``, in that callable's), else the discriminating
    line of the traced runs (``failing`` / ``passing``: sets of ``(filename, line)`` from :func:`trace_lines`),
    else its ``def`` line (evidence ``function``)."""
    failing, passing = list(failing or []), list(passing or [])
    runs = {"failing": len(failing), "passing": len(passing)}
    span = source_span(fn)
    own = span[0] if span else None
    if own:  # only the function's own file counts (a nested function lives there too)
        failing = [{x for x in r if x[0] == own} for r in failing]
        passing = [{x for x in r if x[0] == own} for r in passing]
    # an anchor is a pattern in ``fn``'s source, or ``(callable, pattern)``: a line of a function ``fn`` hands
    # its work to (verl's vocab_parallel_entropy -> _VocabParallelEntropy.forward, an autograd Function)
    hits = [h for h in (anchor_line(*a) if isinstance(a, tuple) else anchor_line(fn, a) for a in anchors or ())
            if h is not None]
    if hits:  # every declared line that resolves (two statements that together make the fault), in order: the
        # binding's reading of the code wins over a spectrum of a few examples, whose discriminating line may be a
        # branch the failing example happened to take (verl's OTB: the zero-tail branch, not the masked product)
        return {"line": hits[0][0], "lines": [h[0] for h in hits], "evidence": "anchor", "text": hits[0][1],
                "runs": runs}
    found = spectrum_line(failing, passing)
    if found is not None:
        (path, line), score = found
        return {"line": int(line), "evidence": "spectrum", "text": line_text(path, line), "score": round(score, 3),
                "runs": runs}
    return {"line": None, "evidence": "function", "text": "", "runs": runs}
