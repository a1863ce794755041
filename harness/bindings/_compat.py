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


def import_skyrl(module: str) -> types.ModuleType:
    """Import a SkyRL module; the first import of ``skyrl.backends`` runs under :func:`pydantic_typeddict`."""
    if "skyrl.backends" not in sys.modules:
        with pydantic_typeddict():
            importlib.import_module("skyrl.backends")
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
