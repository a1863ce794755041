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
divides **in place** — so fp32 logits come back holding the softmax (“forward overwrites fp32 logits in place”), and the
result is always float32. Only the sign is flipped (CE = -log p_y).

``G``: when ``torch.distributed`` is not initialised, it is initialised here, in-process, with gloo
over a ``FileStore`` in a fresh temporary directory, rank 0 of world size 1, and ``G`` is the world
group. When it is already initialised with world size 1, ``G`` is the world group; with a larger
world, ``G`` is a new single-rank group made with ``use_local_synchronization=True`` (only this rank
takes part, so no other rank has to call it). :func:`release_single_rank_group` destroys the
default group again if this module created it (also run at exit).

Older releases: megatron-core 0.14 - 0.18's ``vocab_parallel_cross_entropy(logits, target,
label_smoothing)`` takes no ``tp_group``; it reads ``parallel_state``'s TP group, rank and size. For those
(detected from the signature) the adapters set ``parallel_state``'s TP group to the same ``G`` / ``group`` for
the call (:func:`parallel_state_tp_group`) and restore it afterwards, so every release reduces over the same
group.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.metadata
import os
import shutil
import tempfile
import threading

from rlconform.harness.catalog.binding import Binding, Coverage, Declared, Implementation, Lazy

from ._compat import accepted_keywords, import_megatron
from .megatron_remedies import REMEDIES

TP = "megatron.core.tensor_parallel"



def cross_entropy_writes_logits(ops: tuple[str, ...], reason: str) -> Declared:
    """Megatron-core's in-place cross entropy as a declared convention of a binding that reaches it (this one's, and
    verl's through ``vocab_parallel_log_probs_from_logits``): one upstream line, read one way in every report.
    ``reason`` says why the binding's callers are not hurt by it."""
    return Declared(
        "megatron_cross_entropy_inplace", "convention", ops,
        "Megatron-core's VocabParallelCrossEntropy.calculate_predicted_logits subtracts the row max from the "
        "logits in place and exponentiates them in place (vocab_parallel_logits -= logits_max; "
        "torch.exp(…, out=…)), and the backward turns the saved softmax (the same storage) into the gradient: a "
        "float32 logits tensor (other dtypes are copied by .float()) holds exp(logits − max) after the forward",
        reason, "megatron/core/tensor_parallel/cross_entropy.py:42",
        writes=("logits",), phase="forward", writer="VocabParallelCrossEntropy.calculate_predicted_logits",
        evidence=(r"vocab_parallel_logits\s*-=\s*logits_max", r"torch\.exp\(\s*vocab_parallel_logits\s*,\s*out="),
        hazard="a caller that reads the logits after the cross entropy (or saved them for its own backward) sees "
               "exp(logits − max), then the gradient")


#: Megatron-core's deliberate behaviour: checked as declared, listed in "Conventions and guards"
DECLARED = (cross_entropy_writes_logits(
    ("token_logprobs", "vocab_parallel_token_logprobs", "smoothed_token_logprobs",
     "vocab_parallel_smoothed_token_logprobs"),
    "upstream, on purpose: 'In-place subtraction reduces memory pressure.' (cross_entropy.py); the model's own "
    "loss (compute_language_model_loss) hands it logits nothing reads afterwards"),)

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


def _takes_tp_group(fn) -> bool:
    """Whether this megatron-core's ``vocab_parallel_cross_entropy`` takes its TP group (``tp_group=``, 0.19);
    0.14 - 0.18 read ``parallel_state.get_tensor_model_parallel_group()`` instead (detected from
    the signature, never from the version number)."""
    return bool(accepted_keywords(fn, {"tp_group": None}))


#: parallel_state's globals that ``vocab_parallel_cross_entropy`` (0.14 - 0.18) reads for its TP group, rank and size
_PS_TP = ("_TENSOR_MODEL_PARALLEL_GROUP", "_MPU_TENSOR_MODEL_PARALLEL_WORLD_SIZE", "_MPU_TENSOR_MODEL_PARALLEL_RANK")


