"""megatron-core 0.19.2 bound to the op catalog (install: ``install/engines.sh PY megatron``; imported
through :func:`._compat.import_megatron`, which stands in for the one MoE module that needs triton).

==============================  ===================================================================
op                              megatron-core callable (adapter semantics)
==============================  ===================================================================
token_logprobs                  ``-megatron.core.tensor_parallel.vocab_parallel_cross_entropy(
                                logits, labels, 0.0, tp_group=G)`` with ``G`` a world-size-1 gloo
                                group (TP = 1: the whole vocab on one rank)
vocab_parallel_token_logprobs   the same on the caller's TP ``group`` (each rank passes its
                                contiguous vocab shard; for the distributed tests)
smoothed_token_logprobs         ``-vocab_parallel_cross_entropy(logits, labels, α·(V−1)/V, tp_group=G)``
                                (Megatron's label_smoothing is over the V − 1 other classes)
vocab_parallel_smoothed_...     the same on the TP ``group``, V = local vocab × TP size
==============================  ===================================================================

The adapter passes the caller's tensor as is: Megatron's forward calls ``.float()`` (a no-op for
fp32, a copy for bf16/fp16 and a *downcast* for fp64), then subtracts the max, exponentiates and
divides **in place** — so fp32 logits come back holding the softmax (cases.md family 9), and the
result is always float32. Only the sign is flipped (CE = -log p_y).

``G``: when ``torch.distributed`` is not initialised, it is initialised here, in-process, with gloo
over a ``FileStore`` in a fresh temporary directory, rank 0 of world size 1, and ``G`` is the world
group. When it is already initialised with world size 1, ``G`` is the world group; with a larger
world, ``G`` is a new single-rank group made with ``use_local_synchronization=True`` (only this rank
takes part, so no other rank has to call it). :func:`release_single_rank_group` destroys the
default group again if this module created it (also run at exit).
"""

from __future__ import annotations

import atexit
import importlib.metadata
import os
import shutil
import tempfile
import threading

from rlconform.harness.binding import Binding, Lazy

from ._compat import import_megatron

TP = "megatron.core.tensor_parallel"

_GROUP_LOCK = threading.RLock()
_GROUPS: dict[int, object] = {}


def _version() -> str | None:
    try:
        return importlib.metadata.version("megatron-core")
    except importlib.metadata.PackageNotFoundError:
        return None


_OWNED: dict[str, str] = {}  # {"tmpdir": ...} while this module owns the default process group


def release_single_rank_group() -> None:
    """Destroy the default process group if :func:`single_rank_group` created it (tests call this so
    that later code in the same process may initialise torch.distributed itself)."""
    import torch.distributed as dist

    with _GROUP_LOCK:
        _GROUPS.pop(os.getpid(), None)
        tmpdir = _OWNED.pop("tmpdir", None)
        if tmpdir is None:
            return
        try:
            if dist.is_initialized():
                dist.destroy_process_group()
        finally:
            shutil.rmtree(tmpdir, ignore_errors=True)


def single_rank_group():
    """A process group holding only this process (see the module docstring)."""
    import torch.distributed as dist

    pid = os.getpid()
    with _GROUP_LOCK:
        if pid in _GROUPS and dist.is_initialized():
            return _GROUPS[pid]
        if not dist.is_initialized():
            tmpdir = tempfile.mkdtemp(prefix="rlconform-megatron-")
            store = dist.FileStore(os.path.join(tmpdir, "store"), 1)
            dist.init_process_group(backend="gloo", store=store, rank=0, world_size=1)
            _OWNED["tmpdir"] = tmpdir
            atexit.register(release_single_rank_group)
            group = dist.group.WORLD
        elif dist.get_world_size() == 1:
            group = dist.group.WORLD
        else:
            group = dist.new_group(ranks=[dist.get_rank()], backend="gloo", use_local_synchronization=True)
        _GROUPS[pid] = group
        return group


