"""Shims the real engines need to import and run on a CPU-only Python 3.11 machine.

Each shim is a context manager, applied only for the duration it is needed, and touches nothing
that computes a number: they change how a module is *imported* (a typing alias, one stand-in module)
or where a scalar is *placed* (the CPU instead of a CUDA device). None of them clones, upcasts or
reorders anything the engine computes, so a discrepancy the harness reports is the engine's own.

* :func:`pydantic_typeddict` — SkyRL 0.4.0 declares Python >= 3.12. Its import chain
  ``skyrl.backends/__init__ -> backend -> skyrl.tinker.types`` builds pydantic models over classes
  declared with ``typing.TypedDict``; pydantic refuses those on Python < 3.12 ("Please use
  typing_extensions.TypedDict"). While ``skyrl.backends`` is first imported, ``typing.TypedDict`` is
  ``typing_extensions.TypedDict`` (the same runtime class on 3.12+); it is restored right after.
* :func:`megatron_without_triton` — megatron-core 0.18/0.19 import ``triton`` unconditionally from one
  MoE module, ``megatron/core/transformer/moe/ops/paged_stash.py`` (two Triton kernels for MoE paged
  stashing; reached from ``megatron.core`` through pipeline_parallel.schedules). While megatron-core is
  first imported, a stand-in for *that one module* sits in ``sys.modules``: the same
  ``GLOBAL_BLOCK_SIZE`` and two kernels that raise if launched. ``triton`` itself is not stubbed
  (torch._dynamo probes it; a fake triton breaks torch). Not applied when triton is installed.
  megatron-core 0.18 has the kernels inline in ``megatron/core/transformer/moe/paged_stash.py`` (the
  MoE paged-stash manager, reached the same way; 0.19 split them out into ``moe/ops``): for that layout,
  detected from the installed files, the stand-in is that module, every public name of it a stand-in that
  raises when called (no bound op calls the MoE paged stash).
* :func:`ray_scheduling_names` — SkyRL releases and commits before 0.3.0 import Ray's
  ``PlacementGroupSchedulingStrategy`` from ``ray.util.placement_group``, where older Ray versions exported it;
  the installed Ray has it in ``ray.util.scheduling_strategies`` only, so the import chain of every worker module
  (``inference_engines/utils.py``, ``ray_wrapped_inference_engine.py``) fails before any numerics is reached.
  While SkyRL is imported, each name of :data:`RAY_MOVED_NAMES` missing at its old place is put there: the
  class from its new place, or, where this Ray has neither, a stand-in that raises when constructed. Only the
  scheduler uses these names (placing Ray actors on a cluster), which no bound op runs; restored after the import.
* serving stand-ins (:func:`import_skyrl`) — SkyRL commits before 0.3.0 import their HTTP inference endpoint
  (FastAPI, uvicorn, OpenTelemetry) from the worker module's import chain, and the evaluation loop (torchdata)
  from the trainer's (:data:`SKYRL_SERVING_MODULES`). When such a module's import fails because one of those
  packages (:data:`SERVING_PACKAGES`) is not installed, a stand-in for *that SkyRL module* is put in
  ``sys.modules`` (every name it is asked for raises when called or constructed) and the import is retried. No
  bound op serves or evaluates.
* :func:`skyrl_cuda_device_on_cpu` — SkyRL's ``DistributedStrategy.all_reduce`` (used by
  ``all_reduce_metrics``) moves every CPU scalar to ``torch.cuda.current_device()``, which raises
  without CUDA. During the call, ``torch.cuda.current_device`` returns ``torch.device("cpu")``, so
  the all-reduce runs on the CPU over gloo with the same dtype (float32) and the same arithmetic
  (``/= world_size`` then SUM, or MIN / MAX). One difference, documented and not hit by the
  bindings: for a metric that is already a CPU *tensor*, ``.to(cpu)`` returns the same tensor where
  ``.to(cuda)`` copies, so SkyRL's in-place ``/=`` would then alter the caller's tensor; the SkyRL
  workers emit Python floats (``.item()``), and so do the bindings. Not applied when CUDA is present.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import sys
import threading
import types
from typing import Any, Callable, Iterator

__all__ = [
    "PAGED_STASH_MODULE",
    "import_megatron",
    "import_skyrl",
    "megatron_without_triton",
    "pydantic_typeddict",
    "ray_scheduling_names",
    "skyrl_cuda_device_on_cpu",
]

_LOCK = threading.RLock()

PAGED_STASH_MODULE = "megatron.core.transformer.moe.ops.paged_stash"
#: megatron-core 0.18's module with the paged-stash Triton kernels inline (0.19 moved them to PAGED_STASH_MODULE)
PAGED_STASH_MODULE_018 = "megatron.core.transformer.moe.paged_stash"


# --------------------------------------------------------------------------------------- SkyRL
@contextlib.contextmanager
def pydantic_typeddict() -> Iterator[None]:
    """``typing.TypedDict`` is ``typing_extensions.TypedDict`` inside the block (Python < 3.12 only)."""
    if sys.version_info >= (3, 12):
        yield
        return
    import typing

    import typing_extensions

    with _LOCK:
        original = typing.TypedDict
        typing.TypedDict = typing_extensions.TypedDict
        try:
            yield
        finally:
            typing.TypedDict = original


#: Ray scheduling names an older SkyRL imports from where an older Ray had them: (module, name) -> (module of
#: the installed Ray's definition, name)
RAY_MOVED_NAMES = {
    ("ray.util.placement_group", "PlacementGroupSchedulingStrategy"):
        ("ray.util.scheduling_strategies", "PlacementGroupSchedulingStrategy"),
}


class _RaySchedulerUnavailable:
    """Stands in for a Ray scheduling class this Ray lacks: constructing it raises (no bound op schedules)."""

    def __init__(self, *args, **kwargs):
        raise RuntimeError(f"{type(self).__qualname__} is an rlconform stand-in: Ray cluster scheduling is not run "
                           "by any check (harness/bindings/_compat.py: ray_scheduling_names)")


@contextlib.contextmanager
def ray_scheduling_names() -> Iterator[None]:
    """Every :data:`RAY_MOVED_NAMES` entry missing at its old place is there inside the block (module doc); a
    Ray that is not installed is left alone (the import then fails naming ray)."""
    added = []
    with _LOCK:
        try:
            for (module, name), (new_module, new_name) in RAY_MOVED_NAMES.items():
                try:
                    old = importlib.import_module(module)
                except ImportError:
                    continue
                if hasattr(old, name):
                    continue
                try:
                    value = getattr(importlib.import_module(new_module), new_name)
                except (ImportError, AttributeError):
                    value = type(name, (_RaySchedulerUnavailable,), {"__module__": module})
                setattr(old, name, value)
                added.append((old, name))
            yield
        finally:
            for old, name in added:
                delattr(old, name)


#: SkyRL modules outside the numerics that a worker's or the trainer's import chain reaches in older commits,
#: with what they do
SKYRL_SERVING_MODULES = {
    "skyrl.backends.skyrl_train.inference_engines.inference_engine_client_http_endpoint":
        "serves generation over HTTP",
    "skyrl.train.evaluate": "the evaluation loop (generation on a held-out dataset)",
}
#: the third-party packages those modules need and rlconform does not install
SERVING_PACKAGES = ("fastapi", "uvicorn", "starlette", "opentelemetry", "torchdata")


def _serving_stand_in(name: str, missing: str) -> types.ModuleType:
    """A stand-in for the SkyRL serving module ``name``: any name imported from it is a class whose construction
    (or call) raises, naming the serving package ``missing``."""
    mod = types.ModuleType(name, f"rlconform stand-in ({missing} not installed); see harness/bindings/_compat.py")
    what = SKYRL_SERVING_MODULES.get(name, "outside the numerics")

    def stand_in(attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)

        def refuse(*args, **kwargs):
            raise RuntimeError(f"{name}.{attr} is an rlconform stand-in: this SkyRL module ({what}) needs {missing}, "
                               "which is not installed, and no check runs it")

        return type(attr, (), {"__init__": refuse, "__call__": refuse, "__module__": name})

    mod.__getattr__ = stand_in  # PEP 562: every name imported from the module
    mod.__rlconform_stand_in__ = True
    return mod


def _failing_serving_module(exc: ModuleNotFoundError) -> str | None:
    """The :data:`SKYRL_SERVING_MODULES` module whose import raised ``exc`` for a missing :data:`SERVING_PACKAGES`
    package (read from the traceback's frames), or None."""
    if (exc.name or "").partition(".")[0] not in SERVING_PACKAGES:
        return None
    tb, found = exc.__traceback__, None
    while tb is not None:
        module = tb.tb_frame.f_globals.get("__name__")
        if module in SKYRL_SERVING_MODULES:
            found = module
        tb = tb.tb_next
    return found


def import_skyrl(module: str) -> types.ModuleType:
    """Import a SkyRL module under :func:`ray_scheduling_names` (the first import of ``skyrl.backends`` also under
    :func:`pydantic_typeddict`), with a stand-in for each serving module whose serving package is missing (module
    doc). Raises the import's error otherwise."""
    with ray_scheduling_names():
        for _ in range(len(SKYRL_SERVING_MODULES) + 1):
            try:
                if "skyrl.backends" not in sys.modules:
                    with pydantic_typeddict():
                        importlib.import_module("skyrl.backends")
                return importlib.import_module(module)
            except ModuleNotFoundError as exc:
                serving = _failing_serving_module(exc)
                if serving is None or serving in sys.modules:
                    raise
                sys.modules[serving] = _serving_stand_in(serving, exc.name)
        return importlib.import_module(module)


@contextlib.contextmanager
def skyrl_cuda_device_on_cpu() -> Iterator[None]:
    """``torch.cuda.current_device()`` returns the CPU device inside the block (only without CUDA)."""
    import torch

    if torch.cuda.is_available():
        yield
        return
    with _LOCK:
        original = torch.cuda.current_device
        torch.cuda.current_device = lambda: torch.device("cpu")
        try:
            yield
        finally:
            torch.cuda.current_device = original


# ------------------------------------------------------------------------------------ Megatron
class _TritonKernelUnavailable:
    """Stands in for a ``@triton.jit`` kernel: launching it (``kernel[grid](...)``) raises."""

    def __init__(self, name: str):
        self.__name__ = name

    def _raise(self, *args, **kwargs):
        raise RuntimeError(
            f"{PAGED_STASH_MODULE}.{self.__name__} is an rlconform stand-in: the MoE paged-stash Triton "
            "kernel needs triton (not installed on this CPU machine)"
        )

    __call__ = _raise

    def __getitem__(self, grid):
        return self._raise

    def __repr__(self):
        return f"<rlconform stand-in for triton kernel {self.__name__}>"


def _paged_stash_stand_in() -> types.ModuleType:
    mod = types.ModuleType(
        PAGED_STASH_MODULE, "rlconform stand-in (triton not installed); see harness/bindings/_compat.py"
    )
    mod.GLOBAL_BLOCK_SIZE = 1024  # megatron-core 0.19.2's value
    mod.paged_stash_copy_kernel = _TritonKernelUnavailable("paged_stash_copy_kernel")
    mod.paged_stash_pop_kernel = _TritonKernelUnavailable("paged_stash_pop_kernel")
    mod.__rlconform_stand_in__ = True
    return mod


class _MegatronNameUnavailable:
    """Stands in for a name of megatron-core 0.18's ``moe/paged_stash.py``: calling it raises."""

    def __init__(self, name: str):
        self.__name__ = self.__qualname__ = name

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{PAGED_STASH_MODULE_018}.{self.__name__} is an rlconform stand-in: the module imports "
                           "triton (not installed on this CPU machine)")

    def __repr__(self):
        return f"<rlconform stand-in for {PAGED_STASH_MODULE_018}.{self.__name__}>"