@contextlib.contextmanager
def parallel_state_tp_group(group):
    """For a release without ``tp_group=``: ``megatron.core.parallel_state``'s TP group is ``group`` for the
    duration of one call (its rank and world size read from the group, as ``initialize_model_parallel`` leaves
    them), and the module's globals are restored afterwards. The call then reduces over exactly the group the
    0.19 binding passes as ``tp_group``."""
    ps = import_megatron("megatron.core.parallel_state")
    missing = [name for name in _PS_TP if not hasattr(ps, name)]
    if missing:
        raise AttributeError(f"megatron.core.parallel_state has no {', '.join(missing)}: this release's TP group "
                             "cannot be set for vocab_parallel_cross_entropy", name=missing[0], obj=ps)
    saved = {name: getattr(ps, name) for name in _PS_TP}
    ps._TENSOR_MODEL_PARALLEL_GROUP = group
    ps._MPU_TENSOR_MODEL_PARALLEL_WORLD_SIZE = ps._MPU_TENSOR_MODEL_PARALLEL_RANK = None
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(ps, name, value)


def _cross_entropy():
    """``(logits, labels, label_smoothing, group) -> vocab_parallel_cross_entropy(...)`` over ``group``: with
    ``tp_group=group`` (0.19), else with parallel_state's TP group set to ``group`` (0.14 - 0.18)."""
    vocab_parallel_cross_entropy = import_megatron(TP).vocab_parallel_cross_entropy
    if _takes_tp_group(vocab_parallel_cross_entropy):
        def cross_entropy(logits, labels, label_smoothing, group):
            return vocab_parallel_cross_entropy(logits, labels, label_smoothing, tp_group=group)
    else:
        def cross_entropy(logits, labels, label_smoothing, group):
            with parallel_state_tp_group(group):
                return vocab_parallel_cross_entropy(logits, labels, label_smoothing)
    return cross_entropy


def _token_logprobs():
    cross_entropy = _cross_entropy()

    def token_logprobs(logits, labels):
        group = single_rank_group()
        return -cross_entropy(logits, labels, 0.0, group)

    token_logprobs.__qualname__ = "megatron.token_logprobs"
    return token_logprobs


def _vocab_parallel_token_logprobs():
    cross_entropy = _cross_entropy()

    def vocab_parallel_token_logprobs(local_logits, labels, group):
        return -cross_entropy(local_logits, labels, 0.0, group)

    vocab_parallel_token_logprobs.__qualname__ = "megatron.vocab_parallel_token_logprobs"
    return vocab_parallel_token_logprobs


def _fused_vocab_parallel_token_logprobs():
    """``-fused_vocab_parallel_cross_entropy(local_logits, labels, group)`` (megatron.core.fusions; its steps are
    ``@jit_fuser`` functions, which run on CPU as TorchScript / plain torch)."""
    fused = import_megatron(_FUSED).fused_vocab_parallel_cross_entropy

    def vocab_parallel_token_logprobs(local_logits, labels, group):
        return -fused(local_logits, labels, group)

    vocab_parallel_token_logprobs.__qualname__ = "megatron.fused_vocab_parallel_token_logprobs"
    return vocab_parallel_token_logprobs


def megatron_smoothing(label_smoothing: float, vocab: int) -> float:
    """Megatron's ``label_smoothing`` argument for the catalog's α (PyTorch's convention, α over all V
    classes): Megatron spreads its α_M over the V − 1 other classes (NeMo's convention), i.e. it uses
    α = α_M·V/(V − 1), so α_M = α·(V − 1)/V with V the whole vocab."""
    return float(label_smoothing) * (vocab - 1) / vocab


def _smoothed_token_logprobs():
    cross_entropy = _cross_entropy()

    def smoothed_token_logprobs(logits, labels, label_smoothing):
        alpha = megatron_smoothing(label_smoothing, logits.shape[-1])
        return -cross_entropy(logits, labels, alpha, single_rank_group())

    smoothed_token_logprobs.__qualname__ = "megatron.smoothed_token_logprobs"
    return smoothed_token_logprobs


def _vocab_parallel_smoothed_token_logprobs():
    import torch.distributed as dist

    cross_entropy = _cross_entropy()

    def vocab_parallel_smoothed_token_logprobs(local_logits, labels, label_smoothing, group):
        alpha = megatron_smoothing(label_smoothing, local_logits.shape[-1] * dist.get_world_size(group))
        return -cross_entropy(local_logits, labels, alpha, group)

    vocab_parallel_smoothed_token_logprobs.__qualname__ = "megatron.vocab_parallel_smoothed_token_logprobs"
    return vocab_parallel_smoothed_token_logprobs


