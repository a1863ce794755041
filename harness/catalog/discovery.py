"""Whole-package discovery of an engine's numerics functions, by reading its source with ``ast``.

The engine package is never imported: :func:`package_dir` finds its folder on ``sys.path`` (an
``--engine-path`` checkout comes first there) and :func:`discover` parses every ``.py`` under it. A
*candidate* is a public module-level function, a public method of a public module-level class, every
method of a ``torch.autograd.Function`` subclass (public or not: ``_VocabParallelEntropy.backward`` is
where a backward writes into its input), and every function registered by a decorator (``@register_adv_est``,
``@register_policy_loss``, ``@AdvantageEstimatorRegistry.register(...)``: a decorator call whose name starts with
``register``). Public means no leading ``_`` on the function, its class or any module of its dotted name;
nested functions and lambdas are not candidates.

**The rule.** A candidate is a numerics function when its body (nested functions included) shows at least
one of these AST signals (:data:`SIGNALS` names them, as recorded in :attr:`Found.signals`):

* ``softmax``: a call of ``softmax`` / ``log_softmax`` / ``logsumexp`` (as ``torch.``, ``F.`` or a method);
* ``exp/log``: a call of ``exp`` / ``log`` / ``log1p`` / ``expm1`` / ``sigmoid`` / ``logsigmoid`` through
  ``torch``, ``F``, ``tl`` (Triton) or as a tensor method (``x.exp()``), or of a helper with ``exp`` as a word of
  its name (``safe_exp_delta``); ``math.`` / ``np.`` calls on scalars are not, nor ``.log(...)`` of a receiver
  named like a logger (``self``, ``logger``, ``tracker``, ``wandb``, ``writer``, ...);
* ``collective``: ``all_reduce`` / ``reduce_scatter`` / ``reduce_scatter_tensor``, or an ``all_gather`` /
  ``all_gather_into_tensor`` / ``all_gather_object`` in a function that also reduces (``sum`` / ``mean`` /
  ``max`` / ``min`` / ``std`` / ``var``): a gather alone is data movement;
* ``masked reduction``: ``.sum()`` / ``.mean()`` / ``torch.sum`` / ``torch.mean`` of a product with an operand
  named ``*mask*``, or a call of a ``masked_*`` helper (``masked_mean``, ``masked_sum``, ``masked_whiten``) or
  ``agg_loss``;
* ``entropy/log-prob``: a call whose name contains ``entropy``, ``logprob`` or ``log_prob``, or
  ``cross_entropy`` / ``kl_div`` / ``nll_loss``;
* ``registered``: registered by decorator (an estimator / loss registry entry is numerics by construction);
* ``autograd.Function``: a ``forward`` / ``backward`` of a ``torch.autograd.Function`` subclass with a signal
  above, and the ``backward`` of one whose ``forward`` has one (a hand-written gradient of numerics, where
  ``sub_`` / ``add_`` on a saved tensor hide without any of the calls above).

**Blind spots** (also in ``docs/coverage.md``): numerics without those calls (a plain ``x.mean()``, ``std`` /
``var`` / ``sqrt``, a clip, integer counting, ``np.mean`` over per-micro-batch floats) is not found; calls through
an alias the rule does not know (``from torch import exp as e``, ``getattr(torch, name)``), code generated at
run time, C++ / CUDA extensions and Triton kernels whose arithmetic is only ``tl.*`` calls other than the above;
a private helper (``_compute``) is not a candidate itself, but a candidate that calls a private module-level
helper of its own module by name inherits that helper's signals (one level deep: a helper of a helper, or one
imported from another module, passes its signals on to nobody); methods of classes nested in functions; and a signal in a
function that only *builds* a call (``functools.partial(torch.log_softmax, ...)``) still counts (a false positive,
justified in the binding like any other).
"""

from __future__ import annotations

import ast
import dataclasses
import os
import stat
import sys
from typing import Iterable, Iterator

__all__ = ["Found", "SIGNALS", "discover", "iter_sources", "package_dir", "signals_of"]

#: the signal names, in the order :attr:`Found.signals` lists them
SIGNALS = ("softmax", "exp/log", "collective", "masked reduction", "entropy/log-prob", "registered",
           "autograd.Function")

