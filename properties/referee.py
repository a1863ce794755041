"""The referee: the verdict on a case is computed in a process that has never imported engine code.

The engine's worker (:func:`refereed_check`) sends the referee the case and a stand-in of the binding
(:func:`standin`: the binding's data, every engine callable replaced by a :class:`ReplayFn`, every other
engine object by an :class:`~rlconform.harness.core.tape.Unreadable`, both numbered; the declared triggers
decided). The referee (:func:`judge`, in a process started by :mod:`rlconform.harness.workers.referee`
before any engine import) loads them with :func:`loads` (only rlconform, numpy, torch and builtin types)
and runs the family's ``evaluate``: the float64 reference, the dtype-faithful path, the tolerance and the
property's judgment run there, in a torch no engine has touched. Each engine call goes back to the worker
(:class:`~rlconform.harness.core.tape.Remote` in the referee, :class:`~rlconform.harness.core.tape.Server`
in the worker: engine calls only), which makes the call on its real binding and answers with its record:
the results as raw bytes of plain tensors, what the call did to the tensors it was handed, what it printed
or raised. The referee answers the worker with the :class:`~rlconform.properties.generic.Outcome` and sends
the verdict to the controller of the run. Whatever the engine patched in its process
(``torch.log_softmax``, ``rlconform.properties.generic.compare``, ``tolerance.ATOL``), or a returned
tensor subclass whose methods lie, never reaches the verdict; the reference and the faithful path are
computed once, in the referee.

A declared guard's trigger is the binding's code: it is evaluated on the case in the worker and
travels as its value (:class:`Decided`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import pickle
import sys
import traceback

from rlconform.harness.core import tape as T
from rlconform.harness.core.blame import OwnCodeRaised, own_code_raised

#: top-level modules the referee may have loaded (beside the standard library and private C modules)
ALLOWED_TOP = frozenset({
    "rlconform", "torch", "torchgen", "numpy", "dill", "hypothesis", "sortedcontainers", "attr", "attrs", "typing_extensions",
    "sympy", "mpmath", "networkx", "jinja2", "markupsafe", "filelock", "fsspec", "exceptiongroup", "opt_einsum",
    "__main__", "__mp_main__", "_distutils_hack", "google", "yaml", "packaging", "_pytest", "pytest", "pluggy",
    "iniconfig", "py", "xdist", "execnet", "optree", "psutil", "certifi", "idna", "urllib3", "charset_normalizer",
    "requests", "six", "tqdm", "pkg_resources", "setuptools", "importlib_metadata", "zipp", "scipy",
    "cython_runtime",  # made by the first Cython extension loaded: numpy.random (a real_shapes case's generator)
})
#: rlconform packages that hold engine code (bindings import engines; mutants are engines)
ENGINE_PACKAGES = ("rlconform.harness.bindings", "rlconform.harness.mutants")


#: top-level packages of the engines rlconform binds: refused even when an interpreter start-up hook loads them
ENGINE_TOPS = frozenset({"verl", "skyrl", "skyrl_train", "skyrl_gym", "megatron"})


#: the binding loader (``--engine`` spec -> Binding): the command line imports it, and never an engine through it
LOADER_MODULES = frozenset({"rlconform.harness.bindings", "rlconform.harness.bindings.load"})
#: the modules of the command line's clean copy (:func:`inherit_modules`), which a referee forked from it accepts
_inherited: frozenset[str] = frozenset()


def _engine_package(name: str) -> bool:
    """Under an engine package, or rlconform's bindings or mutants (the loader included)."""
    return name.startswith(ENGINE_PACKAGES) or name.split(".", 1)[0] in ENGINE_TOPS


def _engine_module(name: str) -> bool:
    return _engine_package(name) and name not in LOADER_MODULES


def engine_modules() -> list[str]:
    """The engine modules this process has loaded: an engine package's, a binding's or a mutant's (the binding
    loader, :data:`LOADER_MODULES`, is not one)."""
    return sorted(n for n in list(sys.modules) if _engine_module(n))


def check_copyable() -> None:
    """Raise :class:`RefereeTouched` when this process may not be copied for a referee to fork from
    (:mod:`rlconform.harness.workers.zygote`): it has loaded an engine module (:func:`engine_modules`)."""
    bad = engine_modules()
    if bad:
        raise RefereeTouched(f"this process has imported engine modules: {', '.join(bad[:5])}"
                             + (f" and {len(bad) - 5} more" if len(bad) > 5 else ""))