#: the faulty source line of a Megatron-core function whose failing and passing examples run the same lines
#: (Binding.fault_anchors): regular expressions resolved in the installed source at run time, never line numbers;
#: ``(qualname, pattern)`` looks in the autograd Function vocab_parallel_cross_entropy hands its work to
_CE = "megatron.core.tensor_parallel.cross_entropy"
FAULT_ANCHORS = {
    # label smoothing's mean log-probability is taken over the rank's vocab shard (vocab_size = the shard's
    # size, mean(dim=-1) never all-reduced): with TP > 1 each rank smooths towards its own shard; and
    # log(exp_logits) of an underflowed softmax is log 0 = −inf
    f"{_CE}.vocab_parallel_cross_entropy": {
        "partition dependence|wrong value": (
            ("_VocabParallelCrossEntropy.forward", r"vocab_size = exp_logits\.size\(-1\)"),
            ("_VocabParallelCrossEntropy.forward", r"mean_log_probs = log_probs\.mean\(dim=-1\)")),
        "NaN|inf": (("_VocabParallelCrossEntropy.forward", r"log_probs = torch\.log\(exp_logits\)"),)},
}


binding = Binding(
    name="megatron",
    fault_anchors=FAULT_ANCHORS,
    remedies=REMEDIES,
    declared=DECLARED,
    version=_version(),
    # Megatron trains in bf16 or fp16 (``--bf16`` / ``--fp16``; fp32 with neither): the output
    # layer's logits reach ``vocab_parallel_cross_entropy`` in that dtype. Never float64.
    engine_dtypes={op: ("float32", "bfloat16", "float16") for op in (
        "token_logprobs", "vocab_parallel_token_logprobs", "smoothed_token_logprobs",
        "vocab_parallel_smoothed_token_logprobs")},
    implementations={"vocab_parallel_token_logprobs": {
        # "vocab_parallel_logits: ... dimension is [sequence_length, batch_size, hidden_size]; target: [sequence_length,
        # micro_batch_size]": 3-D only; no dtype documented: not checked
        "fused": Implementation(Lazy(loader=_fused_vocab_parallel_token_logprobs), ranks=(3,),
                                doc="logits [sequence_length, batch_size, vocab/tp], target [sequence_length, "
                                "micro_batch_size]; output dtype not stated, not checked")}},
    ops={
        "token_logprobs": Lazy(loader=_token_logprobs),
        "vocab_parallel_token_logprobs": Lazy(loader=_vocab_parallel_token_logprobs),
        "smoothed_token_logprobs": Lazy(loader=_smoothed_token_logprobs),
        "vocab_parallel_smoothed_token_logprobs": Lazy(loader=_vocab_parallel_smoothed_token_logprobs),
    },
    notes={
        "token_logprobs": "-megatron.core.tensor_parallel.vocab_parallel_cross_entropy(logits, labels, 0.0, "
        "tp_group=<world-size-1 gloo group>); fp32 logits are overwritten with the softmax in place; output float32",
        "vocab_parallel_token_logprobs": "-vocab_parallel_cross_entropy(local_logits, labels, 0.0, tp_group=group); "
        "vocab_parallel_token_logprobs@fused: -fusions.fused_cross_entropy.fused_vocab_parallel_cross_entropy(local_logits, "
        "labels, group) (3-D, as its docstring says)",
        "smoothed_token_logprobs": "-vocab_parallel_cross_entropy(logits, labels, α·(V−1)/V, tp_group=<world-size-1 "
        "group>): Megatron spreads its label_smoothing over the V−1 other classes; converted to α over all V",
        "vocab_parallel_smoothed_token_logprobs": "-vocab_parallel_cross_entropy(local_logits, labels, α·(V−1)/V, "
        "tp_group=group), V = the whole vocab (local size × TP)",
    },
)


# ------------------------------------------------------------------------------------ coverage
#: megatron-core's numerics modules: the vocab-parallel cross-entropy and what it calls
#: (``tensor_parallel.utils.VocabUtility``), the fused variant, and the context-parallel loss helpers: the
#: pipeline schedules, whose ``forward_step_calc_loss`` scales the loss by the CP size and the number of
#: micro-batches, and ``finalize_model_grads``, which divides the gradients by the token count all-reduced
#: over DP x CP
NUMERICS_MODULES = ("megatron.core.tensor_parallel.cross_entropy", "megatron.core.tensor_parallel.utils",
                    "megatron.core.fusions.fused_cross_entropy", "megatron.core.pipeline_parallel.schedules",
                    "megatron.core.distributed.finalize_model_grads")

_CE = "megatron.core.tensor_parallel.cross_entropy"
_FUSED = "megatron.core.fusions.fused_cross_entropy"
_SCHED = "megatron.core.pipeline_parallel.schedules"
_TPU = "megatron.core.tensor_parallel.utils"
_FMG = "megatron.core.distributed.finalize_model_grads"
_STEP = ("a step of _VocabParallelCrossEntropy.forward / backward, called by vocab_parallel_cross_entropy (bound as "
         "token_logprobs and vocab_parallel_token_logprobs): checked through it, not on its own")