_SOFTMAX = frozenset({"softmax", "log_softmax", "logsumexp"})
_EXPLOG = frozenset({"exp", "log", "log1p", "expm1", "sigmoid", "logsigmoid", "exp2", "log2"})
_COLLECTIVE = frozenset({"all_reduce", "reduce_scatter", "reduce_scatter_tensor"})
_GATHER = frozenset({"all_gather", "all_gather_into_tensor", "all_gather_object"})
_REDUCE = frozenset({"sum", "mean", "max", "min", "std", "var", "nansum", "nanmean"})
#: receivers whose ``.log(...)`` is a logger's, not a tensor's
_LOGGERS = ("self", "log", "track", "writer", "wandb", "mlflow", "swanlab", "console", "experiment", "run", "tb")
_LOSSES = frozenset({"cross_entropy", "kl_div", "nll_loss"})
_SCALAR_MODULES = frozenset({"math", "np", "numpy", "cmath", "random", "os", "time"})
_TENSOR_MODULES = frozenset({"torch", "F", "functional", "tl", "nn"})


@dataclasses.dataclass
class Found:
    """One numerics function found in the source.

    ``module``: dotted module name (``verl.trainer.ppo.core_algos``); ``qualname``: ``fn`` or ``Class.method``;
    ``kind``: ``function`` (a registered one carries the signal ``registered``) | ``method`` |
    ``autograd.Function`` (its forward / backward); ``file``: path relative to the folder holding the top package
    (``verl/trainer/ppo/core_algos.py``); ``line``: the ``def`` line (1-based); ``signals``: the rule's signals
    that fired (:data:`SIGNALS`); ``node``: the parsed ``FunctionDef`` (for the audit; not serialised).
    """

    module: str
    qualname: str
    kind: str
    file: str
    line: int
    signals: tuple[str, ...]
    node: ast.AST | None = dataclasses.field(default=None, repr=False, compare=False)
    path: str | None = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def name(self) -> str:
        """The qualified name, the key of a binding's ``not_bound`` table."""
        return f"{self.module}.{self.qualname}"

    def to_json(self) -> dict:
        return {"name": self.name, "module": self.module, "qualname": self.qualname, "kind": self.kind,
                "file": self.file, "line": self.line, "signals": list(self.signals)}


def package_dir(name: str, search: Iterable[str] | None = None) -> str | None:
    """The folder of package ``name`` (dotted: ``megatron.core``) on ``sys.path`` (or ``search``), found
    without importing anything; ``None`` when no entry holds it."""
    parts = name.split(".")
    for entry in list(search if search is not None else sys.path):
        d = os.path.join(entry or os.getcwd(), *parts)
        if os.path.isdir(d):
            return os.path.abspath(d)
    return None


