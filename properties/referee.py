"""The referee: the verdict on a case is computed in a process that has never imported engine code
(issue 22 §1).

In the engine's worker, :func:`refereed_check` runs the family's ``evaluate`` as always but under a
:class:`~rlconform.harness.core.tape.Tape` recording (every engine call's results as raw data, its effects
on the tensors the evaluation knows, what it printed or raised), and sends the case, the tape and a
stand-in of the binding (:func:`standin`: the binding's data, every engine callable replaced by a
:class:`ReplayFn`) to the referee. The referee (:func:`judge`, in a process started by
:mod:`rlconform.harness.workers.referee` before any engine import) loads them with :func:`loads` (only
rlconform, numpy, torch and builtin types), re-runs the same ``evaluate`` with every engine call replayed,
so that the float64 reference, the dtype-faithful path, the tolerance and the property's judgment run in
a torch no engine has touched, and answers with the :class:`~rlconform.properties.generic.Outcome`, which
it also sends to the controller of the run. The worker's own ``evaluate`` serves only to call the engine:
whatever the engine patched in that process (``torch.log_softmax``, ``rlconform.properties.generic.compare``,
``tolerance.ATOL``), or a returned tensor subclass whose methods lie, never reaches the verdict.

A declared guard's trigger (issue 20 §2) is the binding's code: it is evaluated on the case in the worker and
travels as its value (:class:`Decided`).
"""

from __future__ import annotations

import dataclasses
import io
import pickle
import sys
import traceback

from rlconform.harness.core import tape as T

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


class RefereeTouched(RuntimeError):
    """A module the referee must never import is loaded in the referee's process."""


def touched_modules() -> list[str]:
    """Modules of this process that the referee must not have: engine code, or anything outside the
    allowed packages."""
    std = getattr(sys, "stdlib_module_names", frozenset())
    bad = []
    for name in list(sys.modules):
        top = name.split(".", 1)[0]
        if name.startswith(ENGINE_PACKAGES) or not (top in std or top in ALLOWED_TOP or top.startswith("_")):
            bad.append(name)
    return sorted(bad)


def check_clean() -> None:
    """Raise :class:`RefereeTouched` when :func:`touched_modules` finds any."""
    bad = touched_modules()
    if bad:
        raise RefereeTouched(f"the referee's process has imported {', '.join(bad[:5])}"
                             + (f" and {len(bad) - 5} more" if len(bad) > 5 else ""))


# -- the stand-in binding --------------------------------------------------------------------------------

class ReplayFn:
    """An engine callable in the referee: only :func:`~rlconform.harness.core.evaluation.call_engine` may use
    it (and replays the recorded call); a direct call raises."""

    def __init__(self, label: str):
        self.label = label
        self.__name__ = self.__qualname__ = label

    def __call__(self, *args, **kwargs):
        raise T.ReplayDiverged(f"the engine function {self.label} was called outside call_engine: the referee "
                               f"cannot replay it")

    def __repr__(self):
        return f"<engine function {self.label}>"


@dataclasses.dataclass(frozen=True)
class Decided:
    """A declared trigger's value on the case, computed where the binding's code runs."""
    value: bool

    def __call__(self, case) -> bool:
        return self.value


def _safe_ref(obj) -> bool:
    mod = getattr(obj, "__module__", None) or ""
    return mod.startswith("rlconform.") and not mod.startswith(ENGINE_PACKAGES) \
        and getattr(obj, "__qualname__", "").find("<") < 0 and not hasattr(obj, "__self__")


def _strip(obj, label: str, depth: int = 0):
    """``obj`` with every engine callable replaced by a :class:`ReplayFn` (binding data kept)."""
    if depth > 20:
        return None
    if obj is None or isinstance(obj, (str, int, float, bool, bytes)):
        return obj
    if isinstance(obj, (list, tuple, frozenset, set)):
        return type(obj)(_strip(x, label, depth + 1) for x in obj) if type(obj) in (list, tuple, frozenset, set) \
            else tuple(_strip(x, label, depth + 1) for x in obj)
    if isinstance(obj, dict) or hasattr(obj, "items") and hasattr(obj, "keys"):
        return {k: _strip(v, f"{label}[{k!r}]", depth + 1) for k, v in obj.items()}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type) and _safe_ref(type(obj)):
        changes = {f.name: _strip(getattr(obj, f.name), f"{label}.{f.name}", depth + 1)
                   for f in dataclasses.fields(obj) if f.init}
        return dataclasses.replace(obj, **changes)
    if isinstance(obj, type) and _safe_ref(obj):
        return obj
    if callable(obj):
        return obj if (_safe_ref(obj) and getattr(obj, "__name__", "") != "<lambda>") else ReplayFn(
            f"{label} ({getattr(obj, '__qualname__', type(obj).__name__)})")
    return T.Unreadable(type(obj).__qualname__)


def standin(binding, case):
    """A picklable copy of what ``evaluate`` reads of ``binding`` for ``case``: its data, the resolved op
    and its implementations with engine callables as :class:`ReplayFn`, the declared triggers decided."""
    from rlconform.harness.catalog.binding import Binding

    base = getattr(binding, "_binding", binding)  # an ImplementationView is rebuilt by run_check itself
    op = case.op
    impls = {}
    for name in base.provided_implementations(op) if hasattr(base, "provided_implementations") else ():
        try:
            impls[name] = _strip(base.resolve_implementation(op, name), f"{op}@{name}")
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
    return Binding(name=base.name, ops={op: _strip(base.resolve(op), op)}, version=base.version, path=base.path,
                   revision=getattr(base, "revision", None), spec=base.spec,
                   forward_only=frozenset(getattr(base, "forward_only", ()) or ()),
                   implementations={op: impls} if impls else {},
                   engine_dtypes=dict(getattr(base, "engine_dtypes", {}) or {}), declared=tuple(declared))