def inherit_modules() -> None:
    """In the command line's clean copy, as it is made: the modules loaded now (none an engine's,
    :func:`check_copyable`) are the command line's, the process that decides the exit code and never imports an
    engine; a referee forked from the copy accepts them, as it accepts the interpreter's start-up modules (a
    console library, the binding loader). An engine module, or any other module the referee imports later, is
    refused as before."""
    global _inherited
    _inherited = frozenset(n for n in list(sys.modules) if not _engine_module(n))


class RefereeTouched(RuntimeError):
    """A module the referee must never import is loaded in the referee's process."""


_startup: frozenset[str] | None = None


def startup_modules() -> frozenset[str]:
    """The modules a fresh interpreter of this process's kind (same executable, flags and environment) has
    loaded before it runs any code: what its start-up hooks import (``sitecustomize`` and what it imports,
    e.g. Debian's apport hook; ``usercustomize``; the import lines of ``.pth`` files). They are the
    interpreter's, not an engine's, and the referee starts under them. Engine packages among them are
    dropped (:data:`ENGINE_PACKAGES`, :data:`ENGINE_TOPS`), so the referee still refuses those. Computed once
    per process, in a child interpreter (about 30 ms); an empty set when that child fails (the referee is
    then as strict as without hooks)."""
    global _startup
    if _startup is None:
        import json
        import subprocess

        probe = "import json, sys; sys.stdout.write(json.dumps(sorted(sys.modules)))"
        try:
            out = subprocess.run([sys.executable, *subprocess._args_from_interpreter_flags(), "-c", probe],
                                 stdin=subprocess.DEVNULL, capture_output=True, timeout=120, check=True).stdout
            names = [n for n in json.loads(out) if isinstance(n, str)]
        except (OSError, subprocess.SubprocessError, ValueError):
            names = []
        _startup = frozenset(n for n in names
                             if not n.startswith(ENGINE_PACKAGES) and n.split(".", 1)[0] not in ENGINE_TOPS)
    return _startup


def touched_modules() -> list[str]:
    """Modules of this process that the referee must not have: engine code, or anything outside the
    allowed packages, the interpreter's own start-up modules (:func:`startup_modules`) and those of the command
    line's clean copy it was forked from (:func:`inherit_modules`)."""
    std = getattr(sys, "stdlib_module_names", frozenset())
    bad = []
    startup = None
    for name in list(sys.modules):
        top = name.split(".", 1)[0]
        if name in _inherited:
            continue
        if _engine_package(name):
            bad.append(name)
        elif not (top in std or top in ALLOWED_TOP or top.startswith("_")):
            startup = startup_modules() if startup is None else startup
            if name not in startup:
                bad.append(name)
    return sorted(bad)


def check_clean() -> None:
    """Raise :class:`RefereeTouched` when :func:`touched_modules` finds any."""
    bad = touched_modules()
    if bad:
        raise RefereeTouched(f"the referee's process has imported {', '.join(bad[:5])}"
                             + (f" and {len(bad) - 5} more" if len(bad) > 5 else ""))


# -- the stand-in binding --------------------------------------------------------------------------------

class ReplayFn(T.Opaque):
    """An engine callable in the referee (``index``: where the engine's worker keeps the real one). Only
    :func:`~rlconform.harness.core.evaluation.call_engine` may use it: the call is made in the engine's
    worker (:class:`~rlconform.harness.core.tape.Remote`); any other call raises (rlconform's error)."""

    def __init__(self, label: str, index: int = -1, params: tuple | None = None, marks: dict | None = None):
        self.index, self.label, self.params = index, label, params
        self.__name__ = self.__qualname__ = label
        for name, value in (marks or {}).items():  # the binding's declarations on the callable, as plain data
            setattr(self, name, value)

    @property
    def __signature__(self):
        """The engine callable's parameters (names, kinds, whether defaulted), as the family reads them
        (e.g. whether a metric pipeline's ``emit`` takes ``info``); defaults are not carried."""
        import inspect

        if self.params is None:
            raise ValueError(f"no signature known for {self.label}")
        return inspect.Signature([inspect.Parameter(n, inspect._ParameterKind(k),
                                                    **({"default": None} if d else {})) for n, k, d in self.params])

    def __call__(self, *args, **kwargs):
        mode = T.active()
        if mode is not None and mode[0] == "remote" and mode[1].inside and self.index >= 0:
            return mode[1].call_opaque(self.label, self.index, args, kwargs)
        raise T.ReplayDiverged(f"the engine function {self.label} was called outside call_engine: the referee "
                               f"cannot have it made")

    def __repr__(self):
        return f"<engine function {self.label}>"