def iter_sources(name: str, root: str) -> Iterator[tuple[str, str]]:
    """``(module name, path)`` of every ``.py`` under ``root`` (package ``name``), sorted, skipping
    ``__pycache__`` and test folders (``tests`` / ``test``)."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in ("__pycache__", "tests", "test") and not d.startswith("."))
        rel = os.path.relpath(dirpath, root)
        prefix = name if rel == "." else name + "." + rel.replace(os.sep, ".")
        for fn in sorted(filenames):
            if not fn.endswith(".py"):
                continue
            mod = prefix if fn == "__init__.py" else f"{prefix}.{fn[:-3]}"
            yield mod, os.path.join(dirpath, fn)


def _callee(node: ast.Call) -> tuple[str | None, str | None]:
    """(receiver name or None, called name) of a call: ``torch.exp(x)`` -> ("torch", "exp"), ``x.exp()`` ->
    ("x", "exp") (receiver "" when not a plain name), ``f(x)`` -> (None, "f")."""
    f = node.func
    if isinstance(f, ast.Name):
        return None, f.id
    if isinstance(f, ast.Attribute):
        v = f.value
        if isinstance(v, ast.Name):
            return v.id, f.attr
        if isinstance(v, ast.Attribute):
            return v.attr, f.attr
        return "", f.attr
    return None, None


def _mentions_mask(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Name) and "mask" in n.id.lower() or isinstance(n, ast.Attribute)
               and "mask" in n.attr.lower() for n in ast.walk(node))


def _masked_product(node: ast.AST) -> bool:
    """``node`` is (or wraps in parentheses) a product with a mask-named operand."""
    return isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult) and (
        _mentions_mask(node.left) or _mentions_mask(node.right))


def _signals(fn: ast.AST) -> list[str]:
    return signals_of(fn)


def is_masked_reduction(call: ast.Call) -> bool:
    """``(x * mask).sum()`` / ``.mean()`` / ``torch.sum(x * mask, ...)``."""
    recv, name = _callee(call)
    if name not in ("sum", "mean", "nansum", "nanmean"):
        return False
    if recv in ("torch", "np", "numpy") and call.args:
        return _masked_product(call.args[0])
    return isinstance(call.func, ast.Attribute) and _masked_product(call.func.value)


def signals_of(fn: ast.AST) -> list[str]:
    """The rule's signals in ``fn``'s body (its decorators and nested functions included)."""
    out: set[str] = set()
    gathers = reduces = False
    for node in ast.walk(fn):
        if not isinstance(node, ast.Call):
            continue
        recv, name = _callee(node)
        if name is None:
            continue
        low = name.lower()
        if name in _SOFTMAX and recv not in _SCALAR_MODULES:
            out.add("softmax")
        elif name in _EXPLOG and recv is not None and recv not in _SCALAR_MODULES and (
                recv in _TENSOR_MODULES or recv == "" or not recv[:1].isupper()) and not (
                name == "log" and recv not in _TENSOR_MODULES and any(k in recv.lower() for k in _LOGGERS)):
            out.add("exp/log")
        elif "exp" in low.split("_") and name not in _EXPLOG:  # a helper named for exp: safe_exp_delta
            out.add("exp/log")
        elif name in _COLLECTIVE:
            out.add("collective")
        gathers |= name in _GATHER
        reduces |= name in _REDUCE
        if is_masked_reduction(node) or low.startswith("masked_") and low != "masked_fill" and \
                not low.startswith("masked_fill") and low not in ("masked_select", "masked_scatter") or name == "agg_loss":
            out.add("masked reduction")
        if "entropy" in low or "logprob" in low or "log_prob" in low or name in _LOSSES:
            out.add("entropy/log-prob")
    if gathers and reduces:
        out.add("collective")
    return [s for s in SIGNALS if s in out]


def _decorator_registers(fn: ast.AST) -> bool:
    for d in getattr(fn, "decorator_list", []):
        target = d.func if isinstance(d, ast.Call) else d
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        if name.lower().startswith("register"):
            return True
    return False


def _is_autograd_function(cls: ast.ClassDef) -> bool:
    for b in cls.bases:
        text = ast.unparse(b)
        if text.endswith("autograd.Function") or text == "Function":
            return True
    return False


def _public(name: str) -> bool:
    return not name.startswith("_")


def _file_found(module: str, path: str, top_dir: str, tree: ast.Module) -> list[Found]:
    rel = os.path.relpath(path, top_dir)
    out: list[Found] = []
    defs = (ast.FunctionDef, ast.AsyncFunctionDef)
    helpers = {n.name: _signals(n) for n in tree.body if isinstance(n, defs) and not _public(n.name)}

    def signals_of(fn: ast.AST) -> list[str]:  # noqa: F811 - the rule, plus the signals of private helpers it calls
        sig = set(_signals(fn))
        for node in ast.walk(fn):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in helpers:
                sig.update(helpers[node.func.id])
        return [s for s in SIGNALS if s in sig]
    for node in tree.body:
        if isinstance(node, defs):
            registered = _decorator_registers(node)
            if not _public(node.name) and not registered:
                continue
            sig = signals_of(node) + (["registered"] if registered else [])
            if sig:
                out.append(Found(module, node.name, "function", rel,
                                 node.lineno, tuple(s for s in SIGNALS if s in sig), node, path))
        elif isinstance(node, ast.ClassDef):
            autograd = _is_autograd_function(node)
            if not autograd and not _public(node.name):
                continue
            fwd = [m for m in node.body if isinstance(m, defs) and m.name == "forward"]
            forward_numerics = bool(fwd and signals_of(fwd[0]))
            for m in node.body:
                if not isinstance(m, defs):
                    continue
                sig = signals_of(m)
                if autograd:
                    if m.name not in ("forward", "backward") or not sig and not (m.name == "backward" and forward_numerics):
                        continue
                    sig = sig + ["autograd.Function"]
                    kind = "autograd.Function"
                elif not _public(m.name) or not sig:
                    continue
                else:
                    kind = "method"
                out.append(Found(module, f"{node.name}.{m.name}", kind, rel, m.lineno,
                                 tuple(s for s in SIGNALS if s in sig), m, path))
    return out


#: how many cached files' readings a package's cache keeps beyond those of the latest run (older forks' files)
KEEP_BEYOND_RUN = 2000


def _rule_digest() -> str:
    """A digest of this module's source: the rule a cached reading was made with."""
    import hashlib

    with open(__file__, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


class _Readings:
    """Discovery's readings of source files, kept by the sha256 of each file's bytes (``user_cache`` folder
    ``discovery``, one JSON file per top-level package): a fork that changes one file of a package is read
    afresh in that file only. Each reading is ``[qualname, kind, line, signals]`` per found function (a
    function of the file's text alone); the store is rewritten with the readings this run used first, and up to
    :data:`KEEP_BEYOND_RUN` others, when a file was read afresh. Any error reading or writing it is ignored."""

    def __init__(self, package: str):
        import json

        from rlconform.harness.core.user_cache import cache_folder

        folder = cache_folder("discovery")
        self.path = os.path.join(folder, f"{package.split('.')[0]}.json") if folder else None
        self.rule, self.stored, self.used, self.added = _rule_digest(), {}, {}, False
        if self.path:
            try:
                with open(self.path, encoding="utf-8") as fh:
                    doc = json.load(fh)
                if doc.get("rule") == self.rule and isinstance(doc.get("files"), dict):
                    self.stored = doc["files"]
            except (OSError, ValueError, AttributeError):
                pass

    def get(self, digest: str):
        entry = self.stored.get(digest)
        if entry is not None:
            self.used[digest] = entry
        return entry

    def put(self, digest: str, found: list) -> None:
        self.used[digest] = [[f.qualname, f.kind, f.line, list(f.signals)] for f in found]
        self.added = True

    def save(self) -> None:
        if not (self.path and self.added):
            return
        import json
        import tempfile

        files = dict(self.used)
        for digest, entry in self.stored.items():
            if len(files) >= len(self.used) + KEEP_BEYOND_RUN:
                break
            files.setdefault(digest, entry)
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(self.path), suffix=".tmp")
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump({"rule": self.rule, "files": files}, fh)
            os.replace(tmp, self.path)
        except OSError:
            pass


