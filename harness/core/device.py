"""The device of a run: where the engine and the dtype-faithful path compute.

``rlconform check|replay|fuzz --device cpu|cuda|cuda:N`` (default ``cpu``; environment
``RLCONFORM_DEVICE``, which the command line sets for every process the run starts). Inputs are
generated on the CPU exactly as without a device (the same examples, the same bits); :func:`engine_call`
moves every tensor argument of an engine call to the device just before the call and brings every tensor
it returns back to the CPU, where it is compared with the float64 CPU reference. Both moves are
``Tensor.to`` calls, which autograd records: a gradient of a CPU leaf the family made flows back through
the engine's device graph, and the leaf's ``.grad`` is a CPU tensor. The dtype-faithful path
(:mod:`rlconform.harness.core.faithful`) is wrapped the same way, so it computes on the engine's device
and the tolerance policy is unchanged.

Guards on device tensors: the family's :class:`~rlconform.harness.core.guards.InputGuard` watches its CPU
tensors; after every engine call (a forward, or a backward the harness drives), each device copy the
engine was handed and still holds is compared with its CPU original (``_version`` and raw bits): a copy
the engine changed is written back into the original under ``no_grad``, which bumps the original's
``_version`` and sets its bits, so the guard reports the mutation as it would on the CPU — and a producer
that saved the original for its backward raises as it would on the CPU. A copy whose original the harness
itself changed since (its ``_version`` moved) is no longer followed. Not mirrored: a change of shape or
storage (``resize_``, ``set_``) of the device copy.

On ``cpu`` nothing is wrapped: :func:`engine_call` returns the function itself.

Raises :class:`DeviceError` (a ``ValueError``) for a device that is not ``cpu`` / ``cuda`` / ``cuda:N``
or that this machine does not have; the command line turns it into one line and exit code 2.
"""

from __future__ import annotations

import functools
import os
import platform
import re
import threading
import weakref
from typing import Any, Callable

ENV = "RLCONFORM_DEVICE"
DEFAULT = "cpu"
_SYNTAX = re.compile(r"^(cpu|cuda(?::(\d+))?)$")


class DeviceError(ValueError):
    """A ``--device`` that is malformed or absent on this machine (exit code 2, one line)."""


def add_argument(parser) -> None:
    """``--device`` on an argparse (sub)parser: ``check``, ``replay`` and ``fuzz`` take it."""
    parser.add_argument("--device", default=None,
                        help="where the engine computes: cpu, cuda or cuda:N (default: $RLCONFORM_DEVICE or cpu); "
                             "inputs are drawn on the CPU as always, outputs compared on the CPU with the float64 "
                             "reference")


def parse(text: str | None) -> str:
    """The canonical name of device ``text``: ``cpu``, or ``cuda:N`` (``cuda`` is ``cuda:0``). Raises
    :class:`DeviceError` for anything else (``tpu``, ``cuda:x``, ``gpu``)."""
    value = (text or DEFAULT).strip().lower()
    m = _SYNTAX.match(value)
    if m is None:
        raise DeviceError(f"unknown device {text!r}: choose cpu, cuda or cuda:N")
    if m.group(1) == "cpu":
        return "cpu"
    return f"cuda:{int(m.group(2) or 0)}"


def check_available(name: str) -> str:
    """``name`` parsed (:func:`parse`) and present on this machine; raises :class:`DeviceError` naming what
    is missing (no CUDA build or no visible GPU; an index past the visible GPUs)."""
    dev = parse(name)
    if dev == "cpu":
        return dev
    import torch

    if not torch.cuda.is_available():
        built = f"built with CUDA {torch.version.cuda}" if torch.version.cuda else "built without CUDA"
        raise DeviceError(f"--device {name}: no CUDA device on this machine (torch {torch.__version__} {built}; "
                          f"torch.cuda.is_available() is False)")
    count = torch.cuda.device_count()
    index = int(dev.split(":")[1])
    if index >= count:
        raise DeviceError(f"--device {name}: this machine has {count} CUDA device(s) (cuda:0..cuda:{count - 1})")
    return dev