@dataclasses.dataclass(frozen=True)
class Decided:
    """A declared trigger's value on the case, computed where the binding's code runs."""
    value: bool

    def __call__(self, case) -> bool:
        return self.value


def _safe_ref(obj) -> bool:
    """Whether ``obj`` is rlconform's own (not an engine package's) and travels as a reference: its module
    and qualified name lead back to it."""
    mod = getattr(obj, "__module__", None) or ""
    if not (mod.startswith("rlconform.") and not mod.startswith(ENGINE_PACKAGES)
            and getattr(obj, "__qualname__", "").find("<") < 0 and not hasattr(obj, "__self__")):
        return False
    found = sys.modules.get(mod)
    for part in obj.__qualname__.split("."):
        found = getattr(found, part, None)
    return found is obj


def _params(fn) -> tuple | None:
    import inspect

    try:
        return tuple((p.name, int(p.kind), p.default is not p.empty) for p in inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None


def _marks(fn) -> dict:
    """The binding's plain-data declarations on an engine callable (``rlconform_world_group``,
    ``rlconform_parallel_state``, ...: attributes named ``rlconform_*`` holding a bool, int, float or str),
    which the distributed families read to lay out the ranks' collectives."""
    try:
        attrs = dict(vars(fn))
    except TypeError:
        return {}
    return {k: v for k, v in attrs.items() if k.startswith("rlconform_") and type(v) in (bool, int, float, str)}


def _strip(obj, label: str, depth: int = 0, table: list | None = None):
    """``obj`` with every engine callable replaced by a :class:`ReplayFn` and every other object of the
    engine's by an :class:`~rlconform.harness.core.tape.Unreadable` (binding data kept); ``table`` gets the
    originals, by the stand-ins' indices."""
    table = [] if table is None else table

    def keep(x):
        table.append(x)
        return len(table) - 1

    if depth > 20:
        return None
    if obj is None or isinstance(obj, (str, int, float, bool, bytes)):
        return obj
    if isinstance(obj, (list, tuple, frozenset, set)):
        return type(obj)(_strip(x, label, depth + 1, table) for x in obj) if type(obj) in (list, tuple, frozenset, set) \
            else tuple(_strip(x, label, depth + 1, table) for x in obj)
    if isinstance(obj, dict) or not isinstance(obj, type) and hasattr(obj, "items") and hasattr(obj, "keys"):
        return {k: _strip(v, f"{label}[{k!r}]", depth + 1, table) for k, v in obj.items()}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type) and _safe_ref(type(obj)):
        changes = {f.name: _strip(getattr(obj, f.name), f"{label}.{f.name}", depth + 1, table)
                   for f in dataclasses.fields(obj) if f.init}
        return dataclasses.replace(obj, **changes)
    if isinstance(obj, type) and _safe_ref(obj):
        return obj
    if callable(obj):
        return obj if (_safe_ref(obj) and getattr(obj, "__name__", "") != "<lambda>") else ReplayFn(
            f"{label} ({getattr(obj, '__qualname__', type(obj).__name__)})", keep(obj), _params(obj), _marks(obj))
    return T.Unreadable(type(obj).__qualname__, keep(obj))


def standin(binding, case, table: list | None = None):
    """A picklable copy of what ``evaluate`` reads of ``binding`` for ``case``: its data, the resolved op
    and its implementations with engine callables as :class:`ReplayFn`, the declared triggers decided;
    ``table`` (a list) gets the engine callables and objects the stand-ins replace, by index."""
    table = [] if table is None else table
    from rlconform.harness.catalog.binding import Binding

    base = getattr(binding, "_binding", binding)  # an ImplementationView is rebuilt by run_check itself
    op = case.op
    impls = {}
    for name in base.provided_implementations(op) if hasattr(base, "provided_implementations") else ():
        try:
            impls[name] = _strip(base.resolve_implementation(op, name), f"{op}@{name}", table=table)
        except Exception:  # noqa: BLE001 - unavailable: the evaluation raises the same in the worker
            pass
    declared = []
    for d in getattr(base, "declared", ()) or ():
        when = d.when
        if when is not None:
            try:
                when = Decided(bool(when(case)))
            except Exception:  # noqa: BLE001 - a trigger that raises does not hold
                when = Decided(False)
        declared.append(dataclasses.replace(d, when=when))
    return Binding(name=base.name, ops={op: _strip(base.resolve(op), op, table=table)}, version=base.version, path=base.path,
                   revision=getattr(base, "revision", None), spec=base.spec,
                   forward_only=frozenset(getattr(base, "forward_only", ()) or ()),
                   detached=frozenset(getattr(base, "detached", ()) or ()),
                   implementations={op: impls} if impls else {},
                   engine_dtypes=dict(getattr(base, "engine_dtypes", {}) or {}), declared=tuple(declared))


