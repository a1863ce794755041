"""Torch's process-global state: what an engine call may leave changed, and putting it back.

A check compares an engine with the float64 reference *and computes with torch itself* (the guards, the
dtype-faithful path, the backward through the engine's output). An engine that leaves global state
changed — ``torch.set_grad_enabled(False)``, another default dtype, deterministic or anomaly mode, the
thread count, flush-to-zero of denormals — would otherwise break every later check of the run (issue
14: a later finding's own backward crashes, hiding a real 2× gradient bug) and its reproducer would
replay as PASS in a fresh process.

* :func:`snapshot` reads the state (:data:`MODES`; the RNG state too with ``rng=True``);
  :func:`changes` lists what differs between two snapshots, e.g. ``"grad mode: True -> False"``;
  :func:`restore` puts a snapshot back.
* :class:`guard` wraps one engine call: on exit it restores what changed and, when the call returned
  normally, raises :class:`TorchStateChanged` naming it (an exception already in flight wins).
  The RNG state is not part of the per-call check (consuming random numbers is not a fault); it is
  restored per finding with :func:`baseline` / :func:`restore`.

Costs about 5 µs per call (a dozen getters read twice; the denormal probe is one Python multiplication).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch

__all__ = ["MODES", "Snapshot", "TorchStateChanged", "baseline", "changes", "guard", "restore", "snapshot"]

# a denormal float64: multiplied by 1 it stays itself unless denormals are flushed (torch.set_flush_denormal
# sets the FTZ/DAZ bits of this thread's SSE control register, which Python's own float arithmetic obeys too)
_DENORMAL = [5e-324, 1.0]
_KEEP_ALIVE: list = []  # RAII guards that switched inference mode back off (see _set_inference_mode)


def _flush_denormal() -> bool:
    return _DENORMAL[0] * _DENORMAL[1] == 0.0


def _default_device():
    # torch.get_default_device() builds a tensor when none was set (~30 µs); read the context it keeps
    ctx = getattr(getattr(torch, "_GLOBAL_DEVICE_CONTEXT", None), "device_context", None)
    return None if ctx is None else str(ctx.device)


def _cudnn() -> tuple[bool, bool, bool]:
    c = torch._C
    return c._get_cudnn_enabled(), c._get_cudnn_deterministic(), c._get_cudnn_benchmark()


def _set_inference_mode(on: bool) -> None:
    # an engine can leave inference mode on only by entering torch.inference_mode() without leaving it;
    # the RAII guard it holds cannot be reached, so a nested guard turning it off is kept alive instead
    if torch.is_inference_mode_enabled() != on:
        _KEEP_ALIVE.append(torch._C._InferenceMode(on))


def _set_deterministic(value: tuple[bool, bool]) -> None:
    torch.use_deterministic_algorithms(value[0], warn_only=value[1])


def _set_anomaly(value: tuple[bool, bool]) -> None:
    torch.set_anomaly_enabled(value[0], value[1])


def _set_autocast(value: tuple[bool, Any]) -> None:
    torch.set_autocast_enabled("cpu", value[0])
    torch.set_autocast_dtype("cpu", value[1])


def _set_cudnn(value: tuple[bool, bool, bool]) -> None:
    c = torch.backends.cudnn
    c.enabled, c.deterministic, c.benchmark = value


#: name -> (getter, setter): the global modes an engine call must leave as it found them
MODES: dict[str, tuple[Callable[[], Any], Callable[[Any], Any]]] = {
    "inference mode": (torch.is_inference_mode_enabled, _set_inference_mode),  # first: it sets grad mode too
    "grad mode": (torch.is_grad_enabled, torch.set_grad_enabled),
    "default dtype": (torch.get_default_dtype, torch.set_default_dtype),
    "default device": (_default_device, torch.set_default_device),
    "deterministic algorithms (enabled, warn_only)": (
        lambda: (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()),
        _set_deterministic),
    "anomaly detection (enabled, check_nan)": (
        lambda: (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled()), _set_anomaly),
    "intra-op threads": (torch.get_num_threads, torch.set_num_threads),
    "float32 matmul precision": (torch.get_float32_matmul_precision, torch.set_float32_matmul_precision),
    "flush denormals to zero": (_flush_denormal, torch.set_flush_denormal),
    "CPU autocast (enabled, dtype)": (
        lambda: (torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")), _set_autocast),
    "cudnn (enabled, deterministic, benchmark)": (_cudnn, _set_cudnn),
}


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """The values of :data:`MODES` (and the CPU RNG state when taken with ``rng=True``)."""

    modes: dict
    rng: Any = None


def _readable(get) -> bool:
    try:
        get()
        return True
    except Exception:  # noqa: BLE001 - a getter this torch lacks is left out
        return False


_NAMES = [name for name, (get, _) in MODES.items() if _readable(get)]
_GETTERS = [MODES[name][0] for name in _NAMES]


def _read() -> list:
    return [get() for get in _GETTERS]


class TorchStateChanged(Exception):
    """An engine call returned with torch's global state changed; ``changes`` lists what (restored)."""

    def __init__(self, changes: list[str]):
        self.changes = list(changes)
        super().__init__("the engine changed torch's global state and did not restore it: " + "; ".join(changes)
                         + " (the harness restored it)")


def snapshot(rng: bool = False) -> Snapshot:
    """Read the current state."""
    return Snapshot(dict(zip(_NAMES, _read())), torch.get_rng_state() if rng else None)


def changes(before: Snapshot, after: Snapshot) -> list[str]:
    """What differs, one ``"name: before -> after"`` per mode (``"CPU RNG state"`` when both have it)."""
    out = [f"{name}: {before.modes[name]} -> {after.modes.get(name)}" for name in before.modes
           if after.modes.get(name) != before.modes[name]]
    if before.rng is not None and after.rng is not None and not torch.equal(before.rng, after.rng):
        out.append("CPU RNG state")
    return out


def restore(snap: Snapshot) -> list[str]:
    """Put ``snap`` back; return the modes that could not be restored (with the error)."""
    failed = []
    for name, want in snap.modes.items():
        get, set_ = MODES[name]
        try:
            if get() != want:
                set_(want)
        except Exception as exc:  # noqa: BLE001
            failed.append(f"{name} ({type(exc).__name__}: {exc})")
    if snap.rng is not None:
        torch.set_rng_state(snap.rng)
    return failed


def baseline() -> Snapshot:
    """The state every finding starts from: this process's state now, RNG included."""
    return snapshot(rng=True)


class guard:
    """``with guard(): engine(...)``: restore torch's global state after the call; if the call returned
    and something changed, raise :class:`TorchStateChanged` naming it. ``changed`` holds the list."""

    __slots__ = ("before", "changed")

    def __init__(self):
        self.before: list | None = None
        self.changed: list[str] = []

    def __enter__(self) -> "guard":
        self.before = _read()
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        after = _read()
        if after != self.before:  # the common case costs two reads and one comparison
            before = Snapshot(dict(zip(_NAMES, self.before)))
            self.changed = changes(before, Snapshot(dict(zip(_NAMES, after))))
            restore(before)
            if exc_type is None:
                raise TorchStateChanged(self.changed)
        return False