def _token_logprobs():
    vocab_parallel_cross_entropy = import_megatron(TP).vocab_parallel_cross_entropy

    def token_logprobs(logits, labels):
        group = single_rank_group()
        return -vocab_parallel_cross_entropy(logits, labels, 0.0, tp_group=group)

    token_logprobs.__qualname__ = "megatron.token_logprobs"
    return token_logprobs


def _vocab_parallel_token_logprobs():
    vocab_parallel_cross_entropy = import_megatron(TP).vocab_parallel_cross_entropy

    def vocab_parallel_token_logprobs(local_logits, labels, group):
        return -vocab_parallel_cross_entropy(local_logits, labels, 0.0, tp_group=group)

    vocab_parallel_token_logprobs.__qualname__ = "megatron.vocab_parallel_token_logprobs"
    return vocab_parallel_token_logprobs


def megatron_smoothing(label_smoothing: float, vocab: int) -> float:
    """Megatron's ``label_smoothing`` argument for the catalog's α (PyTorch's convention, α over all V
    classes): Megatron spreads its α_M over the V − 1 other classes (NeMo's convention), i.e. it uses
    α = α_M·V/(V − 1), so α_M = α·(V − 1)/V with V the whole vocab."""
    return float(label_smoothing) * (vocab - 1) / vocab


def _smoothed_token_logprobs():
    vocab_parallel_cross_entropy = import_megatron(TP).vocab_parallel_cross_entropy

    def smoothed_token_logprobs(logits, labels, label_smoothing):
        alpha = megatron_smoothing(label_smoothing, logits.shape[-1])
        return -vocab_parallel_cross_entropy(logits, labels, alpha, tp_group=single_rank_group())

    smoothed_token_logprobs.__qualname__ = "megatron.smoothed_token_logprobs"
    return smoothed_token_logprobs


def _vocab_parallel_smoothed_token_logprobs():
    import torch.distributed as dist

    vocab_parallel_cross_entropy = import_megatron(TP).vocab_parallel_cross_entropy

    def vocab_parallel_smoothed_token_logprobs(local_logits, labels, label_smoothing, group):
        alpha = megatron_smoothing(label_smoothing, local_logits.shape[-1] * dist.get_world_size(group))
        return -vocab_parallel_cross_entropy(local_logits, labels, alpha, tp_group=group)

    vocab_parallel_smoothed_token_logprobs.__qualname__ = "megatron.vocab_parallel_smoothed_token_logprobs"
    return vocab_parallel_smoothed_token_logprobs


binding = Binding(
    name="megatron",
    version=_version(),
    ops={
        "token_logprobs": Lazy(loader=_token_logprobs),
        "vocab_parallel_token_logprobs": Lazy(loader=_vocab_parallel_token_logprobs),
        "smoothed_token_logprobs": Lazy(loader=_smoothed_token_logprobs),
        "vocab_parallel_smoothed_token_logprobs": Lazy(loader=_vocab_parallel_smoothed_token_logprobs),
    },
    notes={
        "token_logprobs": "-megatron.core.tensor_parallel.vocab_parallel_cross_entropy(logits, labels, 0.0, "
        "tp_group=<world-size-1 gloo group>); fp32 logits are overwritten with the softmax in place; output float32",
        "vocab_parallel_token_logprobs": "-vocab_parallel_cross_entropy(local_logits, labels, 0.0, tp_group=group)",
        "smoothed_token_logprobs": "-vocab_parallel_cross_entropy(logits, labels, α·(V−1)/V, tp_group=<world-size-1 "
        "group>): Megatron spreads its label_smoothing over the V−1 other classes; converted to α over all V",
        "vocab_parallel_smoothed_token_logprobs": "-vocab_parallel_cross_entropy(local_logits, labels, α·(V−1)/V, "
        "tp_group=group), V = the whole vocab (local size × TP)",
    },
)