# -- what travels ----------------------------------------------------------------------------------------

#: exact (module, name) pairs the referee loads outside rlconform: plain containers and numbers, NumPy's
#: array / dtype / scalar reconstruction, torch's dtypes
_EXACT = frozenset(
    {("builtins", n) for n in ("list", "tuple", "dict", "set", "frozenset", "bytes", "bytearray", "str", "int",
                               "float", "complex", "bool", "slice", "range", "object", "NoneType", "Ellipsis")}
    | {("collections", "OrderedDict"), ("copyreg", "_reconstructor"), ("copyreg", "__newobj__"),
       ("copyreg", "__newobj_ex__"), ("_codecs", "encode"), ("datetime", "datetime"), ("datetime", "date"),
       ("datetime", "timedelta"), ("datetime", "timezone"), ("fractions", "Fraction"), ("decimal", "Decimal")}
    | {(m, n) for m in ("numpy", "numpy.core.multiarray", "numpy._core.multiarray", "numpy.core.numeric",
                        "numpy._core.numeric")
       for n in ("dtype", "ndarray", "_reconstruct", "scalar", "_frombuffer")}
    | {("torch", n) for n in ("float16", "bfloat16", "float32", "float64", "int8", "int16", "int32", "int64",
                              "uint8", "bool", "complex64", "complex128", "Size", "device")})
#: rlconform modules whose classes (data: cases, stand-ins, tape records, binding declarations) may travel
_DATA_MODULES = ("rlconform.harness.core.", "rlconform.harness.catalog.", "rlconform.harness.families.",
                 "rlconform.properties.", "rlconform.reference.", "rlconform.distributed_tests.")
#: rlconform modules whose functions (pure computations on data: the faithful paths, the references) may
#: travel as references inside a stand-in binding
_FUNCTION_MODULES = ("rlconform.harness.core.faithful", "rlconform.harness.families.", "rlconform.reference.")


def _admitted(module: str, name: str):
    """The object ``module.name`` names when the referee may load it, else None: an exact pair of
    :data:`_EXACT`, or a class of rlconform's data modules / a function of its computation modules that is
    *defined* in ``module`` (not imported into it) and named without a dot (pickle at protocol ≥ 4 follows
    dotted names as attribute paths: ``tape.builtins.exec``)."""
    import importlib
    import types

    if not isinstance(module, str) or not isinstance(name, str) or not name.isidentifier():
        return None
    if (module, name) in _EXACT:
        return ...
    if not module.startswith("rlconform.") or module.startswith(ENGINE_PACKAGES):
        return None
    if not module.startswith(_DATA_MODULES) and not module.startswith(_FUNCTION_MODULES):
        return None
    try:
        obj = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None
    if getattr(obj, "__module__", None) != module:
        return None
    if isinstance(obj, type) and module.startswith(_DATA_MODULES):
        return obj
    if isinstance(obj, types.FunctionType) and module.startswith(_FUNCTION_MODULES):
        return obj
    return None


class _Loader(pickle.Unpickler):
    """Loads only what :func:`_admitted` admits: no engine package, no dotted name, no callable that is not
    plain data's constructor or one of rlconform's computations."""

    def find_class(self, module, name):
        found = _admitted(module, name)
        if found is None:
            raise pickle.UnpicklingError(f"the referee does not load {module}.{name}")
        return super().find_class(module, name) if found is ... else found


def loads(data: bytes):
    return _Loader(io.BytesIO(data)).load()


# -- the referee's side ----------------------------------------------------------------------------------

#: what the worker raises itself when the referee's evaluation raises it (not a verdict: the finding is
#: unavailable, skipped or malformed)
_NOT_A_VERDICT = ("BindingError", "OpUnavailable", "VariantNotProvided", "CaseError", "PoolStartupError")