def _paged_stash_018_stand_in() -> types.ModuleType:
    mod = types.ModuleType(
        PAGED_STASH_MODULE_018, "rlconform stand-in (triton not installed); see harness/bindings/_compat.py"
    )
    mod.GLOBAL_BLOCK_SIZE = 1024  # megatron-core 0.18.2's values
    mod.SCALE_INV_BLOCK_SIZE = 32
    mod.__rlconform_stand_in__ = True

    def __getattr__(name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _MegatronNameUnavailable(name)

    mod.__getattr__ = __getattr__
    return mod


def _triton_module_of_this_megatron() -> tuple[str, Callable[[], types.ModuleType]]:
    """Which module of the installed megatron-core imports triton: 0.19's ``moe/ops/paged_stash.py``, else
    0.18's ``moe/paged_stash.py`` when it does (read from the files, without importing megatron)."""
    import os

    spec = importlib.util.find_spec("megatron")
    for root in (spec.submodule_search_locations or []) if spec is not None else []:
        moe = os.path.join(root, "core", "transformer", "moe")
        if os.path.exists(os.path.join(moe, "ops", "paged_stash.py")):
            break
        path = os.path.join(moe, "paged_stash.py")
        if os.path.exists(path):
            with open(path, encoding="utf-8") as fh:
                if any(line.strip() in ("import triton", "import triton.language as tl") for line in fh):
                    return PAGED_STASH_MODULE_018, _paged_stash_018_stand_in
    return PAGED_STASH_MODULE, _paged_stash_stand_in


@contextlib.contextmanager
def megatron_without_triton() -> Iterator[None]:
    """While the block runs, ``PAGED_STASH_MODULE`` (0.18: ``PAGED_STASH_MODULE_018``) is a stand-in in
    ``sys.modules`` (only when triton is not installed and the real module was not imported yet); it is
    removed afterwards, so the stand-in is reachable only through the names megatron bound while importing."""
    if importlib.util.find_spec("triton") is not None:
        yield
        return
    name, stand_in = _triton_module_of_this_megatron()
    if name in sys.modules:
        yield
        return
    with _LOCK:
        sys.modules[name] = stand_in()
        try:
            yield
        finally:
            sys.modules.pop(name, None)


def import_megatron(module: str) -> types.ModuleType:
    """Import a megatron-core module; the first import of ``megatron.core`` runs under
    :func:`megatron_without_triton`."""
    if "megatron.core" not in sys.modules:
        with megatron_without_triton():
            importlib.import_module("megatron.core")
    return importlib.import_module(module)


# ------------------------------------------------------------------------------ version tolerance
def accepted_keywords(fn: Callable[..., Any], kwargs: dict) -> dict:
    """``kwargs`` less the keywords ``fn``'s signature does not accept (an older engine release
    lacks a keyword a newer one added, e.g. verl's ``agg_loss(dp_size=...)``); all of them when ``fn``
    takes ``**kwargs`` or has no readable signature."""
    import inspect

    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return dict(kwargs)
    if any(p.kind == p.VAR_KEYWORD for p in params):
        return dict(kwargs)
    names = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return {k: v for k, v in kwargs.items() if k in names}
