"""Engine frames of a traceback: the deepest frame of a crash that lies in the engine's
code, ``{"function", "module", "file", "line"}`` with ``file`` relative to the directory holding the
engine's top package (``verl/utils/torch_functional.py``), so a fork's checkout gives its own lines.

Frames are read from formatted tracebacks (``File "…", line N, in f``), so a gloo rank's traceback
carried in a message counts as much as the process's own; the compact form :func:`frame_text` writes into a
sentence (``engine frame verl/x.py:12 in f``) is for the reader, and a ``contract`` clause carries its frame as
a field. Without a list of engine
packages, a frame is the engine's when its file lies outside rlconform, torch, NumPy, hypothesis,
pytest and the standard library.
"""

from __future__ import annotations

import os
import re
import sysconfig
from typing import Iterable

_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>[^\n]+)')
#: top-level names whose frames are never the engine's
NOT_ENGINE = ("rlconform", "torch", "numpy", "hypothesis", "_pytest", "pytest", "pluggy", "_hypothesis_globals")
_RLCONFORM_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_STDLIB = os.path.abspath(sysconfig.get_paths().get("stdlib", "/nonexistent"))


def frames(text: str) -> list[tuple[str, int, str]]:
    """``(file, line, function)`` of every frame of a formatted traceback ``text``, in order."""
    return [(m["file"], int(m["line"]), m["func"].strip()) for m in _FRAME.finditer(text or "")]


def package_relative(path: str) -> tuple[str, str]:
    """``(file relative to the directory holding its top package, dotted module)`` of a source path;
    a relative path (already in that form) is returned as it is."""
    if not os.path.isabs(path):
        return path, path[:-3].replace("/", ".").removesuffix(".__init__") if path.endswith(".py") else path
    path = os.path.abspath(path)
    d = os.path.dirname(path)
    while os.path.exists(os.path.join(d, "__init__.py")) and os.path.dirname(d) != d:
        d = os.path.dirname(d)
    rel = os.path.relpath(path, d)
    return rel, rel[:-3].replace(os.sep, ".").removesuffix(".__init__")


def _top(rel: str) -> str:
    return rel.split("/", 1)[0].split(os.sep, 1)[0].removesuffix(".py")


def is_engine_file(path: str, packages: Iterable[str] | None = None) -> bool:
    """Whether a frame's file is engine code: inside one of ``packages`` (top-level names) when given,
    else outside rlconform, the libraries of :data:`NOT_ENGINE` and the standard library."""
    if path.startswith("<"):
        return False
    rel, _ = package_relative(path)
    top = _top(rel)
    if packages:
        return top in set(packages)
    if top in NOT_ENGINE:
        return False
    if os.path.isabs(path):
        p = os.path.abspath(path)
        if p.startswith(_RLCONFORM_ROOT + os.sep) and "site-packages" not in p[len(_RLCONFORM_ROOT):]:
            return False
        if p.startswith(_STDLIB + os.sep) and "site-packages" not in p:
            return False
    return True


def deepest_frame(texts: Iterable[str], packages: Iterable[str] | None = None) -> dict | None:
    """The deepest engine frame over ``texts`` (the last engine frame of the last text that has one), with
    ``caller``: the engine frame that called it in the same traceback, when that is another function (how the
    crash was reached: verl's ``Metric.append`` from ``Metric.__init__``), else absent."""
    pkgs = [p.split(".", 1)[0] for p in (packages or ()) if p]
    best = None
    for text in texts:
        previous = None
        for file, line, func in frames(text or ""):
            if is_engine_file(file, pkgs):
                rel, mod = package_relative(file)
                here = {"function": qualname(mod, func, line), "module": mod, "file": rel.replace(os.sep, "/"),
                        "line": line}
                if previous and previous["function"] != here["function"]:
                    here["caller"] = {k: previous[k] for k in ("function", "module", "file", "line")}
                best = previous = here
            else:
                previous = None
    return best


def qualname(module: str, func: str, line: int) -> str:
    """The qualified name (``_VocabParallelEntropy.backward``) of the function ``func`` of an imported
    ``module`` whose code spans ``line``; ``func`` itself when the module is not imported or no such
    function is found (a traceback prints bare names)."""
    import inspect
    import sys

    mod = sys.modules.get(module)
    if mod is None or "." in func:
        return func
    pending = [v for v in vars(mod).values() if inspect.isclass(v) and getattr(v, "__module__", None) == module]
    funcs = [v for v in vars(mod).values() if inspect.isfunction(v) and v.__module__ == module]
    for cls in pending:
        for v in vars(cls).values():
            v = getattr(v, "__func__", v)
            if inspect.isfunction(v):
                funcs.append(v)
    for f in funcs:
        code = f.__code__
        if code.co_name != func:
            continue
        lines = [n for _, _, n in code.co_lines() if n is not None]
        if lines and min(lines + [code.co_firstlineno]) <= line <= max(lines):
            return f.__qualname__
    return func


def frame_text(exc: BaseException) -> str:
    """`` (engine frame verl/x.py:12 in f)`` for the deepest engine frame of an :class:`EngineCrash`'s
    ``engine_traceback`` (or the exception's own traceback), else ``""``."""
    import traceback

    tb = getattr(exc, "engine_traceback", "") or "".join(traceback.format_exception(exc))
    f = deepest_frame([tb])
    return f" (engine frame {f['file']}:{f['line']} in {f['function']})" if f else ""