_FUSED_STEP = ("a step of fused_vocab_parallel_cross_entropy (bound as vocab_parallel_token_logprobs@fused): checked "
               "through it, not on its own")
_SCHEDULE = ("not numerics on its own: pipeline-schedule plumbing (send / receive, activation buffers, micro-batch "
             "order); the loss arithmetic it runs is forward_step_calc_loss")
_LOSS_SCALING = ("no catalog op yet: runs the micro-batches, sums their token counts (total_num_tokens) and hands them "
                 "to finalize_model_grads, which all-reduces them over DP x CP and divides the gradients by them "
                 "(calculate_per_token_loss): the CP / DP mean exists only in the averaged gradients, and no catalog "
                 "op checks a loss through them (cp_masked_mean checks a reduced value; verl's distributed_masked_mean "
                 "is bound to it)")
#: every public function of :data:`NUMERICS_MODULES` that no op binds, with why
NOT_BOUND: dict[str, str] = {
    f"{_CE}.VocabParallelCrossEntropy.calculate_logits_max": _STEP,
    f"{_CE}.VocabParallelCrossEntropy.calculate_predicted_logits": _STEP,
    f"{_CE}.VocabParallelCrossEntropy.calculate_cross_entropy_loss": _STEP,
    f"{_CE}.VocabParallelCrossEntropy.prepare_gradient_calculation_operands": _STEP,
    f"{_CE}.VocabParallelCrossEntropy.calculate_gradients": _STEP,
    f"{_TPU}.VocabUtility.vocab_range_from_per_partition_vocab_size": "called by _VocabParallelCrossEntropy.forward "
    "(bound through vocab_parallel_token_logprobs): the rank's vocab range [rank·V/tp, (rank+1)·V/tp), integer "
    "arithmetic checked through the TP layouts",
    f"{_TPU}.VocabUtility.vocab_range_from_global_vocab_size": "integer vocab range of a rank from the global vocab "
    "size; not called by the cross-entropy path (it uses the per-partition form)",
    f"{_TPU}.split_tensor_along_last_dim": "not numerics: splits a tensor into views along the last dim",
    f"{_TPU}.split_tensor_into_1d_equal_chunks": "not numerics: the rank's slice of a flattened tensor",
    f"{_TPU}.gather_split_1d_tensor": "not numerics: all-gather of 1-D chunks (data movement)",
    f"{_FUSED}.calculate_logits_max": _FUSED_STEP,
    f"{_FUSED}.calculate_predicted_logits": _FUSED_STEP,
    f"{_FUSED}.calculate_cross_entropy_loss": _FUSED_STEP,
    f"{_FUSED}.calculate_gradients": _FUSED_STEP,
    f"{_SCHED}.forward_step_calc_loss": "no catalog op yet: the context-parallel / micro-batch loss scaling (a "
    "2-output loss_func: loss × cp_size / num_microbatches; a 3-output one: loss / clamp(num_tokens, 1) / "
    "num_microbatches unless calculate_per_token_loss, num_tokens being the rank's own count). Its output is the "
    "per-rank loss that DDP's gradient average over DP x CP turns into the CP mean: no catalog op yet checks a "
    "loss through the averaged gradients (cp_masked_mean checks a reduced value; verl's distributed_masked_mean "
    "is bound to it)",
    f"{_SCHED}.forward_step": "runs the model forward and forward_step_calc_loss (justified); no arithmetic of its own",
    f"{_SCHED}.backward_step": "not numerics on its own: torch.autograd.backward on the scaled loss with the "
    "received output gradient",
    f"{_SCHED}.backward_step_multimodule": "not numerics on its own: backward_step for multi-module pipelines",
    f"{_SCHED}.custom_backward": "not numerics on its own: calls the autograd engine directly (skips the "
    "shape check of torch.autograd.backward)",
    f"{_SCHED}.forward_backward_no_pipelining": _LOSS_SCALING,
    f"{_SCHED}.forward_backward_pipelining_with_interleaving": _LOSS_SCALING,
    f"{_SCHED}.forward_backward_pipelining_without_interleaving": _LOSS_SCALING,
    f"{_SCHED}.get_forward_backward_func": "not numerics: picks the schedule function",
    f"{_SCHED}.deallocate_output_tensor": _SCHEDULE,
    f"{_SCHED}.check_first_val_step": _SCHEDULE,
    f"{_SCHED}.clear_embedding_activation_buffer": _SCHEDULE,
    f"{_SCHED}.finish_embedding_wgrad_compute": _SCHEDULE,
    f"{_SCHED}.get_pp_rank_microbatches": _SCHEDULE,
    f"{_SCHED}.get_schedule_table": _SCHEDULE,
    f"{_SCHED}.get_tensor_device": _SCHEDULE,
    f"{_SCHED}.get_tensor_shapes": _SCHEDULE,
    f"{_FMG}.finalize_model_grads": "no catalog op yet: the per-token gradient normalisation (num_tokens broadcast "
    "from the last PP stage, all-reduced over DP x CP, gradients scaled by 1 / clamp(num_tokens, 1)) after the DP "
    "gradient all-reduce; no catalog op yet checks gradients normalised across ranks (cp_masked_mean checks a "
    "reduced value)",
    f"{_FMG}.reset_model_temporary_tensors": "not numerics: zeroes per-step MoE router "
    "temporaries (expert token counts, global aux-loss trackers)",
}