def discover(package: str, root: str | None = None, *, reuse: bool = False) -> tuple[list[Found], list[str]]:
    """Every numerics function of ``package`` (dotted name; ``root``: its folder, default found on
    ``sys.path`` by :func:`package_dir`), in file and line order, and the files that could not be read
    or parsed (``"path: error"``). ``reuse``: a file whose bytes were read before (by any checkout: a fork
    shares all but its changed files with the engine it forks) is not parsed again (:class:`_Readings`); its
    :attr:`Found.node` is then None. Raises ``FileNotFoundError`` when the package is not found."""
    import hashlib

    root = root or package_dir(package)
    if root is None:
        raise FileNotFoundError(f"package {package!r} is not on sys.path")
    top_dir = root
    for _ in package.split("."):
        top_dir = os.path.dirname(top_dir)
    found: list[Found] = []
    errors: list[str] = []
    readings = _Readings(package) if reuse else None
    for module, path in iter_sources(package, root):
        if any(not _public(p) for p in module.split(".")[package.count(".") + 1:]):
            continue  # a private module (`_utils`): its functions are helpers of the public ones
        try:
            if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO or device named *.py: opening it would block
                raise OSError(f"not a regular file: {path}")
            with open(path, "rb") as fh:
                data = fh.read()
            digest = hashlib.sha256(data).hexdigest() if readings else ""
            entry = readings.get(digest) if readings else None
            if entry is not None:
                rel = os.path.relpath(path, top_dir)
                found += [Found(module, q, kind, rel, line, tuple(sig), None, path) for q, kind, line, sig in entry]
                continue
            tree = ast.parse(data.decode("utf-8"), path)
        except (OSError, SyntaxError, ValueError, UnicodeDecodeError, RecursionError, MemoryError) as exc:
            errors.append(f"{os.path.relpath(path, top_dir)}: {type(exc).__name__}: {exc}")
            continue
        in_file = _file_found(module, path, top_dir, tree)
        if readings:
            readings.put(digest, in_file)
        found += in_file
    if readings:
        readings.save()
    return found, errors