def current() -> str:
    """The run's device: ``RLCONFORM_DEVICE`` parsed (default ``cpu``)."""
    return parse(os.environ.get(ENV) or DEFAULT)


def is_cuda(name: str | None = None) -> bool:
    """Whether device ``name`` (default: :func:`current`) is a CUDA device."""
    return (name or current()).startswith("cuda")


def describe(name: str | None = None) -> dict:
    """What the report records of device ``name`` (default :func:`current`): ``{"device": "cpu" | "cuda:N",
    "name": the GPU's name or the CPU's, "torch": torch's version, "cuda": the CUDA runtime version torch was
    built with on a CUDA device (else None), "capability": "major.minor" on a CUDA device (else None),
    "cpu_capability": the vector ISA torch's CPU kernels dispatch to (``DEFAULT`` | ``AVX2`` | ``AVX512`` | …,
    what ``ATEN_CPU_CAPABILITY`` forces), which torch.compile's CPU code generation also targets}``: two
    CPU reports of one engine may differ in their last bits (and an engine's compiled kernels in more: see
    :mod:`rlconform.harness.core.compile_cache`)."""
    import torch

    dev = parse(name) if name else current()
    doc = {"device": dev, "name": _cpu_name(), "torch": torch.__version__,
           "cuda": None, "capability": None, "cpu_capability": _cpu_capability()}
    if dev != "cpu":
        index = int(dev.split(":")[1])
        doc["name"] = torch.cuda.get_device_name(index)
        doc["cuda"] = torch.version.cuda
        doc["capability"] = "%d.%d" % torch.cuda.get_device_capability(index)
    return doc


def _cpu_capability() -> str | None:
    """``torch.backends.cpu.get_cpu_capability()`` (``AVX512``, ``AVX2``, ``DEFAULT``…), None when this torch
    cannot say."""
    try:
        import torch

        return str(torch.backends.cpu.get_cpu_capability())
    except Exception:  # noqa: BLE001 - an older torch: the report says nothing rather than fail
        return None


def _cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else ``platform.processor()`` / ``machine()``."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


# ------------------------------------------------------------------------------- moves around a call
_LOCAL = threading.local()
#: (weakref to a device copy, its CPU original, copy's _version, original's _version) the engine may still write
_FOLLOWED: list = []


def _bits(t):
    import torch

    t = t.detach()
    if t.is_floating_point() or t.is_complex():
        return t.contiguous().view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])
    return t


def _to(obj: Any, dev, follow: bool) -> Any:
    import torch

    if isinstance(obj, torch.Tensor):
        if obj.device == dev:
            return obj
        moved = obj.to(dev)
        if follow:
            _FOLLOWED.append((weakref.ref(moved), obj, moved._version, obj._version))
        return moved
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a named tuple
        return type(obj)(*(_to(o, dev, follow) for o in obj))
    if isinstance(obj, (tuple, list)):
        return type(obj)(_to(o, dev, follow) for o in obj)
    if isinstance(obj, dict):
        return {k: _to(v, dev, follow) for k, v in obj.items()}
    return obj


def _back(obj: Any) -> Any:
    import torch

    if isinstance(obj, torch.Tensor):
        return obj if obj.device.type == "cpu" else obj.to("cpu")
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(_back(o) for o in obj))
    if isinstance(obj, (tuple, list)):
        return type(obj)(_back(o) for o in obj)
    if isinstance(obj, dict):
        return {k: _back(v) for k, v in obj.items()}
    return obj