NOT_BOUND.update({
    # ---- found by whole-package discovery, outside NUMERICS_MODULES
    "megatron.core.models.common.language_module.language_module.LanguageModule.compute_language_model_loss":
    "checked by op token_logprobs: calls vocab_parallel_cross_entropy (or fused_vocab_parallel_cross_entropy, "
    "bound as vocab_parallel_token_logprobs@fused; TE's te_parallel_cross_entropy, kernel: needs CUDA) on the model's "
    "output, labels transposed [b, s] -> [s, b]",
    "megatron.training.distillation.cached_logits_loss.topk_kl_div": "not yet bound: Megatron-LM's top-k "
    "distillation KL over cached teacher logits (the catalog has no distillation / forward-KL op yet)",
    "megatron.training.utils.common_utils.average_losses_across_data_parallel_group": "not yet bound: the "
    "pretraining loop's logged loss, a DP all_reduce of per-rank means / world size (a mean of per-rank means, "
    "logged by Megatron-LM's pretrain, which no RL trainer bound here calls)",
})
_MODEL = "model forward: transformer / MoE / attention / SSM layers and their fused kernels, not the RL objective"
_PRETRAIN = ("not numerics of an RL objective: Megatron-LM's pretraining loop (logging, checkpointing, data "
             "iterators, GPU sniff tests); RL trainers drive megatron.core themselves")
#: whole subpackages discovery reads that are not the RL objective; a name above takes precedence
NOT_BOUND_UNDER: dict[str, str] = {
    "megatron.core.transformer.": _MODEL,
    "megatron.core.models.": _MODEL,
    "megatron.core.ssm.": _MODEL,
    "megatron.core.activations": _MODEL,
    "megatron.core.fusions.fused_bias_geglu": _MODEL,
    "megatron.core.fusions.fused_bias_swiglu": _MODEL,
    "megatron.core.fusions.fused_softmax": _MODEL + " (attention softmax)",
    "megatron.core.tensor_parallel.mappings": "model forward: TP / SP communication of activations and gradients "
    "(copy, all_reduce, all_gather, reduce_scatter autograd Functions of the parallel layers)",
    "megatron.core.tensor_parallel.layers": "model forward: column / row parallel linear layers (their backward "
    "all_reduces input gradients)",
    "megatron.core.optimizer.": "optimizer schedule: gradient norms, clipping, zero counting and the distributed "
    "optimizer (outside the RL objective)",
    "megatron.core.distributed.fsdp.": "not numerics of the objective: FSDP parameter / gradient buffers "
    "(all-gather, reduce-scatter of gradients; no catalog op checks gradients across ranks yet)",
    "megatron.core.dist_checkpointing.": "not numerics: distributed checkpoint save / load",
    "megatron.core.inference.": "not in the RL objective: inference-time sampling and log-probs of the generation "
    "engine (a rollout engine's, not the trainer's loss)",
    "megatron.core.datasets.": "not numerics: data scheduling (sequence lengths gathered across ranks)",
    "megatron.core.energy_monitor": "not numerics: GPU energy telemetry",
    "megatron.core.pipeline_parallel.fine_grained_activation_offload": "not numerics: activation offloading",
    "megatron.training.": _PRETRAIN,
}

binding.coverage = Coverage(modules=NUMERICS_MODULES, not_bound=NOT_BOUND, importer=import_megatron,
                            not_bound_under=NOT_BOUND_UNDER)
