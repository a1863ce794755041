"""A static audit of known fault shapes in an engine's numerics functions, read with ``ast``.

The functions audited are those whole-package discovery finds (:mod:`rlconform.harness.catalog.discovery`);
nothing is imported or run. Each rule is a code shape that the public bug log of RL trainers keeps showing;
a hit is a place to look, never a verdict (``rlconform audit`` never exits non-zero for a hit). The rules
(:data:`RULES`), each tested on a planted file in ``tests/audit_fixtures/``:

``mask-multiply-reduce``
    ``(x * mask).sum()`` / ``.mean()`` / ``torch.sum(x * mask)``, also through one name (``y = x * mask;
    y.sum()``): a NaN / inf at a masked position leaks into the sum (``0 · nan = nan``); ``torch.where`` /
    ``masked_fill`` does not (verl ``distributed_masked_mean``, SkyRL ``(x * mask).min()``: garbage at masked positions).
``in-place-write``
    ``.div_`` / ``.sub_`` / ``.exp_`` / any ``.<op>_()``, ``out=``, slice assignment ``x[...] = v`` or
    ``x += v`` on a parameter of the function (a tensor-annotated one for ``+=``; a string key ``d["k"] = v``
    is a dict's, not a slice, and so is an unannotated parameter named like a container, ``*dict*`` /
    ``*params*`` / ``*metrics*`` / ``*config*``; a parameter named ``out`` / ``output`` / ``out_*`` is the
    caller's output buffer, written by contract) or, in an autograd
    ``backward``, on a tensor unpacked from ``ctx.saved_tensors``, before the name is rebound to something that
    is not a view of it (``.float()``, ``.view()``, ``.to()``… keep the alias: fp32 ``.float()`` is the
    tensor itself, Megatron-core ``vocab_parallel_cross_entropy``; verl ``_VocabParallelEntropy.backward``).
``log-of-softmax``
    ``log(softmax(x))``, also through one name: ``-inf`` where the probability underflows, and precision lost
    near 1; ``log_softmax`` computes it stably (Megatron-core label smoothing).
``exp-unclamped-log-ratio``
    ``exp(a - b)`` (or of a name bound to a difference, or to a ``*log_ratio*`` / ``*kl*`` value) with no
    ``clamp`` / ``clip`` between: a log-ratio of +89 overflows fp32 (importance weights, k3 KL); a shift by
    a maximum (``x - x.max()``, a name with ``max`` in it) or by a ``logsumexp`` is the stable, normalised form
    (at most 0) and is not a hit.
``mean-of-means``
    a mean over a list of means: ``np.mean(L)`` / ``torch.stack(L).mean()`` / ``sum(L) / len(L)`` where ``L``
    gets ``.append(<a mean>)`` or is a comprehension of means, and ``all_reduce(m, op=ReduceOp.AVG)`` of a
    name bound to a mean: each micro-batch / rank weighs the same whatever its token count (“mean of per-shard means”).
``no-upcast-cancellation``
    ``lse - Σ p·z`` (a ``logsumexp`` minus a sum of a product) or ``E[x²] - μ²`` (a mean of squares minus a
    square) in a function with no upcast anywhere (``.float()``, ``.double()``, ``.to(torch.float32)``,
    ``dtype=torch.float32 / float64``): in bf16 the difference of two nearly equal numbers keeps no digit.
``zero-times-neg-inf``
    ``p * logits`` / ``p * log_softmax(x)`` where ``p`` is a softmax (or ``exp`` of a log-softmax) and the
    other factor is logits (a name with ``logit`` in it) or a log-softmax: ``-inf``-padded vocab gives
    ``0 · (-inf) = nan`` (verl ``entropy_from_logits``).

**Blind spots.** Data flow is followed through one assignment in the same function only (not through
arguments, attributes, containers, helpers or loops), so a shape split across functions is missed and a
guard elsewhere (``torch.where`` before the product, a ``clamp`` in the caller, an upcast in the caller) is
not seen: a hit can be a false positive, which the dynamic findings then contradict. Dtypes are unknown to
the AST: ``no-upcast-cancellation`` fires on fp32-only code too.
"""

from __future__ import annotations