def judge(payload: bytes, check_here, exchange=None):
    """In the referee: ``(reply, verdict)`` for one request, judged by ``check_here`` (:func:`judge_request`).
    A probe's verdict (the request says ``probe``: a re-run of a failing finding's cases to locate its fault,
    not one of its examples, :func:`probing`) is sent with the kind ``probe``, which the controller's record of
    the finding ignores (:class:`rlconform.harness.run.referee_verdicts.VerdictBook`)."""
    req = loads(payload)
    reply, verdict = judge_request(req, check_here, exchange)
    if verdict is not None and req.get("probe"):
        verdict = (verdict[0], "probe", *verdict[2:])
    return reply, verdict


def judge_request(req: dict, check_here, exchange=None):
    """``(reply, verdict)`` for one request (``{"case", "binding"[, "probe"]}``), judged by ``check_here``
    (:func:`rlconform.harness.run.dispatch.run_check_here`, served by :func:`rlconform.harness.run.dispatch.referee_judge`)
    (see the module docstring). ``exchange(bytes) -> bytes`` asks the engine's worker to make one engine
    call (:class:`~rlconform.harness.core.tape.Remote`). ``reply`` is one of ``("outcome", Outcome)``, ``("crash", message, engine traceback, type name, module, builtin base)``,
    ``("diverged", message)``, ``("raised", message, traceback)`` (the family's reading of the engine's
    output raised: the engine's contract breach), ``("own_error", where, message, traceback)`` (rlconform's
    yardstick raised: :mod:`rlconform.harness.core.blame`), ``("not_checked", class name, message,
    attributes)``; ``verdict`` is ``(finding id, kind, outcome verdict or None, message[, numbers])`` (None for
    ``not_checked``; ``numbers``: the outcome's ratio, max_abs_err, max_rel_err, tolerance and failure clauses)."""
    from rlconform.harness.core.evaluation import EngineCrash

    case, binding = req["case"], req["binding"]
    fid = case.finding_id
    if exchange is None:
        raise T.ReplayDiverged("no engine worker to make the engine's calls")
    tape = T.Remote(exchange, loads)
    try:
        with T.remote(tape):
            outcome = check_here(binding, case)
        from rlconform.harness.core import failure

        numbers = {"ratio": outcome.ratio, "max_abs_err": outcome.max_abs_err, "max_rel_err": outcome.max_rel_err,
                   "tolerance": outcome.tolerance, "clauses": failure.clauses_to_json(outcome.clauses)}
        return ("outcome", outcome), (fid, "outcome", outcome.verdict, outcome.message, numbers)
    except EngineCrash as exc:
        fields = T.exception_fields(exc)
        cause = exc.__cause__
        crash = {"type": fields[0], "where": str(getattr(exc, "where", "") or ""),
                 "text": (str(cause if cause is not None else exc).strip().splitlines() or [""])[0][:500]}
        return (("crash", str(exc), getattr(exc, "engine_traceback", ""), *fields),
                (fid, "crash", None, str(exc), {"crash": crash}))
    except T.ReplayDiverged as exc:
        return ("diverged", str(exc)), (fid, "diverged", None, str(exc))
    except Exception as exc:  # noqa: BLE001 - the check raised on what the engine returned
        if type(exc).__name__ in _NOT_A_VERDICT and type(exc).__module__.startswith("rlconform."):
            attrs = {k: v for k, v in vars(exc).items() if isinstance(v, (str, int, float, bool, type(None)))}
            return ("not_checked", type(exc).__module__, type(exc).__qualname__, str(exc), attrs), None
        msg = f"{type(exc).__name__}: {exc}"
        where = own_code_raised(exc)
        if where is not None:  # rlconform's yardstick raised on the engine's data: rlconform's error
            own = str(OwnCodeRaised(where, msg))
            return ("own_error", where, msg, traceback.format_exc()[-4000:]), (fid, "own_error", None, own)
        crash = {"type": type(exc).__name__, "where": "reading the engine's output",
                 "text": (str(exc).strip().splitlines() or [""])[0][:500]}
        return ("raised", msg, traceback.format_exc()[-4000:]), (fid, "raised", None, msg, {"crash": crash})


# -- the worker's side -----------------------------------------------------------------------------------

_CLIENT: list = []  # the connection to this worker's referee, when there is one
_PROBING: list = []  # non-empty while this process probes a failing finding (:func:`probing`)


@contextlib.contextmanager
def probing():
    """Checks made inside are probes, not examples of their finding: the re-runs of a failing finding's
    shrunk input and of fresh examples of it that locate its faulty line
    (:func:`rlconform.harness.run.root_cause.locate`). The referee judges them as any other check; their
    verdicts do not count as the finding's examples, so its worst error over tolerance (``max_ratio``, which a
    ledger's member line records) is the one its examples gave, whichever finding of the worker located the
    defect's line first."""
    _PROBING.append(True)
    try:
        yield
    finally:
        _PROBING.pop()