# -- what travels ----------------------------------------------------------------------------------------

_ALLOWED_MODULES = ("rlconform.", "numpy", "torch", "collections", "copyreg", "_codecs", "builtins", "datetime",
                    "fractions", "decimal")
_BUILTINS = frozenset({"list", "tuple", "dict", "set", "frozenset", "bytes", "bytearray", "str", "int", "float",
                       "complex", "bool", "slice", "range", "object", "type", "getattr", "NoneType", "Ellipsis"})


class _Loader(pickle.Unpickler):
    """Loads only rlconform (its engine packages excluded), numpy, torch and plain builtin types."""

    def find_class(self, module, name):
        if module == "builtins" and name not in _BUILTINS:
            raise pickle.UnpicklingError(f"the referee does not load builtins.{name}")
        if module.startswith(ENGINE_PACKAGES) or not module.startswith(_ALLOWED_MODULES) and module not in (
                "numpy", "torch"):
            raise pickle.UnpicklingError(f"the referee does not load {module}.{name}")
        return super().find_class(module, name)


def loads(data: bytes):
    return _Loader(io.BytesIO(data)).load()


# -- the referee's side ----------------------------------------------------------------------------------

def judge(payload: bytes, check_here):
    """In the referee: ``(reply, verdict)`` for one request, judged by ``check_here``
    (:func:`rlconform.properties.checks.run_check_here`; :func:`rlconform.properties.checks.referee_judge`) (see the module docstring). ``reply`` is one of
    ``("outcome", Outcome)``, ``("crash", message, engine traceback)``, ``("diverged", message)``,
    ``("raised", message, traceback)``; ``verdict`` is ``(finding id, kind, outcome verdict or None, message)``."""
    from rlconform.harness.core.evaluation import EngineCrash

    req = loads(payload)
    case, binding, tape = req["case"], req["binding"], req["tape"]
    fid = case.finding_id
    try:
        with T.replaying(tape):
            outcome = check_here(binding, case)
            tape.finish()
        return ("outcome", outcome), (fid, "outcome", outcome.verdict, outcome.message)
    except EngineCrash as exc:
        return ("crash", str(exc), getattr(exc, "engine_traceback", "")), (fid, "crash", None, str(exc))
    except T.ReplayDiverged as exc:
        return ("diverged", str(exc)), (fid, "diverged", None, str(exc))
    except Exception as exc:  # noqa: BLE001 - the check raised on what the engine returned
        msg = f"{type(exc).__name__}: {exc}"
        return ("raised", msg, traceback.format_exc()[-4000:]), (fid, "raised", None, msg)
    finally:
        tape.discard()


# -- the worker's side -----------------------------------------------------------------------------------

_CLIENT: list = []  # the connection to this worker's referee, when there is one


def connect(address: str, authkey: bytes) -> None:
    """Send this process's checks to the referee at ``address`` from now on."""
    from rlconform.harness.workers.referee import connect as _connect

    _CLIENT[:] = [_connect(address, authkey)]


def disconnect() -> None:
    _CLIENT.clear()


def connected() -> bool:
    return bool(_CLIENT)


class RefereeRaised(Exception):
    """The referee's evaluation raised on what the engine returned (or its replay diverged)."""


def refereed_check(binding, case, check_here):
    """``check_here(binding, case)`` with the engine's calls recorded, judged by the referee (module
    docstring). Raises what ``check_here`` raises for reasons that are not a verdict (BindingError,
    OpUnavailable, VariantNotProvided, CaseError, interrupts); EngineCrash when the referee's replay raised
    the engine's exception; :class:`RefereeRaised` when the check raised on the engine's output there."""
    from rlconform.harness.catalog.binding import BindingError, OpUnavailable, VariantNotProvided
    from rlconform.harness.core.evaluation import EngineCrash
    from rlconform.properties.case import CaseError

    tape = T.Tape()
    local = None
    try:
        with T.recording(tape):
            try:
                check_here(binding, case)
            except (BindingError, OpUnavailable, VariantNotProvided, CaseError):
                raise
            except Exception as exc:  # noqa: BLE001 - judged by the referee, which replays the same
                local = exc
        payload = pickle.dumps({"case": case, "binding": standin(binding, case), "tape": tape},
                               protocol=pickle.HIGHEST_PROTOCOL)
        tape.release()
    except BaseException:
        tape.discard()
        raise
    try:
        reply = _CLIENT[0].ask(payload)
    except BaseException:
        tape.discard()
        raise
    kind = reply[0]
    if kind == "outcome":
        return reply[1]
    if kind == "crash":
        if isinstance(local, EngineCrash):
            raise local
        crash = EngineCrash("the referee's replay", RuntimeError(reply[1]))
        crash.engine_traceback = reply[2]
        raise crash
    if kind == "diverged":
        raise RefereeRaised(f"the referee's replay of the engine's calls diverged: {reply[1]}")
    if kind == "raised":
        raise RefereeRaised(reply[1])
    raise RefereeRaised(f"the referee failed: {reply[-1]}")