import ast
import dataclasses
from typing import Iterable

from rlconform.harness.catalog.discovery import Found

__all__ = ["Hit", "RULES", "audit", "audit_function", "audit_source"]

#: rule id -> what it flags (one line)
RULES = {
    "mask-multiply-reduce": "x * mask feeding a sum / mean: NaN or inf at a masked position leaks",
    "in-place-write": "in-place write to an argument or a tensor saved for backward",
    "log-of-softmax": "log(softmax(x)) instead of log_softmax",
    "exp-unclamped-log-ratio": "exp of a log-ratio with no clamp: overflows for a large ratio",
    "mean-of-means": "a mean over per-micro-batch / per-rank means",
    "no-upcast-cancellation": "a cancelling statistic (lse - Σp·z, E[x²] - μ²) with no upcast in the function",
    "zero-times-neg-inf": "p * logits with possibly -inf logits: 0 · (-inf) = nan",
}

_ARRAY = frozenset({"torch", "np", "numpy", "F", "functional", "tl", "jnp"})
_MEAN = frozenset({"mean", "nanmean", "masked_mean", "fmean"})
_REDUCE = frozenset({"sum", "mean", "nansum", "nanmean"})
_CLAMP = frozenset({"clamp", "clip", "clamp_", "clip_", "minimum", "maximum", "min", "max", "safe_exp_delta"})
#: methods whose result may be the tensor itself (or a view of it): an in-place write after them still
#: writes into the caller's tensor
_ALIAS = frozenset({"float", "to", "view", "reshape", "contiguous", "type", "type_as", "squeeze", "unsqueeze",
                    "flatten", "view_as", "transpose", "permute", "narrow", "expand", "detach", "half",
                    "bfloat16", "double", "t", "T", "select", "as_strided", "reshape_as", "expand_as"})
_NOT_INPLACE = frozenset({"requires_grad_", "retain_grad_", "share_memory_", "record_stream_"})


@dataclasses.dataclass
class Hit:
    """One place matching a rule: ``rule`` (a key of :data:`RULES`), the function (``name`` = module +
    qualname, as in the coverage table), ``file`` (relative to the folder holding the top package) and
    ``line`` (1-based), ``code`` (that source line, stripped) and ``detail`` (what matched)."""

    rule: str
    name: str
    module: str
    qualname: str
    file: str
    line: int
    code: str
    detail: str

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def _callee(node: ast.AST) -> tuple[str | None, str | None]:
    if not isinstance(node, ast.Call):
        return None, None
    f = node.func
    if isinstance(f, ast.Name):
        return None, f.id
    if isinstance(f, ast.Attribute):
        v = f.value
        recv = v.id if isinstance(v, ast.Name) else v.attr if isinstance(v, ast.Attribute) else ""
        return recv, f.attr
    return None, None


def _is_call(node: ast.AST, names: Iterable[str]) -> bool:
    return _callee(node)[1] in set(names)


def _subject(call: ast.Call) -> ast.AST | None:
    """The operand of ``torch.f(x)`` / ``np.f(x)`` (first argument) or ``x.f()`` (the receiver)."""
    recv, _ = _callee(call)
    if recv in _ARRAY:
        return call.args[0] if call.args else None
    if isinstance(call.func, ast.Attribute):
        return call.func.value
    return call.args[0] if call.args else None


def _names_in(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _mentions(node: ast.AST, word: str) -> bool:
    return any(isinstance(n, ast.Name) and word in n.id.lower() or isinstance(n, ast.Attribute)
               and word in n.attr.lower() for n in ast.walk(node))


class _Fn:
    """One function's body with its single-name assignments, in line order."""

    def __init__(self, node: ast.AST):
        self.node = node
        self.assigned: dict[str, list[tuple[int, ast.AST]]] = {}
        for n in ast.walk(node):
            if isinstance(n, ast.Assign):
                for t in n.targets:
                    if isinstance(t, ast.Name):
                        self.assigned.setdefault(t.id, []).append((n.lineno, n.value))
            elif isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and n.value is not None:
                self.assigned.setdefault(n.target.id, []).append((n.lineno, n.value))
        for v in self.assigned.values():
            v.sort(key=lambda p: p[0])

    def value(self, node: ast.AST, line: int) -> ast.AST:
        """``node`` itself, or for a name the value it was last bound to before ``line``."""
        if isinstance(node, ast.Name):
            before = [v for ln, v in self.assigned.get(node.id, []) if ln < line]
            if before:
                return before[-1]
        return node


def _masked_product(node: ast.AST) -> bool:
    return isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult) and (
        _mentions(node.left, "mask") or _mentions(node.right, "mask"))


