"""Run an engine function whose module cannot be imported on this machine, from the engine's own source.

Some engine code a binding must drive lives in modules whose import pulls in a stack the CPU venv does
not have (SkyRL's ``skyrl/train/trainer.py`` and ``skyrl/train/utils/trainer_utils.py`` import
``torchdata``, ``aiohttp`` and the Ray generator stack at load time). :func:`engine_function` compiles
just the named top-level function or class (or one method of a class) from that module's file, as the
engine installed on the path has it (a fork's edit included), with the file's own name and line numbers,
so a traceback points into the engine's source. Its globals are resolved from the module's own top-level
``import`` / ``from … import`` statements, one name at a time and only for the names the code uses: a
name whose module imports is taken from it; one whose module does not import is compiled from that
module's source in turn; a top-level function or class of the module itself likewise. A name that can be
resolved neither way is left out, so using it raises ``NameError`` where the engine uses it.

Only definitions are compiled: module-level statements (assignments, decorators' side effects) do not run.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import pathlib
import types
from typing import Any, Callable

_CACHE: dict[tuple[str, str], Any] = {}


def module_file(module: str) -> pathlib.Path:
    """The source file of ``module`` (``a.b.c`` -> ``<a's directory>/b/c.py`` or ``…/c/__init__.py``),
    found without importing anything below the top-level package. Raises ``ModuleNotFoundError``."""
    top, _, rest = module.partition(".")
    spec = importlib.util.find_spec(top)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"No module named {top!r}")
    base = pathlib.Path(list(spec.submodule_search_locations)[0]).joinpath(*rest.split(".")) if rest else \
        pathlib.Path(list(spec.submodule_search_locations)[0])
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    raise ModuleNotFoundError(f"No module named {module!r} (no {base}.py)")


def _code_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _code_names(const)
    return names


def _imports(tree: ast.Module, module: str) -> dict[str, tuple[str, str | None]]:
    """Top-level bound name -> (module, attribute or None for ``import x``)."""
    out: dict[str, tuple[str, str | None]] = {}
    for node in tree.body:
        if isinstance(node, ast.Import):
            for alias in node.names:
                out[alias.asname or alias.name.partition(".")[0]] = (alias.name if alias.asname else
                                                                      alias.name.partition(".")[0], None)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.split(".")[: -node.level]
                base = ".".join(parts + ([base] if base else []))
            for alias in node.names:
                out[alias.asname or alias.name] = (base, alias.name)
    return out


def _definitions(tree: ast.Module) -> dict[str, ast.AST]:
    return {node.name: node for node in tree.body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}


def engine_function(module: str, qualname: str, importer: Callable[[str], types.ModuleType] | None = None) -> Any:
    """The function, class or method ``qualname`` (``f``, ``C`` or ``C.m``) of ``module``, compiled from the
    module's source file (see the module doc). ``importer(name)`` imports a module (default
    :func:`importlib.import_module`; SkyRL's bindings pass :func:`._compat.import_skyrl`).

    Raises ``ModuleNotFoundError`` (no source file), ``AttributeError`` (no such definition in it) or
    ``SyntaxError``. A method comes back as the plain function (call it with a stand-in ``self``)."""
    key = (module, qualname)
    if key in _CACHE:
        return _CACHE[key]
    importer = importer or importlib.import_module
    path = module_file(module)
    _, defs, imports = _parsed(module, path)
    head, _, method = qualname.partition(".")
    if head not in defs:
        raise AttributeError(f"module {module!r} ({path}) defines no {head!r}")
    node = defs[head]
    if method:
        inner = {n.name: n for n in getattr(node, "body", []) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        if method not in inner:
            raise AttributeError(f"{module}.{head} ({path}) defines no method {method!r}")
        node = inner[method]
    node = _strip_decorators(node)
    code = compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec")
    namespace: dict[str, Any] = {"__name__": module, "__file__": str(path)}
    for name in sorted(_code_names(code)):
        value = _resolve(name, module, imports, defs, importer)
        if value is not _MISSING:
            namespace[name] = value
    exec(code, namespace)
    obj = namespace[node.name]
    if method and hasattr(obj, "__qualname__"):
        obj.__qualname__ = qualname  # as Python names it in its class (sites, --changed-since)
    _CACHE[key] = obj
    return obj


_MISSING = object()
_PARSED: dict[tuple[str, str, int], tuple[ast.Module, dict, dict]] = {}


def _parsed(module: str, path: pathlib.Path) -> tuple[ast.Module, dict, dict]:
    """(tree, top-level definitions, top-level imports) of ``module``'s file, parsed once per file version
    (a module's functions resolve each other's names: without this, compiling one method of a 1600-line
    module parsed it again for every name it reaches)."""
    key = (module, str(path), path.stat().st_mtime_ns)
    if key not in _PARSED:
        tree = ast.parse(path.read_text(), filename=str(path))
        _PARSED[key] = (tree, _definitions(tree), _imports(tree, module))
    return _PARSED[key]


def _strip_decorators(node):
    """Decorators other than ``staticmethod`` / ``classmethod`` are dropped (Ray's ``@ray.remote`` etc.)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        node.decorator_list = [d for d in node.decorator_list
                               if isinstance(d, ast.Name) and d.id in ("staticmethod", "classmethod", "dataclass")]
    return node


def _resolve(name, module, imports, defs, importer):
    if name in defs:
        try:
            return engine_function(module, name, importer)
        except Exception:  # noqa: BLE001 - left out: using it raises NameError in the engine's code
            return _MISSING
    if name not in imports:
        return _MISSING
    source, attr = imports[name]
    try:
        mod = importer(source)
        return mod if attr is None else getattr(mod, attr)
    except Exception:  # noqa: BLE001 - an engine module that does not import here: its source
        if attr is None:
            return _MISSING
        try:
            return engine_function(source, attr, importer)
        except Exception:  # noqa: BLE001
            return _MISSING
