"""Where in the engine a finding goes wrong: the engine callable behind an op / variant /
implementation, and for a crash the deepest traceback frame inside the engine's package.

A binding's adapters name the engine callable they call with :func:`calls` (attribute
:data:`CALLS_ATTR`, one callable or a tuple); an adapter that does not is searched: its closure cells
(recursively through nested adapters), then the object itself when it is engine code. A *site* is::

    {"function": "compute_policy_loss_geo_mean", "module": "verl.trainer.ppo.core_algos",
     "file": "verl/trainer/ppo/core_algos.py", "line": 1234}

A finding's site also carries ``calls``: the engine functions the callable names directly
(:func:`callees`). ``file`` is relative to the directory that holds the engine's top package (``verl/…``), so a fork's
checkout on ``--engine-path`` gives its own files and lines; ``line`` is the ``def`` line
(below its decorators) for a callable, the executing line for a crash frame. A failing finding's site
also carries ``fault``, the line the report cites (:func:`fault`: the spectrum of traced examples, else
the binding's declared anchor, else the function; :mod:`rlconform.harness.core.fault_lines`). Code of rlconform, torch,
NumPy and the standard library is never an engine site.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
from typing import Any, Callable, Iterable

from rlconform.harness.core.engine_frames import deepest_frame
from rlconform.harness.core.triggers import failing_labels

#: the attribute an adapter names its engine callable(s) with (see :func:`calls`)
CALLS_ATTR = "rlconform_calls"
#: top packages that are never the engine
NOT_ENGINE = frozenset({"rlconform", "harness", "properties", "distributed_tests", "reference", "torch", "numpy",
                        "hypothesis", "builtins", "functools", "typing", "abc", "dataclasses", "collections",
                        "contextlib", "math", "_pytest", "pytest", "importlib", "tensordict", "omegaconf", "ray"})
#: the parts of an Implementation / AggLoss / MetricPipeline searched for engine callables, in this order
_PARTS = ("fn", "run", "loss", "emit", "reduce_micro", "reduce_dp", "reduce_mini", "finalize")


def calls(engine_fn: Any, *more: Any) -> Callable[[Callable], Callable]:
    """Decorator for an adapter: ``@calls(core_algos.compute_gae_advantage_return)`` records the engine
    callable(s) it calls as ``adapter.rlconform_calls`` and returns the adapter unchanged (its signature
    stays the adapter's: no ``__wrapped__``, which :func:`inspect.signature` would follow)."""

    def mark(adapter):
        setattr(adapter, CALLS_ATTR, (engine_fn, *more) if more else engine_fn)
        return adapter

    return mark


def _top(module: str | None) -> str:
    return (module or "").split(".", 1)[0]


def _module_of(obj: Any) -> str | None:
    obj = getattr(obj, "__func__", obj)  # bound method
    if isinstance(obj, functools.partial):
        obj = obj.func
    return getattr(obj, "__module__", None)


def is_engine_code(obj: Any) -> bool:
    """Whether ``obj`` is a function or class defined outside rlconform / torch / NumPy / the standard
    library (a module under ``sys.stdlib_module_names``)."""
    mod = _module_of(obj)
    top = _top(mod)
    if not top or top in NOT_ENGINE or top in getattr(sys, "stdlib_module_names", ()):
        return False
    return mod.startswith("rlconform") is False


def _declared(obj: Any) -> list:
    named = getattr(obj, CALLS_ATTR, None)
    if named is None:
        return []
    return list(named) if isinstance(named, (tuple, list)) else [named]


def engine_callables(obj: Any, _depth: int = 0, _seen: set | None = None) -> list:
    """The engine callables behind ``obj`` (an adapter, a Variants entry, an Implementation's ``fn``,
    an AggLoss / MetricPipeline), first the declared ones (:func:`calls`), then those found in closures."""
    seen = set() if _seen is None else _seen
    if obj is None or id(obj) in seen or _depth > 4:
        return []
    seen.add(id(obj))
    declared = _declared(obj)
    if declared:
        return [c for d in declared for c in ([d] if is_engine_code(d) else engine_callables(d, _depth + 1, seen))]
    found = []
    parts = [] if inspect.isfunction(obj) else [getattr(obj, a, None) for a in _PARTS]  # Implementation, AggLoss, pipeline
    parts = [p for p in parts if p is not None and callable(p)]
    named = [p for p in parts if _declared(p)]  # a part that names its engine callable speaks for the whole
    for inner in named or parts:
        found += engine_callables(inner, _depth + 1, seen)
    if isinstance(obj, functools.partial):
        found += engine_callables(obj.func, _depth + 1, seen)
    for cell in getattr(getattr(obj, "__func__", obj), "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if callable(value) and not isinstance(value, type) or inspect.isclass(value) and is_engine_code(value):
            found += engine_callables(value, _depth + 1, seen)
    if not found and is_engine_code(obj) and callable(obj):  # engine code itself (or a user's adapter file)
        return [obj]
    out = []
    for f in sorted(found, key=inspect.isclass):  # functions first: a config class is not the computation
        if all(f is not g for g in out):
            out.append(f)
    return out


def package_root(module: str) -> str | None:
    """The directory holding the top package of ``module`` (``…/site-packages`` for ``verl.utils``)."""
    top = sys.modules.get(_top(module))
    path = getattr(top, "__file__", None)
    if not path:
        paths = list(getattr(top, "__path__", []) or [])
        if not paths:
            return None
        return os.path.dirname(os.path.abspath(paths[0]))
    path = os.path.abspath(path)
    if os.path.basename(path) == "__init__.py":
        return os.path.dirname(os.path.dirname(path))
    return os.path.dirname(path)


def relative(path: str, module: str) -> str:
    """``path`` relative to the directory of ``module``'s top package (unchanged when outside it)."""
    root = package_root(module)
    path = os.path.abspath(path)
    if root and path.startswith(root.rstrip(os.sep) + os.sep):
        return os.path.relpath(path, root)
    return path


def def_line(lines: list[str], first: int) -> int:
    """The line of the ``def`` / ``class`` statement of the source ``lines`` that start at line ``first``
    (what :func:`inspect.getsourcelines` returns: its first line is the first decorator's, as is
    ``co_firstlineno``): ``first`` plus the decorators' lines, e.g. 1929 for verl's
    ``@register_policy_loss("geo_mean")`` on line 1928 above ``def compute_policy_loss_geo_mean``."""
    import ast
    import textwrap

    try:
        node = ast.parse(textwrap.dedent("".join(lines))).body[0]
    except (SyntaxError, IndexError, ValueError):
        return int(first)
    return int(first) + getattr(node, "lineno", 1) - 1


def site(fn: Any) -> dict | None:
    """``{"function", "module", "file", "line"}`` of an engine callable (its ``def`` line, below any
    decorator: :func:`def_line`), or None."""
    obj = getattr(fn, "__func__", fn)
    if isinstance(obj, functools.partial):
        obj = obj.func
    target = obj
    if inspect.isclass(obj):
        target = obj
    else:
        target = inspect.unwrap(obj)  # an engine decorator's functools.wraps: the function it decorates
    mod = getattr(target, "__module__", None) or _module_of(obj)
    try:
        path = inspect.getsourcefile(target)
        lines, line = inspect.getsourcelines(target)
    except (TypeError, OSError):
        return None
    line = def_line(lines, line)
    if not path or not mod:
        return None
    return {"function": getattr(target, "__qualname__", getattr(target, "__name__", repr(target))), "module": mod,
            "file": relative(path, mod), "line": int(line)}


def _direct_callees(fn: Any) -> list:
    """The engine functions ``fn``'s own code names directly (a global it calls, ``verl_F.masked_mean``
    through a module it imported), in the order of its code; ``[]`` for anything that is not a plain
    engine function."""
    target = inspect.unwrap(getattr(fn, "__func__", fn))
    code, glb = getattr(target, "__code__", None), getattr(target, "__globals__", None)
    if code is None or glb is None or not is_engine_code(target):
        return []
    names = list(code.co_names)
    found: list = []
    for const in code.co_consts:  # nested functions and comprehensions name their callees too
        if inspect.iscode(const):
            names += [n for n in const.co_names if n not in names]
    modules = [glb[n] for n in names if inspect.ismodule(glb.get(n))]
    candidates = [glb.get(n) for n in names] + [getattr(m, n, None) for m in modules for n in names]
    for obj in candidates:
        obj = inspect.unwrap(obj) if inspect.isfunction(obj) else obj
        if inspect.isfunction(obj) and obj is not target and is_engine_code(obj) and obj not in found:
            found.append(obj)
    return found


#: how deep :func:`callees` follows calls (as far as the report's triage folds a call chain)
CALL_DEPTH = 4


def callees(fn: Any, depth: int = CALL_DEPTH) -> list[str]:
    """``module.qualname`` of the engine functions ``fn``'s code calls, directly (in the order of its code)
    and then through them, up to ``depth`` calls deep, breadth first: SkyRL's
    ``compute_gae_advantage_return`` names ``masked_whiten``, then ``masked_mean`` which that calls. A
    finding carries them (``engine_function["calls"]``), so that a ledger line of a callee three frames
    down (``masked_mean | NaN / inf``) matches its NaN as the report's table folds it, with no other
    finding of the run at hand; ``[]`` for anything that is not a plain engine function. Triage folds a
    finding into the defect of a callee that fails the same way (:mod:`rlconform.harness.report.triage`)."""
    target = inspect.unwrap(getattr(fn, "__func__", fn))
    seen, level, found = {target}, [target], []
    for _ in range(depth):
        nxt = []
        for f in level:
            for obj in _direct_callees(f):
                if obj not in seen:
                    seen.add(obj)
                    nxt.append(obj)
                    found.append(f"{obj.__module__}.{obj.__qualname__}")
        level = nxt
    return found


def autograd_function(fn: Any):
    """The ``torch.autograd.Function`` subclass a thin engine wrapper applies (``return _X.apply(...)``:
    a global it names that is such a class), or None."""
    code = getattr(inspect.unwrap(fn), "__code__", None)
    glb = getattr(inspect.unwrap(fn), "__globals__", {})
    try:
        import torch
    except ImportError:  # pragma: no cover
        return None
    for name in getattr(code, "co_names", ()):
        obj = glb.get(name)
        if inspect.isclass(obj) and issubclass(obj, torch.autograd.Function) and obj is not torch.autograd.Function:
            return obj
    return None


def method_site(cls: type, method: str, module: str) -> dict | None:
    """The site of ``cls.method`` (e.g. ``_VocabParallelEntropy.backward``)."""
    fn = cls.__dict__.get(method)
    fn = getattr(fn, "__func__", fn)
    s = site(fn) if fn is not None else None
    if s:
        s["function"] = f"{cls.__qualname__}.{method}"
    return s


def crash_frame(tracebacks: Iterable[str], packages: Iterable[str]) -> dict | None:
    """The deepest frame inside the engine's top ``packages`` over the formatted tracebacks (see
    :func:`rlconform.harness.core.engine_frames.deepest_frame`; no packages: any frame outside rlconform,
    torch, NumPy and the standard library)."""
    return deepest_frame(tracebacks, list(packages) or None)


def op_object(binding, op: str, regime: str):
    """What the binding calls for the finding ``op`` × ``regime``: the variant's callable (``variant@data``),
    a variant's second implementation (``variant+impl@data``: verl's ``grpo_vectorized``), the alternative implementation's ``fn`` (``impl@data``) or the op's implementation; None when it
    cannot be resolved (the op is unavailable: no site then)."""
    from rlconform.harness.core.opinfo import split_regime

    prefix, _ = split_regime(regime or "")
    try:
        if prefix and prefix in binding.provided_implementations(op):
            return binding.resolve_implementation(op, prefix).fn
        impl = binding.resolve(op)
    except Exception:  # noqa: BLE001 - an op that cannot be loaded has no engine site
        return None
    impls = getattr(impl, "impls", None)
    if prefix and isinstance(impls, dict) and prefix in impls:
        return impls[prefix]
    if prefix and isinstance(impls, dict) and hasattr(impl, "get"):  # ``variant+impl``: a second implementation
        try:
            return impl.get(op, prefix)
        except Exception:  # noqa: BLE001 - not provided: no site
            return None
    return impl


def _resolve_name(name: str):
    import importlib

    module, _, qual = name.partition(":")
    # a module the binding already imported (SkyRL's through its own shim) is taken as it is
    obj = sys.modules.get(module) or importlib.import_module(module)
    for part in qual.split("."):
        obj = getattr(obj, part)
    return obj


def output_labels(clauses) -> list[str]:
    """The outputs a failure record names as failing: the labels of its failing ``value`` clauses
    (:func:`~rlconform.harness.core.triggers.failing_labels`), of its ``difference`` clauses, and the ``key`` of
    a metric lost on its way (a family's ``LABEL missing from the final dict``, an emitted key printed instead of
    logged) as ``lost: KEY`` (a key dropped by the fold is not a value its emitter computed wrong: an
    ``output_sites`` rule tells the two apart by the prefix), in order."""
    clauses = list(clauses or ())
    out = list(failing_labels(clauses))
    out += [c.label.strip() for c in clauses if c.kind == "difference"]
    out += [f"lost: {c.key.strip()}" for c in clauses if c.what == "lost metric" and c.key.strip()
            and (c.kind == "problem" or c.printed)]
    return [x for x in out if x]


def output_site(binding, op: str, clauses, trigger: str = "") -> dict | None:
    """The site of the engine function that computes the first failing output of ``clauses`` (the binding's
    ``output_sites`` rules for ``op``, in order: the first whose output pattern matches a failing clause's label
    and whose trigger pattern matches ``trigger``), or None (no rule applies, or its name cannot be resolved)."""
    import re

    rules = (getattr(binding, "output_sites", None) or {}).get(op) or ()
    labels = output_labels(clauses)
    for output, name, trig, *own in rules:
        if any(re.search(output, lab) for lab in labels) and (not trig or re.search(trig, trigger or "")):
            try:
                fn = _resolve_name(name)
            except Exception:  # noqa: BLE001 - a name this engine version lacks locates nothing
                continue
            s = site(fn)
            if s is not None:
                s["calls"] = callees(fn)
                if own:  # the line that computes this output, where the function computes several
                    s["output_anchor"] = own[0]
                if len(own) > 1:  # an output whose failure is a root cause of its own (a row of its own)
                    s["output_row"] = own[1]
                return s
    return None


def calls_variant(binding, op: str, regime: str) -> str | None:
    """The variant (an aggregation mode) under which the finding's engine function calls the engine's
    aggregation, as the binding declares it (:class:`~rlconform.harness.core.contracts.LossVariants`
    ``calls_agg_mode``, ``agg_modes`` for a variant the engine forces); None when not declared."""
    from rlconform.harness.core.opinfo import split_regime

    try:
        impl = binding.resolve(op)
    except Exception:  # noqa: BLE001 - an op that cannot be loaded declares nothing
        return None
    default = getattr(impl, "calls_agg_mode", None)
    if not default:
        return None
    variant = split_regime(regime or "")[0]
    return (getattr(impl, "agg_modes", None) or {}).get(variant, default)


def finding_site(binding, op: str, prop: str, regime: str, clauses=(),
                 metric: bool = False, trigger: str = "") -> tuple[dict | None, list[str]]:
    """``(engine_function site, engine top packages)`` of a finding. A ``non_destructive`` failure in the
    backward of a thin wrapper around a ``torch.autograd.Function`` is located at that Function's
    ``backward`` (``forward`` for a mutation during the forward); one seen *after another op's backward*
    (``vocab_parallel_sum_pi_squared`` on logits ``vocab_parallel_entropy``'s backward wrote into) at that
    op's Function's ``backward``; a forward mutation deeper down the calls, in another function (another
    package's: Megatron-core's cross entropy under verl's ``vocab_parallel_log_probs_from_logits``), adds
    that statement's site as ``via`` (:func:`mutation_frame`). ``metric``: only logged metrics are
    wrong, so a loss registry's ``combine_metrics`` (how the engine folds the micro-batches' metrics) is
    the site when it names an engine callable. The binding's ``output_sites`` rules for ``op``
    (:func:`output_site`, with the finding's ``trigger``) locate a failing output at the function that
    computes it, first."""
    obj = op_object(binding, op, regime)
    fns = engine_callables(obj) if obj is not None else []
    if metric:
        try:
            fold = getattr(binding.resolve(op), "combine_metrics", None)
        except Exception:  # noqa: BLE001 - no site then
            fold = None
        folded = engine_callables(fold) if fold is not None else []
        fns = folded + fns
    packages = sorted({_top(_module_of(f)) for f in fns if _module_of(f)})
    if binding is not None and getattr(binding, "name", None) and binding.name in sys.modules:
        packages = sorted(set(packages) | {binding.name})
    if not fns:
        return None, packages
    fn = fns[0]
    s = site(fn)
    if s is not None:
        s["calls"] = callees(fn)
        mode = calls_variant(binding, op, regime)
        if mode:
            s["calls_variant"] = mode
    clauses = list(clauses or ())
    mutations = [c for c in clauses if c.kind == "mutation"]
    by_output = output_site(binding, op, clauses, trigger) if prop != "non_destructive" else None
    if by_output is not None:  # one entry point dispatching to several functions: the one that failed
        return by_output, packages
    after = next((c.by_op for c in mutations if c.evidence == "saved" and c.by_op), "") \
        if prop == "non_destructive" else ""
    if after and after != op:  # the tensor was written by another op's backward run before this op
        other = op_object(binding, after, "")
        other_fns = engine_callables(other) if other is not None else []
        cls = autograd_function(other_fns[0]) if other_fns else None
        moved = method_site(cls, "backward", "") if cls is not None else None
        if moved is not None:
            return moved, packages
    if prop == "non_destructive" and s is not None:
        cls = autograd_function(fn)
        forward = any(c.phase == "forward" and not c.by_op for c in mutations)
        backward = any(c.phase == "backward" for c in mutations)
        if cls is not None:  # the first write leads: a forward's, else the backward's
            s = method_site(cls, "forward" if forward or not backward else "backward", s["module"]) or s
        if forward:  # written in place deeper down: name that frame ("via")
            try:
                via = mutation_frame(fn)
            except Exception:  # noqa: BLE001 - a frame that cannot be found is not named
                via = None
            if via is not None and via["function"] != s["function"]:
                s["via"] = {k: via[k] for k in ("function", "module", "file", "line")}
    return s, packages



def op_sites(binding) -> dict[str, dict[str, list[dict]]]:
    """``op -> regime prefix ("" for the op's own implementation, else a variant or implementation name)
    -> the sites of every engine callable behind it`` (a loss registry's ``combine_metrics`` included), for
    ``--changed-since``; an op that cannot be resolved maps to ``{}`` (its findings are then
    always selected). Resolves the ops: run it where engine code may run (the probe's child process)."""
    from rlconform.harness.catalog.ops import OPS
    from rlconform.harness.core.opinfo import split_regime

    out: dict[str, dict[str, list[dict]]] = {}
    for op in binding.provided_ops():
        info = OPS.get(op)
        regimes = {r for profile in (None, "nightly") for _, _, r in info.findings(profile)} if info is not None else set()
        prefixes = {""} | {split_regime(r)[0] or "" for r in regimes}
        by_prefix: dict[str, list[dict]] = {}
        for prefix in sorted(prefixes):
            obj = op_object(binding, op, f"{prefix}@x" if prefix else "")
            if obj is None:
                continue
            fns = engine_callables(obj) or _referenced(obj)
            if not fns:  # the computation cannot be located: the op's findings cannot be ruled out
                by_prefix[prefix] = []
                continue
            try:
                fold = getattr(binding.resolve(op), "combine_metrics", None)
            except Exception:  # noqa: BLE001 - an op that cannot be loaded has no site
                fold = None
            fns += engine_callables(fold) if fold is not None else []
            fns += _every_part(obj)
            sites = []
            for s in map(site, fns):
                if s is not None and all((s["file"], s["function"]) != (t["file"], t["function"]) for t in sites):
                    sites.append(s)
            for s in sites:
                s["top"] = _top(s["module"])
            by_prefix[prefix] = sites
        out[op] = by_prefix
    return out


def _every_part(obj: Any) -> list:
    """The engine callables every stage of ``obj`` (a pipeline's ``emit`` ... ``finalize``, an implementation's ``fn``)
    reaches, each stage on its own (its declared ones, else those it closes over or names through an engine
    module): for ``--changed-since``, where a stage the engine function of a finding does not name still runs the
    engine's code (verl's metric pipeline emits with ``verl_F.masked_mean``; its finding's site is the fold)."""
    holders = [obj]
    if inspect.isfunction(obj):  # an adapter that runs a pipeline it closes over (verl's dp_metric_all_reduce)
        holders = [c.cell_contents for c in (obj.__closure__ or ()) if _filled(c)
                   and not inspect.isfunction(c.cell_contents) and not inspect.ismodule(c.cell_contents)
                   and not inspect.isclass(c.cell_contents) and any(hasattr(c.cell_contents, n) for n in _PARTS)]
    out: list = []
    for holder in holders:
        for name in _PARTS:
            part = getattr(holder, name, None)
            if part is None or not callable(part) or inspect.isclass(part):
                continue
            out += engine_callables(part) + _referenced(part)
    return out


def _referenced(obj: Any, _depth: int = 0) -> list:
    """Engine callables an adapter reaches through a module it holds (``rc.compute_x(...)`` with ``rc`` a
    closure cell or global that is an engine module), or names directly (a global engine function): the
    fallback of :func:`op_sites` for an adapter that neither declares (:func:`calls`) nor closes over its
    engine callable."""
    import types

    fn = inspect.unwrap(getattr(obj, "__func__", obj)) if callable(obj) else None
    code = getattr(fn, "__code__", None)
    if code is None or _depth > 2:
        return []
    names, stack = set(), [code]
    while stack:
        c = stack.pop()
        names |= set(c.co_names) | set(c.co_freevars)
        stack += [k for k in c.co_consts if isinstance(k, types.CodeType)]
    holders = [cell.cell_contents for cell in (fn.__closure__ or ()) if _filled(cell)]
    holders += [v for k, v in (getattr(fn, "__globals__", {}) or {}).items() if k in names]
    out = []
    for h in holders:
        if isinstance(h, types.ModuleType) and _top(h.__name__) not in NOT_ENGINE:
            out += [getattr(h, n) for n in sorted(names) if callable(getattr(h, n, None))
                    and is_engine_code(getattr(h, n))]
        elif callable(h) and is_engine_code(h) and not inspect.isclass(h):
            out.append(h)
        elif inspect.isfunction(h) and not is_engine_code(h):
            out += _referenced(h, _depth + 1)
    seen: list = []
    for f in out:
        if all(f is not g for g in seen):
            seen.append(f)
    return seen


def _filled(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


def _local_engine_refs(fn: Any) -> list:
    """Engine functions and classes ``fn``'s code reaches: globals and function-local imports
    (``from megatron.core import tensor_parallel`` then ``tensor_parallel.vocab_parallel_cross_entropy``), and
    attributes of a class it names (``VocabParallelCrossEntropy.calculate_predicted_logits``)."""
    import dis
    import importlib

    target = inspect.unwrap(getattr(fn, "__func__", fn))
    code, glb = getattr(target, "__code__", None), getattr(target, "__globals__", {}) or {}
    if code is None:
        return []
    holders: dict[str, Any] = {}
    last_module = None
    for ins in dis.get_instructions(code):
        if ins.opname == "IMPORT_NAME":
            last_module = ins.argval
        elif ins.opname == "IMPORT_FROM" and last_module:
            try:
                mod = importlib.import_module(last_module)
                holders[ins.argval] = mod.__dict__.get(ins.argval) or importlib.import_module(
                    f"{last_module}.{ins.argval}")
            except Exception:  # noqa: BLE001 - an import that fails names nothing
                pass
    def attr(holder, name):
        try:  # a module's lazy __getattr__ may import what this machine lacks
            return inspect.getattr_static(holder, name, None) if inspect.isclass(holder) else \
                holder.__dict__.get(name)
        except Exception:  # noqa: BLE001
            return None

    out = []
    for name in code.co_names:
        obj = holders.get(name, glb.get(name))
        for cand in ([obj] if obj is not None else []) + [attr(h, name) for h in holders.values()
                                                           if inspect.ismodule(h) or inspect.isclass(h)] + \
                [attr(g, name) for g in glb.values() if inspect.isclass(g) and is_engine_code(g)]:
            cand = getattr(cand, "__func__", cand)
            if (inspect.isfunction(cand) or inspect.isclass(cand)) and is_engine_code(cand) and \
                    all(cand is not o for o in out) and cand is not target:
                out.append(cand)
    return out


def _inplace_line(fn: Any) -> int | None:
    """The first line of ``fn`` that writes into its first tensor parameter in place (``x -= …``,
    ``x.div_(…)``, ``torch.exp(x, out=x)``), or None."""
    import ast
    import textwrap

    try:
        lines, first = inspect.getsourcelines(inspect.unwrap(fn))
        tree = ast.parse(textwrap.dedent("".join(lines)))
    except (TypeError, OSError, SyntaxError):
        return None
    node = tree.body[0] if tree.body else None
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    params = [a.arg for a in node.args.args if a.arg not in ("self", "cls", "ctx")]
    if not params:
        return None
    p = params[0]
    for sub in ast.walk(node):
        if isinstance(sub, ast.AugAssign) and isinstance(sub.target, ast.Name) and sub.target.id == p:
            return first + sub.lineno - 1
        if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) and sub.func.attr.endswith("_") \
                and not sub.func.attr.startswith("_") and isinstance(sub.func.value, ast.Name) and sub.func.value.id == p:
            return first + sub.lineno - 1
    return None


def mutation_frame(fn: Any, depth: int = 4) -> dict | None:
    """Where a forward that writes into its input does it, when not in ``fn`` itself: the first engine
    function along ``fn``'s calls (:func:`_local_engine_refs`, an autograd Function's ``forward`` for a
    ``.apply``) that writes into its first tensor parameter in place (:func:`_inplace_line`), as a site
    whose ``line`` is that statement — verl's ``vocab_parallel_log_probs_from_logits`` ->
    Megatron-core's ``VocabParallelCrossEntropy.calculate_predicted_logits`` (``vocab_parallel_logits -=
    logits_max``: its fp32 ``.float()`` returned the caller's tensor). None when none is found."""
    seen: set = set()
    frontier = [fn]
    for _ in range(depth):
        nxt = []
        for f in frontier:
            for ref in _local_engine_refs(f):
                if id(ref) in seen:
                    continue
                seen.add(id(ref))
                cands = [ref]
                if inspect.isclass(ref):
                    cands = [getattr(ref, m) for m in ("forward",) if m in ref.__dict__] + \
                            [getattr(ref, m) for m, v in ref.__dict__.items() if isinstance(v, staticmethod)]
                for c in cands:
                    line = _inplace_line(c) if c is not fn else None
                    if line is not None:
                        s = site(c)
                        if s is not None:
                            return {**s, "line": line}
                    nxt.append(c)
        frontier = nxt
    return None


def engine_importer(binding):
    """How this process imports a module of ``binding``'s engine that it has not imported yet (a distributed
    op's engine ran on other processes): the binding's :attr:`Coverage.importer
    <rlconform.harness.catalog.binding.Coverage>` (SkyRL's pydantic shim on Python 3.11, Megatron-core's Triton
    stand-in), else None (:func:`importlib.import_module`)."""
    return getattr(getattr(binding, "coverage", None), "importer", None)


def site_callable(s: dict | None, import_module=None):
    """The engine function a site names (``module`` imported in this process, else imported now with
    ``import_module``, :func:`engine_importer`'s, default :func:`importlib.import_module`; ``function`` a
    qualname: ``_VocabParallelEntropy.backward``), or None."""
    if not s or not s.get("module") or not s.get("function"):
        return None
    obj = sys.modules.get(s["module"])
    if obj is None:  # the process that ran the engine has imported it; elsewhere import it now
        try:
            import importlib

            obj = (import_module or importlib.import_module)(s["module"])
        except Exception:  # noqa: BLE001 - a module this machine cannot import names nothing
            return None
    for part in str(s["function"]).split("."):
        obj = getattr(obj, part, None) if obj is not None else None
    obj = getattr(obj, "__func__", obj)
    return obj if inspect.isfunction(obj) else None


def fault_anchors(binding, s: dict | None, kind: str = "", trigger: str = "") -> tuple:
    """The binding's declared anchors (regular expressions of the faulty line) of the engine function at
    site ``s`` for a failure of ``kind`` (``Binding.fault_anchors``: ``module.qualname`` -> ``{kinds: patterns}``,
    ``kinds`` a regular expression over the kind of failure — ``wrong value``, ``partition dependence``,
    ``NaN``, ``inexact value`` (:func:`rlconform.harness.report.triage.kind`) — so a function's NaN at a
    masked position is not cited at the line of its wrong value). A pattern given as ``(qualname, pattern)``
    is looked for in that function of the same module (returned as ``(callable, pattern)``): the site's
    function hands the work to it (an autograd Function's ``forward``). A rule keyed ``(kinds, triggers)``
    applies only when the finding's ``trigger`` matches ``triggers`` too (one function, two wrong values: SkyRL's
    ``_forward_backward_micro`` under a rejected row and under a micro-batch split)."""
    import re

    if not s:
        return ()
    if s.get("output_anchor"):  # the output site's own line (Binding.output_sites)
        return (s["output_anchor"],)
    rules = (getattr(binding, "fault_anchors", None) or {}).get(f"{s.get('module')}.{s.get('function')}") or {}
    out = []
    for key, pats in rules.items():
        kinds, triggers = key if isinstance(key, tuple) else (key, None)
        if not re.search(kinds, kind or "") or (triggers is not None and not re.search(triggers, trigger or "")):
            continue
        for p in pats:
            if isinstance(p, tuple):  # (qualname in the same module, pattern): a function it hands its work to
                fn = site_callable({"module": s.get("module"), "function": p[0]},
                                   engine_importer(binding))
                if fn is not None:
                    out.append((fn, p[1]))
            else:
                out.append(p)
    return tuple(out)


def fault(binding, s: dict | None, failing: list | None = None, passing: list | None = None,
          kind: str = "", trigger: str = "") -> dict | None:
    """The cited line of the engine function at site ``s`` (:func:`rlconform.harness.core.fault_lines.localize`:
    the discriminating line of the traced runs, else a declared anchor, else the function), as
    ``{"line", "evidence", "text", …}`` with ``line`` None when the function itself is cited; None when the
    site names no function of this process."""
    from rlconform.harness.core.fault_lines import localize

    fn = site_callable(s, engine_importer(binding))
    if fn is None:
        return None
    return localize(fn, failing, passing, fault_anchors(binding, s, kind, trigger))
