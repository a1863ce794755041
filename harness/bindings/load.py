"""Engine selection: ``--engine reference|verl|skyrl|megatron|mutants.<family>|module:attr|path.py``.

``load_engine`` returns a :class:`~rlconform.harness.catalog.binding.Binding`. Built-in names map to modules
of :mod:`rlconform.harness.bindings` and :mod:`rlconform.harness.mutants`; ``module:attr`` imports a
binding object (or a zero-argument factory returning one); a path to a ``.py`` file is executed as a
module and must define ``binding``. ``engine_path`` (a fork's checkout) is put first on ``sys.path``
and the report records it with its git revision.

Errors (all :class:`BindingError`, exit code 2 in the CLI): unknown engine (the message names the built-in
engines and the closest name), engine not installed (the message gives the install command), binding file with a
syntax error (file and line), engine path missing or not holding the package.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import os
import pkgutil
import subprocess
import sys
import traceback

from rlconform.harness.catalog.binding import Binding, BindingError

#: built-in engines: name -> (binding target, top-level package that must be importable, install hint)
BUILTIN = {
    "reference": ("rlconform.harness.bindings.reference:binding", None, None),
    "verl": ("rlconform.harness.bindings.verl:binding", "verl", "bash install/engines.sh .venv/bin/python verl"),
    "skyrl": ("rlconform.harness.bindings.skyrl:binding", "skyrl", "bash install/engines.sh .venv/bin/python skyrl"),
    "megatron": ("rlconform.harness.bindings.megatron:binding", "megatron.core",
                 "bash install/engines.sh .venv/bin/python megatron"),
}


def mutant_names() -> list[str]:
    import rlconform.harness.mutants as M

    return sorted(m.name for m in pkgutil.iter_modules(M.__path__) if not m.name.startswith("_"))


def is_own_code(spec: str | None, engine_path: str | None = None) -> bool:
    """Whether ``spec`` is rlconform's own code: the reference engine or a mutant (``mutants.*``), every op the
    harness's own, no engine package, nothing patched at import, and no ``engine_path`` checkout in front."""
    return engine_path is None and spec is not None and (
        (spec in BUILTIN and BUILTIN[spec][1] is None) or spec.startswith("mutants."))


def available_engines() -> list[str]:
    return list(BUILTIN) + [f"mutants.{n}" for n in mutant_names()] + ["<module>:<attr>", "<file>.py"]