def _softmaxy(node: ast.AST, fn: _Fn, line: int) -> bool:
    v = fn.value(node, line)
    if _is_call(v, ("softmax",)):
        return True
    if _is_call(v, ("exp",)):  # exp(log_softmax(x))
        s = _subject(v)
        return s is not None and _is_call(fn.value(s, line), ("log_softmax",))
    return False


def _logitsy(node: ast.AST, fn: _Fn, line: int) -> bool:
    v = fn.value(node, line)
    if _is_call(v, ("log_softmax",)):
        return True
    return isinstance(node, ast.Name) and "logit" in node.id.lower() or isinstance(node, ast.Attribute) and \
        "logit" in node.attr.lower()


def _has_upcast(node: ast.AST) -> bool:
    for n in ast.walk(node):
        recv, name = _callee(n)
        if name in ("float", "double") and isinstance(n.func, ast.Attribute) and recv not in ("np", "numpy"):
            return True
        if isinstance(n, ast.Call):
            for a in list(n.args) + [k.value for k in n.keywords]:
                if isinstance(a, ast.Attribute) and a.attr in ("float32", "float64", "float", "double"):
                    return True
    return False


def _square(node: ast.AST) -> bool:
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow) and isinstance(node.right, ast.Constant) \
            and node.right.value == 2:
        return True
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult) and ast.dump(node.left) == ast.dump(node.right):
        return True
    recv, name = _callee(node)
    if name == "square" or name == "pow" and isinstance(node, ast.Call) and any(
            isinstance(a, ast.Constant) and a.value == 2 for a in node.args):
        return True
    return False


def _mean_call(node: ast.AST) -> bool:
    recv, name = _callee(node)
    return name in _MEAN or bool(name) and name.endswith("_mean")


def _params(fn: ast.AST) -> dict[str, ast.AST | None]:
    a = fn.args
    out = {p.arg: p.annotation for p in a.posonlyargs + a.args + a.kwonlyargs}
    for skip in ("self", "cls", "ctx"):
        out.pop(skip, None)
    return out


def _saved(fn: ast.AST) -> set[str]:
    """Names unpacked from ``ctx.saved_tensors`` (or ``ctx.saved_variables``)."""
    out = set()
    for n in ast.walk(fn):
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Attribute) and n.value.attr in (
                "saved_tensors", "saved_variables"):
            for t in n.targets:
                out |= {e.id for e in ast.walk(t) if isinstance(e, ast.Name)}
    return out


def _rebound_before(fn: _Fn, name: str, line: int) -> bool:
    """``name`` was bound before ``line`` to something that is not an alias of what it held."""
    for ln, v in fn.assigned.get(name, []):
        if ln >= line:
            break
        node = v
        while isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _ALIAS:
            node = node.func.value
        if not (isinstance(node, ast.Name) and node.id == name):
            return True
    return False


def _output_buffer(name: str) -> bool:
    """A parameter the caller passes to be written (``out``, ``output``, ``out_buf``): writing it is the contract."""
    low = name.lower()
    return low in ("out", "output", "outputs", "result", "buffer") or low.startswith("out_") or low.endswith("_out")


def _container_name(name: str) -> bool:
    low = name.lower()
    return any(w in low for w in ("dict", "params", "metrics", "config", "kwargs", "state", "cache", "info"))


def _tensor_annotated(ann: ast.AST | None) -> bool:
    return ann is not None and "Tensor" in ast.unparse(ann)


