"""The coverage of an engine's numerics by its binding: which functions are checked.

A binding declares the engine's *numerics modules*, its *registries* and a table of justifications
(:class:`~rlconform.harness.catalog.binding.Coverage`). :func:`inventory` imports those modules at run time and
lists every public function (defined in the module, not re-imported), every public method of a public
class defined there (a class without public methods is listed itself) and every entry of every
registry; each item is then

* ``bound``: an implementation of the binding reaches it; ``bound_to`` names the op, and the variant
  for ops with variants (``outcome_advantage[grpo]``);
* ``justified``: not bound, and the binding's ``not_bound`` table gives the reason (keyed by the
  item's qualified name, :attr:`Item.name`);
* ``unbound``: neither. A function a fork adds to a numerics module is ``unbound`` until it is bound
  or justified (``rlconform coverage --strict`` exits non-zero then).

A numerics module that cannot be imported is an item of its own (kind ``module``) and an error; its
public items are then read from its source file (:func:`source_items`), so they are still listed.

Bound-ness is derived from the binding's implementations, so it cannot go stale. Each implementation
(for an op with variants, each variant's callable; for ``agg_loss`` / ``metric_pipeline``, every
callable of the contract) is *walked*: the adapter functions of the binding (any code that is neither
the engine's, the standard library's nor an installed package's) are followed through their closure
cells, the globals they name, ``functools.partial`` and ``__wrapped__``; the engine's functions are
recorded where reached and not followed. An engine item ``module.name`` is reached when its object is
(identity, also after ``inspect.unwrap``), or when the walk reaches its module (a module object, a
module name string, a module imported inside an adapter) and names ``name`` (an attribute the code
reads, or a string constant such as ``_skyrl(PPO_UTILS, "masked_mean")``); a method when its class is
reached and its name is read (a name lists, dicts, strings or tensors also have, such as ``append``,
only by identity). A registry entry is reached when its callable is, or when an adapter's
closure holds its name in an implementation of the op the registry feeds (``kl_penalty(..., name)``
bound per name; ``Coverage.registry_ops``). A function registered under a bound
entry is bound to the same op; one registered under a justified entry inherits the justification.

What is bound through another function (a helper that a bound function calls) is *not* inferred (one exception,
the autograd Functions below): the
table says so explicitly, so that the reader sees what is checked on its own.

**Whole-package discovery.** The module list is a hint, not the boundary: every numerics
function that :func:`rlconform.harness.catalog.discovery.discover` finds anywhere in the engine's packages
(``Coverage.packages``, default the top package of each module; read with ``ast``, never imported) is an
item too, with the signals that found it (:attr:`Item.signals`) and its ``file:line``. A found function in
a module the binding's code has loaded is resolved to its object and can be bound like any other; one in a
module nothing loaded cannot be reached by an op and is ``justified`` (``not_bound`` by name, else
``not_bound_under`` by the longest module prefix) or ``unbound``. The one inference the table makes: a
``forward`` / ``backward`` of a ``torch.autograd.Function`` is bound to what the bound function applying it
(``_X.apply`` in its code) is bound to, since every finding of that function runs both.

The record (:meth:`Inventory.to_json`) goes into ``report.json`` under ``coverage``; its ``discovery`` part
says which packages were read, how many numerics functions were found and how many of them lie outside the
module list.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.util
import inspect
import os
import pkgutil
import sys
import sysconfig
import traceback
import types
from typing import Any, Callable, Mapping

__all__ = ["Item", "Inventory", "STATUSES", "compared_strings", "coverage_record", "inventory", "module_items",
           "source_items"]

#: statuses, in the order the table lists them
STATUSES = ("unbound", "bound", "justified")


@dataclasses.dataclass
class Item:
    """One public function, method, class or registry entry of the engine's numerics.

    ``name``: qualified name (``verl.utils.torch_functional.masked_mean``,
    ``verl.utils.metric.utils.Metric.aggregate_dp``, ``...core_algos.POLICY_LOSS_REGISTRY['vanilla']``),
    the key of the binding's ``not_bound`` table; ``module``: the module (or registry) it belongs to;
    ``short``: the name within it; ``kind``: ``function`` | ``method`` | ``class`` | ``registry entry`` |
    ``module`` (a numerics module that could not be imported) | ``registry`` (one that could not be
    read); ``status``: one of :data:`STATUSES`;
    ``bound_to``: op labels (``op`` or ``op[variant]``); ``reason``: why not bound (justified items) or
    what failed; ``signals``: the discovery signals that found it (empty: listed only because its module is
    in the binding's list); ``site``: ``file:line`` of its ``def`` (discovered items); ``listed``: whether
    the module list (or a registry) lists it.
    """

    name: str
    module: str
    short: str
    kind: str
    status: str = "unbound"
    bound_to: list[str] = dataclasses.field(default_factory=list)
    reason: str | None = None
    obj: Any = dataclasses.field(default=None, repr=False, compare=False)
    signals: list[str] = dataclasses.field(default_factory=list)
    site: str | None = None
    listed: bool = True

    def to_json(self) -> dict:
        return {"name": self.name, "module": self.module, "short": self.short, "kind": self.kind,
                "status": self.status, "bound_to": list(self.bound_to), "reason": self.reason,
                "signals": list(self.signals), "site": self.site, "listed": self.listed}


@dataclasses.dataclass
class Inventory:
    """The coverage table of one binding: ``items`` (unbound first), ``errors`` (ops that could not be
    resolved, registries that could not be read), ``stale`` (``not_bound`` keys that name no item, or
    an item that is bound after all: the table must be corrected)."""

    engine: str
    version: str | None
    modules: list[str]
    items: list[Item]
    errors: list[str] = dataclasses.field(default_factory=list)
    stale: list[str] = dataclasses.field(default_factory=list)
    discovery: dict = dataclasses.field(default_factory=dict)
    #: op -> the part of its engine path the binding transcribes instead of calling
    transcribed: dict = dataclasses.field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        out = {s: 0 for s in STATUSES}
        for it in self.items:
            out[it.status] += 1
        return out

    def unbound(self) -> list[Item]:
        return [it for it in self.items if it.status == "unbound"]

    def to_json(self) -> dict:
        return {"engine": self.engine, "version": self.version, "modules": list(self.modules),
                "counts": self.counts(), "items": [it.to_json() for it in self.items],
                "errors": list(self.errors), "stale": list(self.stale), "discovery": dict(self.discovery),
                "transcribed": dict(self.transcribed)}


# ----------------------------------------------------------------------------------- the inventory
def _unwrap(obj: Any) -> Any:
    try:
        return inspect.unwrap(obj)
    except ValueError:  # a __wrapped__ cycle
        return obj


def module_items(mod: types.ModuleType) -> list[Item]:
    """The public functions defined in ``mod`` (not re-imported), the public methods of its public classes
    (a class without public methods is listed itself), in source order of ``vars(mod)``."""
    items = []
    for name, obj in list(vars(mod).items()):
        if name.startswith("_"):
            continue
        if isinstance(obj, type):
            if obj.__module__ != mod.__name__:
                continue
            methods = [m for m, v in vars(obj).items() if not m.startswith("_")
                       and isinstance(v, (types.FunctionType, staticmethod, classmethod))]
            for m in methods:
                items.append(Item(f"{mod.__name__}.{name}.{m}", mod.__name__, f"{name}.{m}", "method",
                                  obj=(obj, m, getattr(obj, m))))
            if not methods:
                items.append(Item(f"{mod.__name__}.{name}", mod.__name__, name, "class", obj=obj))
        elif callable(obj) and not isinstance(obj, types.ModuleType):
            target = _unwrap(obj)
            if getattr(obj, "__module__", None) != mod.__name__ and getattr(target, "__module__", None) != mod.__name__:
                continue
            if not isinstance(target, (types.FunctionType, types.BuiltinFunctionType)) and not hasattr(obj, "__wrapped__"):
                continue  # an instance that happens to be callable (a registry object, a logger): not a function
            items.append(Item(f"{mod.__name__}.{name}", mod.__name__, name, "function", obj=obj))
    return items


def source_items(name: str) -> list[Item]:
    """The items of a module that cannot be imported, read from its source file (top-level public ``def`` /
    ``class``, public methods): listed so that a function a fork adds there is still seen; nothing can be
    bound to them (no objects). ``[]`` when the source cannot be found or parsed."""
    import ast

    try:
        spec = importlib.util.find_spec(name)
        origin = spec.origin if spec is not None else None
        with open(origin, encoding="utf-8") as fh:
            tree = ast.parse(fh.read(), origin)
    except Exception:  # noqa: BLE001 - a parent package that fails to import, no source, a syntax error
        return []
    items = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
            items.append(Item(f"{name}.{node.name}", name, node.name, "function"))
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            methods = [m.name for m in node.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))
                       and not m.name.startswith("_")]
            items += [Item(f"{name}.{node.name}.{m}", name, f"{node.name}.{m}", "method") for m in methods]
            if not methods:
                items.append(Item(f"{name}.{node.name}", name, node.name, "class"))
    return items


def _module_names(name: str, importer: Callable[[str], types.ModuleType]) -> list[str]:
    """``name`` and, for a package, every submodule (recursively, without importing them: each is imported
    on its own, so one that fails does not hide the others). Raises when ``name`` itself cannot be imported."""
    mod = importer(name)
    names = [name]
    if hasattr(mod, "__path__"):
        names += sorted(i.name for i in pkgutil.walk_packages(mod.__path__, prefix=name + ".", onerror=lambda _: None))
    return names


def compared_strings(fn: Callable, param: str) -> list[str]:
    """The string constants ``fn``'s source compares its parameter ``param`` with (``param == "k1"``,
    ``param in ("kl", "k1")``), in source order: the modes of a function that dispatches on a name (a KL
    estimator without a registry). Raises ``OSError`` / ``TypeError`` when the source is unavailable."""
    import ast
    import textwrap

    tree = ast.parse(textwrap.dedent(inspect.getsource(_unwrap(fn))))
    found: list[str] = []

    def consts(node) -> list[str]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return [node.value]
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
        return []

    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare) or len(node.ops) != 1:
            continue
        left, right = node.left, node.comparators[0]
        if not isinstance(node.ops[0], (ast.Eq, ast.In)):
            continue
        for a, b in ((left, right), (right, left)):
            if isinstance(a, ast.Name) and a.id == param:
                found += [s for s in consts(b) if s not in found]
    return found


# ------------------------------------------------------------------------------------------ the walk
@dataclasses.dataclass
class _Reach:
    ids: set = dataclasses.field(default_factory=set)          # id() of every object reached
    keep: list = dataclasses.field(default_factory=list)        # keeps them alive (ids stay unique)
    names: set = dataclasses.field(default_factory=set)         # attribute / global names adapter code reads
    strings: set = dataclasses.field(default_factory=set)       # string constants and string values reached
    cell_strings: set = dataclasses.field(default_factory=set)  # strings held in adapter closure cells
    modules: set = dataclasses.field(default_factory=set)       # names of module objects reached

    def has(self, obj) -> bool:
        return id(obj) in self.ids or id(_unwrap(obj)) in self.ids


_LIBRARY_DIRS = tuple(p for p in {sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
                      if p)


def _is_adapter(fn: types.FunctionType, engine_roots: frozenset) -> bool:
    """Code the walk follows: the harness's and a user's binding code, not the engine's, the standard
    library's or an installed package's."""
    module = getattr(fn, "__module__", None) or ""
    root = module.split(".")[0]
    if root == "rlconform":
        return True
    if root in engine_roots:
        return False
    filename = os.path.abspath(fn.__code__.co_filename)
    return not any(filename.startswith(os.path.abspath(d) + os.sep) for d in _LIBRARY_DIRS)


def _code_names(code: types.CodeType, names: set, strings: set) -> None:
    names.update(code.co_names)
    for c in code.co_consts:
        if isinstance(c, str):
            strings.add(c)
        elif isinstance(c, types.CodeType):
            _code_names(c, names, strings)


#: method names that builtin containers, strings and tensors also have: a method of the engine's with such
#: a name counts as reached only by identity (the bound method object itself), never by its name
_GENERIC_METHODS = frozenset(n for t in (list, dict, set, str, bytes, object) for n in dir(t)) | frozenset(
    ("forward", "backward", "apply", "update", "item", "sum", "mean", "max", "min", "std", "var", "to", "float"))


def _walk(root: Any, engine_roots: frozenset) -> _Reach:
    from rlconform.harness.catalog.binding import Lazy
    from rlconform.harness.core.contracts import AggLoss, MetricPipeline, PolicyStep, Variants

    contract_types = (AggLoss, MetricPipeline, PolicyStep, Variants, Lazy)
    reach = _Reach()
    stack = [root]
    while stack:
        obj = stack.pop()
        if obj is None or isinstance(obj, (bool, int, float, complex, bytes)) or id(obj) in reach.ids:
            continue
        reach.ids.add(id(obj))
        reach.keep.append(obj)
        if isinstance(obj, str):
            reach.strings.add(obj)
        elif isinstance(obj, types.ModuleType):
            reach.modules.add(obj.__name__)
        elif isinstance(obj, functools.partial):
            stack += [obj.func, *obj.args, *obj.keywords.values()]
        elif isinstance(obj, types.MethodType):
            stack.append(obj.__func__)
            if isinstance(obj.__self__, (type, types.ModuleType)):
                stack.append(obj.__self__)
        elif isinstance(obj, contract_types):
            stack += [getattr(obj, f.name) for f in dataclasses.fields(obj)]
        elif isinstance(obj, Mapping):
            stack += list(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            stack += list(obj)
        elif isinstance(obj, type) and any(c.__name__ == "Function" and c.__module__ == "torch.autograd.function"
                                           for c in obj.__mro__[1:]):
            # an autograd.Function an adapter applies (verl's LinearCrossEntropy.apply): its forward and backward
            stack += [getattr(obj, "forward", None), getattr(obj, "backward", None)]
        elif isinstance(obj, types.FunctionType):
            if hasattr(obj, "__wrapped__"):
                stack.append(obj.__wrapped__)
            if not _is_adapter(obj, engine_roots):
                continue
            names: set = set()
            _code_names(obj.__code__, names, reach.strings)
            reach.names |= names
            for cell in obj.__closure__ or ():
                try:
                    value = cell.cell_contents
                except ValueError:  # an empty cell
                    continue
                if isinstance(value, str):
                    reach.cell_strings.add(value)
                stack.append(value)
            g = obj.__globals__
            stack += [g[n] for n in names if n in g]
        elif hasattr(obj, "__wrapped__"):
            stack.append(obj.__wrapped__)
    # module names adapters import inside their bodies (`import verl.utils.torch_functional as verl_F`)
    # or hold as strings (`_skyrl(PPO_UTILS, ...)`), when that module is loaded
    for text in reach.names | reach.strings:
        if text in sys.modules:
            reach.modules.add(text)
    return reach


def _targets(binding, op: str) -> list[tuple[str, Any]]:
    """(label, implementation) pairs to walk for ``op``: one per variant for an op with variants, one per
    alternative implementation (``op@impl``)."""

    alternatives = [(f"{op}@{name}", binding.resolve_implementation(op, name).fn)
                    for name in getattr(binding, "implementations", {}).get(op, {})]
    return _op_targets(binding, op) + alternatives


def _op_targets(binding, op: str) -> list[tuple[str, Any]]:
    from rlconform.harness.core.contracts import Implementation, Variants

    impl = binding.resolve(op)
    if isinstance(impl, Implementation):  # an op bound with its contract
        impl = impl.fn
    if isinstance(impl, Variants):
        pairs = [(f"{op}[{v}]", fn) for v, fn in impl.impls.items()]
        pairs += [(f"{op}[{v}+{name}]", fn) for name, fns in impl.implementations.items() for v, fn in fns.items()]
        extra = {f.name: getattr(impl, f.name) for f in dataclasses.fields(impl)
                 if f.name not in ("impls", "unchecked", "implementations")}
        if any(v is not None for v in extra.values()):
            pairs.append((op, list(v for v in extra.values() if v is not None)))
        return pairs
    return [(op, impl)]


def _reached(item: Item, label: str, reach: _Reach) -> bool:
    if item.obj is None:  # an unimportable module or registry, or an item read from a module's source
        return False
    if item.kind in ("method", "autograd.Function"):
        cls, meth, bound = item.obj
        if reach.has(bound) or reach.has(getattr(cls, meth, None)):
            return True
        if meth in _GENERIC_METHODS:  # `.append` read by an adapter is a list's as likely as the class's
            return False
        class_reached = reach.has(cls) or any(
            getattr(sys.modules.get(m), cls.__name__, None) is cls for m in reach.modules)
        return class_reached and meth in reach.names | reach.strings
    if item.kind == "registry entry":
        entry_name, value, ops, shared = item.obj
        if value is not None and not shared and reach.has(value):
            return True
        return label.split("[")[0] in ops and entry_name in reach.cell_strings
    obj = item.obj
    if reach.has(obj):
        return True
    if item.short not in reach.names and item.short not in reach.strings:
        return False
    return any(getattr(sys.modules.get(m), item.short, None) is obj for m in reach.modules)


def _registry_items(key: str, loader: Callable[[], Mapping[str, Any]], ops) -> list[Item]:
    """One item per entry; ``obj`` = (entry name, callable or None, the ops it feeds, whether another entry
    holds the same callable: then only the entry's name in an adapter's closure tells which one is bound)."""
    entries = dict(loader())
    ops = (ops,) if isinstance(ops, str) else tuple(ops or ())
    counts: dict[int, int] = {}
    for value in entries.values():
        if value is not None:
            counts[id(_unwrap(value))] = counts.get(id(_unwrap(value)), 0) + 1
    return [Item(f"{key}[{name!r}]", key, repr(name), "registry entry",
                 obj=(name, value, ops, value is not None and counts[id(_unwrap(value))] > 1))
            for name, value in entries.items()]


def inventory(binding) -> Inventory:
    """The coverage table of ``binding`` (which must declare ``coverage``), built from the engine's modules
    and registries as they are now. Never raises for the engine's sake: a module or registry that cannot
    be read and an op that cannot be resolved are recorded (``errors``; the module as an ``unbound``
    item unless justified)."""
    from rlconform.harness.catalog.binding import BindingError, OpUnavailable

    spec = binding.coverage
    if spec is None:
        raise BindingError(f"binding {binding.name!r} declares no coverage (Binding.coverage)")
    importer = spec.importer or importlib.import_module
    items: list[Item] = []
    errors: list[str] = []
    modules: list[str] = []
    seen: set[str] = set()
    for top in spec.modules:
        try:
            names = _module_names(top, importer)
        except Exception:  # noqa: BLE001 - reported below, as the module's own item
            names = [top]
        for name in names:
            if name in seen:  # a package and one of its submodules both declared
                continue
            seen.add(name)
            try:
                mod = importer(name)
            except Exception as exc:  # noqa: BLE001 - an engine module that does not import is a finding of the table
                last = "".join(traceback.format_exception_only(type(exc), exc)).strip().splitlines()[-1]
                read = source_items(name)
                items.append(Item(name, name, name, "module", reason=f"cannot import: {last}" + (
                    f"; its {len(read)} public items are listed from the source" if read else "")))
                items += read
                errors.append(f"module {name}: {last}")
                continue
            modules.append(mod.__name__)
            items += module_items(mod)
    for key, loader in spec.registries.items():
        try:
            items += _registry_items(key, loader, spec.registry_ops.get(key))
        except Exception as exc:  # noqa: BLE001
            last = "".join(traceback.format_exception_only(type(exc), exc)).strip().splitlines()[-1]
            items.append(Item(key, key, key, "registry", reason=f"cannot read the registry: {last}"))
            errors.append(f"registry {key}: {last}")
    discovery = _discovered_items(spec, items, errors)
    engine_roots = frozenset(m.split(".")[0] for m in spec.modules)
    reaches: list[tuple[str, _Reach]] = []
    transcribed: dict[str, str] = {}
    for op in binding.provided_ops():
        try:
            targets = _targets(binding, op)
        except (OpUnavailable, BindingError) as exc:
            errors.append(f"op {op} could not be resolved (what it binds is not counted): {exc}")
            continue
        if getattr(binding.resolve(op), "transcribed", None):
            transcribed[op] = binding.resolve(op).transcribed
        reaches += [(label, _walk(impl, engine_roots)) for label, impl in targets]
    for item in items:
        if item.obj is None and not item.listed:
            item.obj = _resolve(item)
        item.bound_to = [label for label, reach in reaches if _reached(item, label, reach)]
    # a function registered under an entry shares the entry's binding (and justification)
    by_id = {id(_unwrap(it.obj)): it for it in items if it.kind == "function"}
    for entry in (it for it in items if it.kind == "registry entry"):
        value = entry.obj[1]
        fn_item = by_id.get(id(_unwrap(value))) if value is not None else None
        if fn_item is None:
            continue
        if entry.bound_to:
            fn_item.bound_to += [b for b in entry.bound_to if b not in fn_item.bound_to]
        elif fn_item.bound_to:
            entry.bound_to = list(fn_item.bound_to)
    _bind_autograd_functions(items)
    stale = []
    names = {it.name for it in items}
    for key in spec.not_bound:
        if key not in names:
            stale.append(f"not_bound names {key!r}, which is no item of the engine's numerics (renamed or removed?)")
    under = getattr(spec, "not_bound_under", None) or {}
    for prefix in under:
        if not any(it.module == prefix.rstrip(".") or it.module.startswith(prefix) for it in items):
            stale.append(f"not_bound_under names {prefix!r}, under which discovery finds nothing")
    for item in items:
        if item.bound_to:
            item.status = "bound"
            if item.name in spec.not_bound:
                stale.append(f"{item.name} is bound ({', '.join(item.bound_to)}) but not_bound justifies it")
        elif item.name in spec.not_bound:
            why = spec.not_bound[item.name]
            item.status = "justified"
            item.reason = f"{why} ({item.reason})" if item.kind in ("module", "registry") else why
        elif _under(item.module, under) is not None:
            item.status, item.reason = "justified", _under(item.module, under)
        else:
            item.status = "unbound"
    for entry in (it for it in items if it.kind == "registry entry" and it.status == "justified"):
        fn_item = by_id.get(id(_unwrap(entry.obj[1]))) if entry.obj[1] is not None else None
        if fn_item is not None and fn_item.status == "unbound":
            fn_item.status, fn_item.reason = "justified", f"registered as {entry.name}: {entry.reason}"
    order = {s: i for i, s in enumerate(STATUSES)}
    items.sort(key=lambda it: (order[it.status], it.module, it.short))
    return Inventory(engine=binding.name, version=binding.version, modules=modules, items=items,
                     errors=errors, stale=stale, discovery=discovery, transcribed=transcribed)


def _under(module: str, under: Mapping[str, str]) -> str | None:
    """The ``not_bound_under`` reason of the longest prefix ``module`` lies under, or None."""
    best = None
    for prefix in under:
        if (module == prefix.rstrip(".") or module.startswith(prefix)) and (best is None or len(prefix) > len(best)):
            best = prefix
    return under[best] if best is not None else None


def _discovered_items(spec, items: list[Item], errors: list[str]) -> dict:
    """Adds to ``items`` every numerics function discovery finds in the engine's packages (merging the signals
    and site into an item the module list already has); returns the ``discovery`` record."""
    from rlconform.harness.catalog.discovery import discover

    packages = tuple(getattr(spec, "packages", ()) or ()) or tuple(dict.fromkeys(m.split(".")[0] for m in spec.modules))
    by_name = {it.name: it for it in items}
    found_n = beyond = 0
    read_errors: list[str] = []
    for package in packages:
        try:
            found, errs = discover(package, reuse=True)  # the table needs no syntax tree
        except FileNotFoundError as exc:
            errors.append(f"discovery: {exc}")
            continue
        read_errors += errs
        for f in found:
            found_n += 1
            item = by_name.get(f.name)
            if item is None:
                beyond += 1
                item = Item(f.name, f.module, f.qualname, f.kind, listed=False)
                items.append(item)
                by_name[f.name] = item
            elif f.kind == "autograd.Function":
                item.kind = f.kind
            item.signals, item.site = list(f.signals), f"{f.file}:{f.line}"
    errors += [f"discovery could not read {e}" for e in read_errors]
    return {"packages": list(packages), "found": found_n, "beyond_modules": beyond, "unreadable": len(read_errors)}


def _resolve(item: Item) -> Any:
    """The object of a discovered item whose module is loaded already (never imports): a function, or
    ``(class, method name, method)``; None when its module is not loaded or the name is not there."""
    mod = sys.modules.get(item.module)
    if mod is None:
        return None
    parts = item.short.split(".")
    obj = vars(mod).get(parts[0])
    if obj is None:
        return None
    if len(parts) == 1:
        return obj if callable(obj) and not isinstance(obj, type) else None
    if not isinstance(obj, type) or parts[1] not in vars(obj):
        return None
    return (obj, parts[1], getattr(obj, parts[1]))


def _bind_autograd_functions(items: list[Item]) -> None:
    """A ``torch.autograd.Function``'s forward / backward shares the binding of the bound functions that apply
    it (name the class in their code, as :func:`rlconform.harness.catalog.engine_site.autograd_function` reads)."""
    fns = [it for it in items if it.bound_to and it.kind in ("function", "method") and it.obj is not None]
    for item in items:
        if item.kind != "autograd.Function" or item.bound_to or not isinstance(item.obj, tuple):
            continue
        cls = item.obj[0]
        for fn_item in fns:
            target = _unwrap(fn_item.obj[2] if fn_item.kind == "method" else fn_item.obj)
            target = getattr(target, "__func__", target)
            code = getattr(target, "__code__", None)
            if code is not None and cls.__name__ in code.co_names and \
                    getattr(target, "__globals__", {}).get(cls.__name__) is cls:
                item.bound_to += [b for b in fn_item.bound_to if b not in item.bound_to]


def coverage_record(binding) -> dict | None:
    """:func:`inventory` as report data, ``None`` when the binding declares no coverage; an error while
    building it is reported in the record, never raised."""
    if getattr(binding, "coverage", None) is None:
        return None
    try:
        return inventory(binding).to_json()
    except Exception as exc:  # noqa: BLE001 - the coverage table must never break a check
        last = "".join(traceback.format_exception_only(type(exc), exc)).strip().splitlines()[-1]
        return {"engine": binding.name, "version": binding.version, "modules": [], "items": [],
                "counts": {s: 0 for s in STATUSES}, "errors": [f"the inventory failed: {last}"], "stale": []}