def _git_revision(path: str) -> str | None:
    try:
        from rlconform.harness.core.safe_git import git

        out = git(path, "rev-parse", "HEAD", timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def _as_binding(obj, where: str) -> Binding:
    if isinstance(obj, Binding):
        return obj
    if callable(obj):
        try:
            obj = obj()
        except Exception as exc:  # noqa: BLE001
            raise BindingError(f"{where}: binding factory raised {type(exc).__name__}: {exc}") from exc
        if isinstance(obj, Binding):
            return obj
    raise BindingError(f"{where}: `binding` is a {type(obj).__name__}, not an rlconform Binding "
                       f"(rlconform.harness.catalog.binding.Binding)")


def _import_target(target: str) -> Binding:
    mod_name, _, attr = target.partition(":")
    try:
        mod = importlib.import_module(mod_name)
    except SyntaxError as exc:
        raise BindingError(f"syntax error in binding {exc.filename}:{exc.lineno}: {exc.msg}") from exc
    except ImportError as exc:
        raise BindingError(f"cannot import binding module {mod_name!r}: {exc}") from exc
    obj = mod
    for part in (attr or "binding").split("."):
        if not hasattr(obj, part):
            raise BindingError(f"binding module {mod_name!r} has no attribute {part!r}")
        obj = getattr(obj, part)
    return _as_binding(obj, target)


def _load_file(path: str) -> Binding:
    name = "rlconform_user_binding_" + os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise BindingError(f"cannot load binding file {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        raise BindingError(f"syntax error in binding file {exc.filename}:{exc.lineno}: {exc.msg}") from exc
    except Exception as exc:  # noqa: BLE001
        tb = traceback.extract_tb(exc.__traceback__)
        line = next((f.lineno for f in reversed(tb) if f.filename == path), "?")
        raise BindingError(f"binding file {path}:{line} raised {type(exc).__name__}: {exc}") from exc
    if not hasattr(module, "binding"):
        raise BindingError(f"binding file {path} defines no `binding`")
    return _as_binding(module.binding, path)


def validate_binding(binding: Binding, where: str) -> None:
    """Every op name is in the catalog and every eagerly given implementation has the op's shape
    (lazy ones are checked when they load); raise :class:`BindingError` naming the op otherwise."""
    from rlconform.harness.catalog.binding import Lazy, validate_impl
    from rlconform.harness.catalog.ops import OPS

    for op, impl in binding.ops.items():
        if op not in OPS:
            raise BindingError(f"{where}: binding {binding.name!r} provides unknown op {op!r}; "
                               f"the catalog has: {', '.join(OPS)}")
        if not isinstance(impl, Lazy):
            validate_impl(op, impl, where=f"{where}: binding {binding.name!r}")
    from rlconform.harness.catalog.binding import Implementation

    for op, impls in (getattr(binding, "implementations", None) or {}).items():
        info = OPS.get(op)
        if info is None or op not in binding.ops:
            raise BindingError(f"{where}: binding {binding.name!r} declares implementations of {op!r}, which it "
                               f"does not bind (bind the op's default implementation in ops)")
        unknown = sorted(set(impls) - set(info.implementations))
        if unknown:
            known = ", ".join(info.implementations) or "none"
            raise BindingError(f"{where}: op {op!r} has no implementation(s) {unknown}; the catalog knows {known}")
        for name, impl in impls.items():
            if not isinstance(impl, Implementation):
                raise BindingError(f"{where}: implementation {name!r} of {op!r} must be an Implementation, got "
                                   f"{type(impl).__name__}")
            if not isinstance(impl.fn, Lazy):
                validate_impl(op, impl.fn, where=f"{where}: binding {binding.name!r} (implementation {name!r})")


def _import_root(module: str) -> str | None:
    """The ``sys.path`` folder ``module`` was imported from, when it is not an installed package's (a
    ``module:attr`` spec found through the current directory or ``PYTHONPATH``); None otherwise."""
    top = sys.modules.get(module.split(".")[0])
    path = getattr(top, "__file__", None) or next(iter(getattr(top, "__path__", []) or []), None)
    if not path:
        return None
    path = os.path.abspath(path)
    root = os.path.dirname(os.path.dirname(path)) if os.path.basename(path) == "__init__.py" else os.path.dirname(path)
    if os.path.basename(root) in ("site-packages", "dist-packages") or root.startswith(sys.prefix + os.sep) \
            or root.startswith(getattr(sys, "base_prefix", sys.prefix) + os.sep):
        return None
    return root


def load_engine(spec: str | None = None, engine_path: str | None = None) -> Binding:
    """Resolve an engine spec (default: ``$RLCONFORM_ENGINE`` or ``reference``) to a Binding. Warnings the
    engine's modules raise while they are imported ("Transformer Engine and Apex are not installed") are
    not printed: they say nothing of the numerics checked."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _load_engine(spec, engine_path)


def _load_engine(spec: str | None, engine_path: str | None) -> Binding:
    spec = spec or os.environ.get("RLCONFORM_ENGINE") or "reference"
    if engine_path is not None:
        engine_path = os.path.abspath(engine_path)
        if not os.path.isdir(engine_path):
            raise BindingError(f"--engine-path {engine_path} does not exist or is not a directory")
        sys.path.insert(0, engine_path)
    if spec in BUILTIN:
        target, package, hint = BUILTIN[spec]
        if package is not None:
            try:
                found = importlib.util.find_spec(package.split(".")[0])
            except (ImportError, ValueError):
                found = None
            if found is None:
                where = f" in --engine-path {engine_path}" if engine_path else ""
                raise BindingError(f"engine {spec!r} is not installed{where} (no package {package!r}); "
                                   f"install it with: {hint}")
            if engine_path is not None:
                origin = importlib.util.find_spec(package.split(".")[0]).origin or ""
                if not os.path.abspath(origin).startswith(engine_path + os.sep):
                    raise BindingError(f"--engine-path {engine_path} holds no package {package!r} "
                                       f"(it resolves to {origin})")
        binding = _import_target(target)
    elif spec.startswith("mutants."):
        family = spec.split(".", 1)[1]
        if family not in mutant_names():
            close = difflib.get_close_matches(family, mutant_names(), n=1)
            raise BindingError(f"unknown mutant {family!r}" + (f" (did you mean 'mutants.{close[0]}'?)" if close else "")
                               + "; the bundled mutants: `rlconform list-engines`")
        binding = _import_target(f"rlconform.harness.mutants.{family}:binding")
    elif spec.endswith(".py"):
        if not os.path.isfile(spec):
            raise BindingError(f"binding file {spec} does not exist")
        spec = os.path.abspath(spec)  # reproducers replay from any directory
        binding = _load_file(spec)
    elif ":" in spec:
        binding = _import_target(spec)
    else:
        close = difflib.get_close_matches(spec, available_engines(), n=1)
        raise BindingError(f"unknown engine {spec!r}" + (f" (did you mean {close[0]!r}?)" if close else "") +
                           f"; engines: {', '.join(BUILTIN)}, a binding (<module>:<attr> or <file>.py), or one of "
                           f"the {len(mutant_names())} bundled mutants (mutants.<name>: `rlconform list-engines`)")
    validate_binding(binding, where=spec)
    if engine_path is None and ":" in spec and not spec.endswith(".py") and spec not in BUILTIN:
        engine_path = _import_root(spec.split(":", 1)[0])  # a reproducer must import it too
    if engine_path is not None:
        binding.path = engine_path
        binding.revision = _git_revision(engine_path)
        if spec in BUILTIN and BUILTIN[spec][1] is not None:
            binding.version = tree_version(BUILTIN[spec][1], engine_path) or binding.version
    binding.spec = spec
    return binding


def tree_version(package: str, root: str) -> str | None:
    """The version an engine's source tree under ``root`` declares for ``package`` (a fork or an older commit on
    ``--engine-path``: not the installed distribution's), read without importing it: a ``version/version`` file
    (verl), a string ``__version__`` in the package's ``__init__.py`` (SkyRL), or ``MAJOR`` / ``MINOR`` / ``PATCH`` /
    ``PRE_RELEASE`` in ``package_info.py`` (megatron-core). None when the tree declares none of these."""
    import ast

    base = os.path.join(root, *package.split("."))
    try:
        with open(os.path.join(base, "version", "version"), encoding="utf-8") as f:
            text = f.read().strip()
        if text:
            return text
    except OSError:
        pass
    consts: dict = {}
    for name in ("__init__.py", "package_info.py"):
        try:
            with open(os.path.join(base, name), encoding="utf-8") as f:
                tree = ast.parse(f.read())
        except (OSError, SyntaxError, ValueError):
            continue
        for node in tree.body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                    and isinstance(node.value, ast.Constant) and isinstance(node.value.value, (str, int)):
                consts[node.targets[0].id] = node.value.value
        if isinstance(consts.get("__version__"), str):
            return consts["__version__"]
        if all(k in consts for k in ("MAJOR", "MINOR", "PATCH")):
            return f"{consts['MAJOR']}.{consts['MINOR']}.{consts['PATCH']}{consts.get('PRE_RELEASE', '')}"
    return None


def engine_meta(binding: Binding, *, variants: bool = False, sites: bool = False) -> dict:
    """What the process that writes the report needs of an engine (no code): name, spec, version, path,
    revision and the ops it binds; with ``variants`` (in a child process: it resolves the ops that have
    variants, importing the engine), ``variants`` (op -> the catalog variants it provides, None for an op
    that cannot be resolved: its findings then report it unavailable) and ``variant_record`` (for the
    report: per op, the variants checked, not provided, and registered but unchecked, with why) and
    ``coverage`` (the coverage table, :func:`rlconform.harness.catalog.coverage.coverage_record`; None when the
    binding declares none); with ``sites``, ``sites`` (:func:`rlconform.harness.catalog.engine_site.op_sites`:
    the engine functions behind each op, for ``--changed-since``)."""
    meta = {"name": binding.name, "spec": binding.spec, "version": binding.version, "path": binding.path,
            "revision": binding.revision, "ops": list(binding.provided_ops()),
            "engine_dtypes": {op: list(d) for op, d in (getattr(binding, "engine_dtypes", None) or {}).items()},
            "declared": [d.row() for d in getattr(binding, "declared", ())],
            "variant_triggers": {op: dict(v) for op, v in (getattr(binding, "variant_triggers", None) or {}).items()},
            "impact_knobs": {op: dict(v) for op, v in (getattr(binding, "impact_knobs", None) or {}).items()},
            "remedies": getattr(binding, "remedy_table", dict)(),
            "configs": getattr(binding, "config_table", dict)()}
    if variants:
        meta["variants"], meta["variant_record"] = variant_info(binding)
        from rlconform.harness.catalog.coverage import coverage_record

        meta["coverage"] = coverage_record(binding)
    if sites:
        from rlconform.harness.catalog.engine_site import op_sites

        meta["sites"] = op_sites(binding)
    return meta


def variant_info(binding: Binding) -> tuple[dict, dict]:
    """(op -> provided variants or None, op -> {checked, not_provided, unchecked}) for the binding's ops
    that have variants."""
    from rlconform.harness.catalog.binding import OpUnavailable
    from rlconform.harness.catalog.ops import OPS

    provided, record = {}, {}
    for name in binding.provided_ops():
        op = OPS.get(name)
        if op is not None and op.implementations:  # declared on the binding: nothing to resolve
            got = set(binding.provided_implementations(name)) if hasattr(binding, "provided_implementations") else set()
            provided[name] = [v for v in op.implementations if v in got]
            record[name] = {"checked": list(provided[name]),
                            "not_provided": [v for v in op.implementations if v not in got], "unchecked": {}}
            continue
        if op is None or not op.variants:
            continue
        try:
            got = binding.provided_variants(name)
            unchecked = binding.unchecked_variants(name)
        except (OpUnavailable, BindingError):
            provided[name] = None
            continue
        known = op.variants + op.implemented_variants  # second implementations (grpo+vectorized) listed alike
        provided[name] = None if got is None else [v for v in known if v in set(got)]
        record[name] = {
            "checked": [v for v in known if got is None or v in set(got)],
            "not_provided": [v for v in known if got is not None and v not in set(got)],
            "unchecked": {str(k): str(v) for k, v in unchecked.items()},
        }
    return provided, record


def _probe(spec: str | None, engine_path: str | None, sites: bool = False, emit=None) -> dict:
    """In a child process: load the engine and return :func:`engine_meta`, or ``{"error": message}``."""
    import warnings

    try:
        with warnings.catch_warnings():  # the engine's import-time warnings say nothing of its numerics
            warnings.simplefilter("ignore")
            return engine_meta(load_engine(spec, engine_path), variants=True, sites=sites)
    except BindingError as exc:
        return {"error": str(exc)}


def probe_engine(spec: str | None, engine_path: str | None = None, *, deadline_s: float = 600.0,
                 sites: bool = False) -> dict:
    """Load the engine in a child process (a binding module runs code when imported: it must not run in
    the process that decides the exit code) and return :func:`engine_meta`. Raise :class:`BindingError`
    if it cannot be loaded, or if loading it killed or hung its process."""
    from rlconform.harness.workers.isolated import ChildDied, run_isolated

    try:
        meta = run_isolated(_probe, (spec, engine_path, sites), deadline_s=deadline_s)
    except ChildDied as exc:
        raise BindingError(f"loading engine {spec or os.environ.get('RLCONFORM_ENGINE') or 'reference'!r}: "
                           f"{exc.description}" + (f"\n{exc.stack.strip()}" if exc.stack.strip() else "")) from None
    except RuntimeError as exc:  # the loader itself raised something else: say so, without a traceback
        last = str(exc).strip().splitlines()[-1:] or ["?"]
        raise BindingError(f"loading engine {spec!r} failed: {last[0]}") from None
    if "error" in meta:
        raise BindingError(meta["error"])
    return meta


def load_engine_with_coverage(spec: str | None, engine_path: str | None, needs: str):
    """``(binding, None)`` for an engine that declares its coverage (``Binding.coverage``), else ``(None, error
    message)``: a binding that cannot be loaded, or one without coverage, for which ``needs`` says what the
    caller reads from it (``coverage`` and ``audit`` run this in a child process)."""
    from rlconform.harness.catalog.binding import BindingError

    try:
        binding = load_engine(spec, engine_path)
    except BindingError as exc:
        return None, str(exc)
    if binding.coverage is None:
        return None, f"engine {binding.spec!r} declares no coverage (Binding.coverage): {needs}"
    return binding, None


def engine_record(child, spec: str, engine_path: str | None, deadline_s: float | None, what: str):
    """``(record, None)``: ``child(spec, engine_path)`` run in an isolated process (it loads the engine and
    returns data only), or ``(None, one-line error)`` when the child died, raised, or returned
    ``{"error": ...}``; ``what`` names what the record is for, in the message (``coverage`` and ``audit``)."""
    from rlconform.harness.workers.isolated import ChildDied, run_isolated

    try:
        record = run_isolated(child, (spec, engine_path), deadline_s=deadline_s)
    except ChildDied as exc:
        return None, f"loading engine {spec!r}: {exc.description}"
    except RuntimeError as exc:
        return None, f"{what} could not be built: {str(exc).strip().splitlines()[-1]}"
    if "error" in record:
        return None, record["error"]
    return record, None