def connect(address: str, authkey: bytes) -> None:
    """Send this process's checks to the referee at ``address`` from now on."""
    from rlconform.harness.workers.referee import connect as _connect

    _CLIENT[:] = [_connect(address, authkey)]


def disconnect() -> None:
    _CLIENT.clear()


def connected() -> bool:
    return bool(_CLIENT)


class RefereeRaised(Exception):
    """The referee's evaluation raised on what the engine returned (an output the check cannot read): the
    engine's crash, as :class:`~rlconform.properties.runner.CheckRaised` is without a referee."""


#: how every message of a finding the referee could not judge begins (status ``error``: rlconform's own
#: failure, never a verdict on the engine); the controller (:mod:`rlconform.harness.run.referee_verdicts`)
#: reads it back
REFEREE_ERROR = "rlconform's referee could not judge this case (rlconform's own error, not the engine's)"


class RefereeError(Exception):
    """rlconform's own failure to judge a case under the referee: its evaluation of the engine's calls
    diverged (:class:`~rlconform.harness.core.tape.ReplayDiverged`: e.g. an engine function called
    outside ``call_engine``, a call the worker could not make or answer), the referee failed, or it
    stopped answering. A harness error (status ``error``, exit 2), never a verdict on the engine."""

    def __init__(self, message: str):
        super().__init__(f"{REFEREE_ERROR}: {message}")


def _not_checked(module: str, qualname: str, message: str, attrs: dict) -> Exception:
    """The referee's BindingError / OpUnavailable / VariantNotProvided / CaseError, rebuilt here."""
    import importlib

    cls = importlib.import_module(module)
    for part in qualname.split("."):
        cls = getattr(cls, part)
    exc = cls.__new__(cls)
    Exception.__init__(exc, message)
    exc.__dict__.update(attrs)
    return exc


def refereed_check(binding, case):
    """The check of ``case`` with the engine's calls only made here: the referee runs the family's
    evaluation (the float64 reference, the dtype-faithful path, the judgment) and sends each engine call
    to this process, which makes it and answers with its record (module docstring). Raises what the
    evaluation raises for reasons that are not a verdict (BindingError, OpUnavailable, VariantNotProvided,
    CaseError, interrupts); EngineCrash when the engine raised (and no declared guard covers it);
    :class:`RefereeRaised` when the family's reading of the engine's output raised in the referee;
    :class:`~rlconform.harness.core.blame.OwnCodeRaised` when rlconform's yardstick raised on it (its error);
    :class:`RefereeError` when the referee could not judge (its evaluation diverged, it failed or stopped
    answering): rlconform's error, not the engine's."""
    from rlconform.harness.core import torch_state
    from rlconform.harness.core.evaluation import EngineCrash
    from rlconform.harness.workers.referee import RefereeUnavailable

    table: list = []
    payload = pickle.dumps({"case": case, "binding": standin(binding, case, table), "probe": bool(_PROBING)},
                           protocol=pickle.HIGHEST_PROTOCOL)
    server = T.Server(table, torch_state.guard)
    try:
        reply = _CLIENT[0].ask(payload, server.handle)
    except RefereeUnavailable as exc:
        raise RefereeError(str(exc)) from exc
    kind = reply[0]
    if kind == "outcome":
        return reply[1]
    if kind == "crash":  # the engine's own exception where this process has it (its type, for the triage)
        real = server.raised.get(reply[2])
        if real is None:  # raised in the referee's own evaluation (e.g. every input rank failed): its type
            real = T.exception_like(*reply[3:6], reply[1]) if len(reply) >= 6 else RuntimeError(reply[1])
        crash = EngineCrash("the referee's evaluation", real)
        crash.args = (reply[1],)
        crash.engine_traceback = reply[2]
        raise crash from real
    if kind == "not_checked":
        raise _not_checked(*reply[1:])
    if kind == "diverged":
        raise RefereeError(f"its evaluation of the engine's calls diverged: {reply[1]}")
    if kind == "own_error":
        raise OwnCodeRaised(str(reply[1]), str(reply[2]))
    if kind == "raised":
        raise RefereeRaised(reply[1])
    raise RefereeError(f"the referee failed: {str(reply[-1]).strip()[-2000:]}")