def audit_function(found: Found, lines: list[str]) -> list[Hit]:
    """The hits of every rule in one found function (``found.node``); ``lines``: its file's source lines."""
    node = found.node
    fn = _Fn(node)
    hits: list[Hit] = []
    seen: set[tuple[str, int]] = set()

    def hit(rule: str, at: ast.AST, detail: str) -> None:
        line = getattr(at, "lineno", found.line)
        if (rule, line) in seen:
            return
        seen.add((rule, line))
        code = lines[line - 1].strip() if 0 < line <= len(lines) else ""
        hits.append(Hit(rule, found.name, found.module, found.qualname, found.file, line, code, detail))

    params = {k: v for k, v in _params(node).items() if not _output_buffer(k)}
    tracked = set(params) | (_saved(node) if found.qualname.endswith(".backward") else set())
    tracked -= {k for k in tracked if k in params and not _tensor_annotated(params[k]) and _container_name(k)}
    upcast = _has_upcast(node)
    appended_means: set[str] = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "append" and \
                isinstance(n.func.value, ast.Name) and n.args and _mean_call(n.args[0]):
            appended_means.add(n.func.value.id)

    def list_of_means(x: ast.AST, line: int) -> bool:
        if isinstance(x, ast.Name) and x.id in appended_means:
            return True
        x = fn.value(x, line)
        if _is_call(x, ("stack", "tensor", "array", "cat", "asarray")) and x.args:
            x = x.args[0]
            if isinstance(x, ast.Name) and x.id in appended_means:
                return True
            x = fn.value(x, line)
        return isinstance(x, (ast.ListComp, ast.GeneratorExp)) and _mean_call(x.elt)

    for n in ast.walk(node):
        line = getattr(n, "lineno", found.line)
        if isinstance(n, ast.Call):
            recv, name = _callee(n)
            # --- mask-multiply-reduce
            if name in _REDUCE:
                s = _subject(n)
                if s is not None and (_masked_product(s) or _masked_product(fn.value(s, line))):
                    hit("mask-multiply-reduce", n, f"{ast.unparse(s)[:80]} feeds .{name}()")
            # --- in-place-write: x.op_()
            if isinstance(n.func, ast.Attribute) and name.endswith("_") and not name.endswith("__") and \
                    name not in _NOT_INPLACE and isinstance(n.func.value, ast.Name):
                target = n.func.value.id
                if target in tracked and not _rebound_before(fn, target, line):
                    hit("in-place-write", n, f"{target}.{name}() writes into "
                        f"{'a saved tensor' if target not in params else 'the argument ' + repr(target)}")
            for k in n.keywords:
                if k.arg == "out" and isinstance(k.value, ast.Name) and k.value.id in tracked:
                    hit("in-place-write", n, f"out={k.value.id} writes into the argument")
            # --- log-of-softmax
            if name in ("log", "log2", "log10") and (recv in _ARRAY or isinstance(n.func, ast.Attribute)
                                                      and recv not in ("math",)):
                s = _subject(n)
                if s is not None and _is_call(fn.value(s, line), ("softmax",)):
                    hit("log-of-softmax", n, f"log of softmax ({ast.unparse(s)[:60]})")
            # --- exp-unclamped-log-ratio
            if name == "exp" and (recv in _ARRAY or isinstance(n.func, ast.Attribute) and recv not in ("math",)):
                s = _subject(n)
                if s is not None:
                    v = fn.value(s, line)
                    named = isinstance(s, ast.Name) and any(w in s.id.lower() for w in ("log_ratio", "logratio",
                                                                                         "kl", "log_diff"))
                    diff = isinstance(v, ast.BinOp) and isinstance(v.op, ast.Sub) and not _mentions(v.right, "max") \
                        and not _mentions(fn.value(v.right, line), "max") \
                        and not any(_is_call(x, ("logsumexp",)) for x in ast.walk(v.right)) and \
                        not _mentions(v.right, "lse")
                    clamped = _is_call(v, _CLAMP)
                    if (diff or named) and not clamped:
                        hit("exp-unclamped-log-ratio", n, f"exp({ast.unparse(s)[:60]}) with no clamp")
            # --- mean-of-means
            if name in _MEAN:
                s = _subject(n)
                if s is not None and list_of_means(s, line):
                    hit("mean-of-means", n, f"mean over a list of means ({ast.unparse(s)[:60]})")
            if name == "all_reduce" and n.args and any(
                    k.arg == "op" and ast.unparse(k.value).endswith("AVG") for k in n.keywords) and \
                    _mean_call(fn.value(n.args[0], line)):
                hit("mean-of-means", n, f"AVG all_reduce of a mean ({ast.unparse(n.args[0])})")
        elif isinstance(n, ast.BinOp):
            # --- mean-of-means: sum(L) / len(L)
            if isinstance(n.op, ast.Div) and _is_call(n.left, ("sum",)) and _is_call(n.right, ("len",)) and \
                    n.left.args and list_of_means(n.left.args[0], line):
                hit("mean-of-means", n, "sum(list of means) / len")
            # --- no-upcast-cancellation
            if isinstance(n.op, ast.Sub) and not upcast:
                lse = any(_is_call(x, ("logsumexp",)) for x in ast.walk(n.left)) or _mentions(n.left, "lse") or \
                    _mentions(n.left, "logsumexp")
                sum_prod = any(_is_call(x, ("sum",)) and (_subject(x) is not None and isinstance(_subject(x), ast.BinOp)
                                                          and isinstance(_subject(x).op, ast.Mult))
                               for x in ast.walk(n.right))
                moment = _square(fn.value(n.right, line)) and any(
                    _mean_call(x) and _subject(x) is not None and _square(_subject(x)) for x in ast.walk(n.left))
                if lse and sum_prod:
                    hit("no-upcast-cancellation", n, "lse - Σ p·z with no upcast in the function")
                elif moment:
                    hit("no-upcast-cancellation", n, "E[x²] - μ² with no upcast in the function")
            # --- zero-times-neg-inf
            if isinstance(n.op, ast.Mult):
                for p, z in ((n.left, n.right), (n.right, n.left)):
                    if _softmaxy(p, fn, line) and _logitsy(z, fn, line):
                        hit("zero-times-neg-inf", n, f"{ast.unparse(n)[:70]}: 0 · (-inf) where a logit is -inf")
                        break
        elif isinstance(n, ast.Assign):
            for t in n.targets:
                key = t.slice if isinstance(t, ast.Subscript) else None
                if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name) and t.value.id in tracked and \
                        not (isinstance(key, ast.Constant) and isinstance(key.value, str)) and \
                        not _rebound_before(fn, t.value.id, line):
                    hit("in-place-write", n, f"slice assignment into {t.value.id}")
        elif isinstance(n, ast.AugAssign) and isinstance(n.target, ast.Name):
            t = n.target.id
            if (t in params and _tensor_annotated(params[t]) or t in tracked and t not in params) and \
                    not _rebound_before(fn, t, line):
                hit("in-place-write", n, f"{t} {_op_text(n.op)}= writes into the tensor in place")
    hits.sort(key=lambda h: (h.line, h.rule))
    return hits


def _op_text(op: ast.operator) -> str:
    return {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}.get(type(op), "?")


def audit(found: Iterable[Found]) -> list[Hit]:
    """The hits in every found function (each file read once), in file and line order."""
    out: list[Hit] = []
    cache: dict[str, list[str]] = {}
    for f in found:
        if f.node is None or f.path is None:
            continue
        if f.path not in cache:
            try:
                with open(f.path, encoding="utf-8") as fh:
                    cache[f.path] = fh.read().splitlines()
            except OSError:
                cache[f.path] = []
        out += audit_function(f, cache[f.path])
    out.sort(key=lambda h: (h.file, h.line, h.rule))
    return out


def audit_source(source: str, module: str = "planted", file: str = "planted.py") -> list[Hit]:
    """The hits in every top-level function and method of ``source`` (a planted file, the reference engine),
    numerics or not: the rules alone, without discovery's selection."""
    tree = ast.parse(source)
    lines = source.splitlines()
    found = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found.append(Found(module, node.name, "function", file, node.lineno, (), node))
        elif isinstance(node, ast.ClassDef):
            found += [Found(module, f"{node.name}.{m.name}", "method", file, m.lineno, (), m) for m in node.body
                      if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))]
    return [h for f in found for h in audit_function(f, lines)]