def sync_back() -> int:
    """Write every followed device copy the engine changed into its CPU original (see the module
    docstring); returns how many were written. Copies that died, or whose original the harness changed,
    are dropped."""
    import torch

    written, keep = 0, []
    for ref, orig, v_copy, v_orig in _FOLLOWED:
        copy = ref()
        if copy is None or orig._version != v_orig or copy.shape != orig.shape:
            continue
        changed = copy._version != v_copy or not torch.equal(_bits(copy).cpu(), _bits(orig))
        if changed:
            with torch.no_grad():
                orig.copy_(copy.detach().to("cpu"))
            written += 1
        keep.append((ref, orig, copy._version, orig._version))
    _FOLLOWED[:] = keep
    return written


def engine_call(fn: Callable, device: Any = None) -> Callable:
    """``fn`` run on ``device`` (default :func:`current`): tensor arguments (also inside tuples, lists, dicts)
    moved there, tensor results brought back to the CPU, the engine's writes into its copies mirrored into
    the originals (:func:`sync_back`). ``fn`` itself when the device is the CPU, and for a bound method of a
    tensor (``out.backward``: the harness driving autograd from a CPU output; its gradient stays beside it).
    A call inside another wrapped call is not moved again."""
    import torch

    dev = torch.device(device if device is not None else current())
    if dev.type == "cpu" or isinstance(getattr(fn, "__self__", None), torch.Tensor):
        if dev.type == "cpu":
            return fn

        @functools.wraps(fn)
        def driven(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            finally:
                sync_back()
        return driven

    @functools.wraps(fn)
    def on_device(*args, **kwargs):
        if getattr(_LOCAL, "depth", 0):
            return fn(*args, **kwargs)
        _LOCAL.depth = 1
        try:
            result = fn(*_to(list(args), dev, True), **_to(kwargs, dev, True))
            return _back(result)
        finally:
            _LOCAL.depth = 0
            sync_back()
    return on_device


def faithful_call(fn: Callable) -> Callable:
    """``fn`` (a function of :mod:`rlconform.harness.core.faithful`) computing on the run's device, its
    results brought back to the CPU; nothing is followed (the harness's own code writes no input). The
    device is read at each call (the module is imported before the run's device is known)."""
    @functools.wraps(fn)
    def on_device(*args, **kwargs):
        import torch

        dev = torch.device(current())
        if dev.type == "cpu" or getattr(_LOCAL, "depth", 0):
            return fn(*args, **kwargs)
        _LOCAL.depth = 1
        try:
            return _back(fn(*_to(list(args), dev, False), **_to(kwargs, dev, False)))
        finally:
            _LOCAL.depth = 0
    return on_device


# ------------------------------------------------------------------------------- distributed runs
def pool_backend(world_size: int, name: str | None = None) -> tuple[str, list[str]]:
    """(process-group backend, device of each rank) for a pool of ``world_size`` ranks on device ``name``
    (default :func:`current`): ``gloo`` and ``cpu`` ranks on the CPU; ``nccl`` with rank r on ``cuda:r``
    when the machine has at least ``world_size`` CUDA devices (one GPU per rank); otherwise (fewer GPUs
    than ranks, e.g. TP=2 on one GPU) ``gloo`` with every rank on the named CUDA device: NCCL refuses two
    ranks on one GPU, gloo moves CUDA tensors through host memory (slower, same arithmetic)."""
    dev = parse(name) if name else current()
    if dev == "cpu":
        return "gloo", ["cpu"] * world_size
    import torch

    if torch.cuda.device_count() >= world_size:
        return "nccl", [f"cuda:{r}" for r in range(world_size)]
    return "gloo", [dev] * world_size


# ------------------------------------------------------------------------------- ops that need a GPU
NEEDS_CUDA = "needs CUDA"


def missing(needs: str | None, name: str | None = None) -> str | None:
    """Why an op that ``needs`` a device (``"cuda"``, or None) cannot run on device ``name`` (default
    :func:`current`): ``"needs CUDA (the run's device is cpu; ...)"``, or None when it can."""
    if not needs:
        return None
    dev = parse(name) if name else current()
    if needs == "cuda" and not is_cuda(dev):
        return f"{NEEDS_CUDA} (the run's device is {dev}; run with --device cuda on a machine with a GPU)"
    return None
