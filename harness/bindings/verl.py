"""verl 0.9.1 bound to the op catalog (install: ``install/engines.sh PY verl``).

Every op calls verl's own function with verl's own defaults; the adapters only reshape arguments to
the canonical signatures. Nothing is cloned, upcast or fixed.

==========================  =======================================================================
op                          verl callable (adapter semantics)
==========================  =======================================================================
entropy                     ``verl.utils.torch_functional.entropy_from_logits(logits)``
                            (``logsumexp(x) - Σ softmax(x)·x``, in the input dtype)
token_logprobs              ``torch_functional.logprobs_from_logits(logits, labels)`` with verl's
                            default ``inplace_backward=True`` (the FSDP engine's choice when no
                            entropy is computed). Without flash-attn (this CPU build) verl takes
                            ``logprobs_from_logits_v2``: fp32/fp64 ``x_y - logsumexp(x)`` row by row,
                            bf16/fp16 ``log_softmax`` row by row in the input dtype; the flag only
                            matters on flash-attn's in-place CUDA path.
sum_pi_squared              ``torch_functional.calculate_sum_pi_squared_from_logits(logits)``
                            (``exp(logsumexp(2x) - 2·logsumexp(x))``)
masked_sum / masked_mean    ``torch_functional.masked_sum`` / ``masked_mean`` (``axis=None``);
                            masked_mean divides by ``nnz + 1e-8``
masked_var                  ``torch_functional.masked_var(values, mask, unbiased)`` (raises for nnz 0,
                            and for nnz 1 when unbiased)
agg_loss                    ``verl.trainer.ppo.core_algos.agg_loss`` per micro-batch, as
                            ``verl.workers.utils.losses.ppo_loss`` calls it (see :func:`_agg_loss`)
optimal_token_baseline      ``core_algos.compute_optimal_token_baseline_advantage`` with its defaults
                            (``handle_zero_tail=True``, ``epsilon=1e-8``, no IS weights); ``index``
                            passed as a NumPy array as verl's trainer does
metric_pipeline             the path of ``actor/pg_clipfrac`` (and every ``pg_metrics`` entry):
                            see :func:`_metric_pipeline`
kl_estimator                ``core_algos.kl_penalty(logprob, ref_logprob, name)`` for every name its
                            ``kl_penalty_forward`` accepts (no mask: the worker aggregates afterwards);
                            ``full`` (NotImplementedError) is listed unchecked
value_loss                  ``core_algos.compute_value_loss`` per micro-batch with the mini-batch's
                            normalisers (:func:`_value_loss`); ``critic/vf_clipfrac`` folded as the
                            worker does
importance_ratio            ``rollout_corr_helper.compute_rollout_correction_and_rejection_mask``
                            IS weights, token / sequence TIS (:func:`_importance_ratio`; detached)
rollout_rejection_mask      the same entry point with ``rollout_rs`` (every option, one chain) and its
                            ``rollout_corr/`` metrics (:func:`_rollout_rejection_mask`)
policy_loss                 every entry of ``core_algos.POLICY_LOSS_REGISTRY`` via ``get_policy_loss_fn``
                            (:func:`_policy_loss`), ``loss_agg_mode="token-mean"`` with the
                            mini-batch's ``global_batch_info``; metrics folded as the worker does
outcome_advantage           ``core_algos.ADV_ESTIMATOR_REGISTRY`` read at run time, each estimator called
                            as ``ray_trainer.compute_advantage`` calls it (:func:`_verl_estimator`);
                            names that are other ops or have no reference are listed unchecked
                            (:data:`VERL_UNCHECKED`); ``grpo_vectorized`` / ``rloo_vectorized`` are
                            second implementations (:data:`VERL_SECOND_IMPLEMENTATIONS`): regimes
                            ``grpo+vectorized@…``, ``drgrpo+vectorized@…``, ``rloo+vectorized@…``
gae                         ``core_algos.compute_gae_advantage_return``
masked_whiten               ``torch_functional.masked_whiten(values, mask, shift_mean)``
==========================  =======================================================================

Not bound: verl 0.9.1 has no ``logsumexp``, ``masked_std``, ``masked_min``/``max`` helper.

Older releases are bound by feature detection, never by version number: policy losses get the
OmegaConf actor config ``dp_actor`` passes when there is no ``verl.workers.config`` (< 0.6), "vanilla" is the
unregistered ``compute_policy_loss(cliprange=...)`` when the registry has no "vanilla" (< 0.6), 4-tuple results
become the worker's metrics; without global batch info the legacy workers' ``loss / gradient_accumulation`` is
applied (policy_loss, value_loss, agg_loss: micro-batches averaged); without typed metrics (< 0.8) the metric
pipeline is the float one (:func:`_metric_pipeline_floats`: ``append_to_dict``, the single controller's
``DataProto.concat``, ``reduce_metrics``); without ``AlgoConfig`` (0.4) the estimators get the algorithm
DictConfig; an alternative implementation or op a release lacks is ``unavailable`` with the missing name.

Alternative implementations (:data:`IMPLEMENTATIONS`; regimes ``impl@data``):
``entropy@chunked`` = ``entropy_from_logits_with_chunking`` (engine option of the same name: 2-D input only,
each chunk upcast with ``.float()``, result always float32, as its docstring says), ``token_logprobs@naive``
= ``logprobs_from_logits_naive``, ``token_logprobs@rowwise`` = ``logprobs_from_logits_v2``.

Distributed ops (checked by :mod:`rlconform.distributed_tests` on gloo ranks):

=============================  ====================================================================
op                             verl callable
=============================  ====================================================================
vocab_parallel_token_logprobs  ``verl.utils.megatron.tensor_parallel.vocab_parallel_log_probs_from_logits``
vocab_parallel_entropy         ``tensor_parallel.vocab_parallel_entropy``
vocab_parallel_sum_pi_squared  ``tensor_parallel.vocab_parallel_sum_pi_squared`` (verl PR #6153)
dp_metric_all_reduce           ``actor/pg_clipfrac`` with the real ``allgather_dict_into_dict`` over DP
cp_masked_mean                 ``torch_functional.distributed_masked_mean`` (sum and count all-reduced
                               over the default group; see :func:`_cp_masked_mean`)
=============================  ====================================================================

``fused_linear_token_stats`` = ``experimental.torch_functional.FusedLinearForPPO`` (:func:`_fused_linear`).

``vocab_parallel_entropy@chunked`` = ``tensor_parallel.vocab_parallel_entropy_with_chunking`` (chunk_size
passed through). The vocab-parallel functions take no group: they read Megatron's ``parallel_state`` TP group.
Their adapters carry ``rlconform_parallel_state = True``, so the distributed tests initialise
``megatron.core.parallel_state`` for the layout on every rank and pass its TP group; the adapter checks
that it got exactly that group. verl gathers CP shards (``postprocess_packed_seqs``) before its loss;
its one masked mean over ranks is ``distributed_masked_mean`` (IS-weight batch normalisation), which
reduces over the default group and is checked on the CP layouts as ``cp_masked_mean``.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import math

from rlconform.harness.catalog.binding import AggLoss, Binding, Coverage, Declared, Implementation, Lazy, MetricPipeline
from rlconform.harness.catalog.engine_site import calls

from . import verl_configs
from ._compat import accepted_keywords
from .megatron import cross_entropy_writes_logits
from .verl_remedies import REMEDIES

TF = "verl.utils.torch_functional"
CORE = "verl.trainer.ppo.core_algos"


def _version() -> str | None:
    try:
        return importlib.metadata.version("verl")
    except importlib.metadata.PackageNotFoundError:
        return None


# ---------------------------------------------------------------------------------- token ops
def _token_logprobs(fn):
    def token_logprobs(logits, labels):
        return fn(logits, labels)  # verl's default inplace_backward=True

    token_logprobs.__qualname__ = "verl.token_logprobs"
    return token_logprobs


def _masked_var(fn):
    def masked_var(values, mask, unbiased):
        return fn(values, mask, unbiased=unbiased)

    masked_var.__qualname__ = "verl.masked_var"
    return masked_var


def _two_args(fn, name):
    def op(values, mask):
        return fn(values, mask)

    op.__qualname__ = f"verl.{name}"
    return op


def _optimal_token_baseline(fn):
    import numpy as np
    import torch

    def optimal_token_baseline(rewards, mask, index, old_log_probs, sum_pi_squared):
        # verl's trainer passes `index` as the NumPy array of uids (batch.non_tensor_batch["uid"]).
        if isinstance(index, torch.Tensor):
            index = index.detach().cpu().numpy()
        index = np.asarray(index)
        return fn(rewards, mask, index, old_log_probs, sum_pi_squared)

    optimal_token_baseline.__qualname__ = "verl.optimal_token_baseline"
    return optimal_token_baseline


# ------------------------------------------------------------------------------------ agg_loss
def _agg_loss(agg_loss) -> AggLoss:
    """verl's loss aggregation as its FSDP engine runs it.

    ``verl.workers.utils.losses.ppo_loss`` calls ``agg_loss(loss_mat, response_mask, loss_agg_mode,
    **config.global_batch_info)`` for every micro-batch, with ``dp_size`` = DP world size,
    ``batch_num_tokens`` = the mini-batch's ``loss_mask.sum()`` all-reduced (SUM) over DP
    (``engine/fsdp/transformer_impl.py: forward_backward_batch``), ``global_batch_size`` =
    ``ppo_mini_batch_size * rollout.n`` (``ppo/ray_trainer.py: _update_actor``): every sequence of the
    mini-batch, fully masked ones included, so ``info.global_batch_size`` (not
    ``global_nonempty_seqs``), and ``loss_scale_factor`` = ``actor.loss_scale_factor``.
    The FSDP engine calls ``loss.backward()`` on each micro-batch's loss unscaled (gradient
    accumulation sums) and FSDP averages gradients over DP; the logged ``loss`` is likewise
    ``sum`` over micro-batches then all-reduce ``AVG`` (``engine_workers._postprocess_output``).
    Hence ``micro_combine="sum"``, ``dp_combine="mean"``. (The Megatron engine rescales by
    ``num_microbatches`` for its pipeline schedule; not modelled here.)
    """

    def loss(loss_mat, mask, mode, info):
        # only the keywords this verl's agg_loss accepts (releases before the global batch
        # info have no dp_size / batch_num_tokens / global_batch_size)
        return agg_loss(loss_mat, mask, mode, **accepted_keywords(agg_loss, dict(
            dp_size=info.dp_size, batch_num_tokens=info.global_nnz, global_batch_size=info.global_batch_size,
            loss_scale_factor=info.loss_scale_factor)))

    loss.__qualname__ = "verl.agg_loss"
    # without the global batch info (before 0.7) the legacy actor backpropagates each micro-batch's
    # loss / gradient_accumulation (dp_actor.update_policy): the mean over this rank's micro-batches
    legacy = "dp_size" not in accepted_keywords(agg_loss, {"dp_size": 1}) and _has_legacy_worker("actor")
    return AggLoss(
        loss=loss,
        modes=_agg_modes(agg_loss),
        micro_combine="mean" if legacy else "sum",
        dp_combine="mean",
    )


AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def _agg_modes(agg_loss) -> tuple[str, ...]:
    """The :data:`AGG_MODES` this verl's ``agg_loss`` dispatches on (``token-sum`` is newer than
    0.7), read from its source (``loss_agg_mode == "..."``); all of them when the source cannot be read."""
    from rlconform.harness.catalog.coverage import compared_strings

    try:
        known = set(compared_strings(agg_loss, "loss_agg_mode"))
    except (OSError, TypeError):
        return AGG_MODES
    return tuple(m for m in AGG_MODES if m in known) or AGG_MODES


# ------------------------------------------------------------------------------ metric pipeline
PG_KEY = "actor/pg_clipfrac"


ENGINE_WORKERS = "verl.workers.engine_workers"

#: what :func:`_metric_pipeline` does not run of verl's own code; shown on every finding of the op
METRIC_PIPELINE_TRANSCRIBED = (
    "emit is core_algos.compute_policy_loss_vanilla's metric line, masked_mean(clip indicator, "
    "response_mask).detach().item(), with the case's token values in place of the 0/1 clip indicator (the real "
    "loss cannot carry arbitrary values); the micro-batch fold of engine/utils.postprocess_batch_func "
    "(append_to_dict per micro-batch) and the DP all_gather_object of _postprocess_output "
    "(allgather_dict_into_dict) are simulated in-process; the functions they call are verl's own")


def _stand_in_training_worker(minis, gathers_token_counts=False):
    """A stand-in ``self`` for ``TrainingWorker.train_mini_batch`` (workers/engine_workers.py): one DP rank
    of a DP-1 engine (``get_data_parallel_size`` 1, rank 0, ``is_mp_src_rank_with_outputs`` True, a no-op
    ``train_mode``), a no-op profiler, and ``train_batch`` handing back mini-batch *i*'s DP-gathered metrics
    dict as its output's ``metrics`` (what ``_postprocess_output`` returns). The data is a TensorDict of the
    mini-batch indices, ``mini_batch_size`` 1, unshuffled (``dataloader_kwargs={"shuffle": False}``), so
    ``train_mini_batch`` runs its real mini-batch loop and its real fold over them."""
    import contextlib
    import types

    import torch
    from verl.utils import tensordict_utils as tu

    def train_batch(mini_batch_td):
        index = int(mini_batch_td["rlconform_mini_batch"][0])
        return tu.get_tensordict(tensor_dict={}, non_tensor_dict={"metrics": dict(minis[index])})

    engine = types.SimpleNamespace(
        train_mode=lambda disable_auto_offload=False: contextlib.nullcontext(), get_data_parallel_size=lambda: 1,
        get_data_parallel_rank=lambda: 0, is_mp_src_rank_with_outputs=lambda: True,
        get_data_parallel_group=_this_rank_group)
    worker = types.SimpleNamespace(engine=engine, train_batch=train_batch,
                                   profiler=types.SimpleNamespace(step=lambda: None))
    tensors = {"rlconform_mini_batch": torch.arange(len(minis))}
    if gathers_token_counts:
        # verl 0.7's loop all-gathers each mini-batch's token counts (input_ids.offsets()) over the DP
        # group before train_batch, unconditionally: one token per row, a DP group of one (see _one_rank_group)
        tensors["input_ids"] = torch.nested.as_nested_tensor([torch.zeros(1, dtype=torch.long)] * len(minis),
                                                             layout=torch.jagged)
    data = tu.get_tensordict(tensor_dict=tensors,
                             non_tensor_dict={"mini_batch_size": 1, "dataloader_kwargs": {"shuffle": False}})
    return worker, data


def _gathers_token_counts() -> bool:
    """Whether this verl's ``TrainingWorker.train_mini_batch`` reads ``mini_batch_td["input_ids"]`` and all-gathers
    the token counts whether or not the batch has ``input_ids`` (verl 0.7; from 0.8 it checks
    ``"input_ids" in mini_batch_td`` first), read from the installed source."""
    from .source import module_file

    try:
        text = module_file(ENGINE_WORKERS).read_text()
    except OSError:
        return False
    return 'mini_batch_td["input_ids"]' in text and '"input_ids" in mini_batch_td' not in text


#: the ``Metric`` classmethods verl's ``TrainingWorker.train_mini_batch`` has folded each gathered list of the DP
#: ranks' metrics with: ``aggregate_dp`` (0.8 on: per micro-batch index over ranks, then over micro-batches) and
#: ``chain`` (commits of early 2026 between releases: one list of every rank's micro-batch values)
DP_FOLDS = ("aggregate_dp", "chain")


def _dp_fold(metric_class):
    """The method of ``metric_class`` (verl's ``Metric``) that the installed ``TrainingWorker.train_mini_batch``
    calls on the DP ranks' gathered metrics: the one :data:`DP_FOLDS` name its code calls, read from the engine's
    source (a fork between releases has ``Metric`` without a sibling method). Raises ``AttributeError`` naming
    the method when ``Metric`` lacks the one the worker calls, or when the worker calls none of them."""
    from .source import _code_names, engine_function

    names = _code_names(engine_function(ENGINE_WORKERS, "TrainingWorker.train_mini_batch").__code__)
    for name in DP_FOLDS:
        if name in names:
            if not hasattr(metric_class, name):
                raise AttributeError(f"TrainingWorker.train_mini_batch calls Metric.{name}, which "
                                     f"verl.utils.metric.Metric lacks")
            return getattr(metric_class, name)
    raise AttributeError("TrainingWorker.train_mini_batch calls none of " +
                         ", ".join(f"Metric.{n}" for n in DP_FOLDS) + " on the DP ranks' metrics")


_RANK_GROUPS: dict[int, object] = {}


def _this_rank_group():
    """The stand-in engine's DP group (one DP rank of a DP-1 job): None (the default group) when there is none or
    it has one rank, else a group of this rank alone (``use_local_synchronization``: no other rank takes part).
    On real gloo DP ranks (``dp_metric_all_reduce``) verl 0.7's token-count gather over the default group would
    otherwise fill a one-element list from every rank (IndexError in ``all_gather_object``)."""
    import os

    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() == 1:
        return None
    group = _RANK_GROUPS.get(os.getpid())
    if group is None:
        group = dist.new_group(ranks=[dist.get_rank()], backend="gloo", use_local_synchronization=True)
        _RANK_GROUPS[os.getpid()] = group
    return group


@contextlib.contextmanager
def _one_rank_group(needed: bool):
    """A default process group of one rank (gloo over an in-memory store) while the block runs, when ``needed``
    and no group exists (verl 0.7's ``train_mini_batch`` all-gathers token counts: the stand-in engine is one
    DP rank of a DP-1 job, whose gather returns the rank's own list); destroyed afterwards."""
    import torch.distributed as dist

    if not needed or not dist.is_available() or dist.is_initialized():
        yield
        return
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _metric_pipeline() -> MetricPipeline:
    """verl's path for a token-level metric reduced inside the loss: ``actor/pg_clipfrac``.

    * emit (per micro-batch): ``core_algos.compute_policy_loss_vanilla`` computes
      ``verl_F.masked_mean(token_values, response_mask)`` and logs ``.detach().item()``;
      ``losses.ppo_loss`` wraps ``pg_metrics`` with ``Metric.from_dict(..., AggregationType.MEAN)``.
      The harness's token values take the place of the clip indicator (transcribed: see
      :data:`METRIC_PIPELINE_TRANSCRIBED`).
    * reduce_micro: ``engine/utils.postprocess_batch_func`` folds the micro-batches with
      ``verl.utils.py_functional.append_to_dict`` (one ``Metric`` holding one value per micro-batch).
    * reduce_dp: ``engine_workers._postprocess_output`` calls ``allgather_dict_into_dict`` over the DP
      group (``all_gather_object``: every rank gets ``{key: [rank0 value, rank1 value, ...]}`` in rank
      order; simulated in-process by collecting the ranks' dicts in rank order, which is exactly what
      the gather returns).
    * reduce_mini: ``TrainingWorker.train_mini_batch`` (workers/engine_workers.py), the real method, compiled
      from the installed source by :func:`.source.engine_function` (the module does not import without
      ``uvicorn``), on :func:`_stand_in_training_worker`: it applies ``Metric.aggregate_dp`` to each gathered
      list (``Metric.chain`` on commits of early 2026: :func:`_dp_fold`) (MEAN: mean over ranks per micro-batch index, then mean over micro-batches; it raises when ranks
      hold different numbers of micro-batches: verl's ``prepare_micro_batches(same_micro_num_in_dp=True)``
      makes the counts equal) and appends each mini-batch's floats with ``append_to_dict``.
    * finalize: ``ray_trainer._update_actor`` applies ``rename_dict(metrics, "actor/")`` and
      ``ray_trainer.fit`` applies ``verl.utils.metric.reduce_metrics`` (np.mean, or np.max / np.min
      when the key contains "max" / "min").

    A verl without typed metrics (no ``verl.utils.metric.Metric``: before 0.8) logs plain floats instead:
    :func:`_metric_pipeline_floats`.

    Raises ``ModuleNotFoundError`` / ``AttributeError`` when the installed verl lacks one of these (a binding
    error of this op).
    """
    from verl.utils import metric as verl_metric

    if not _typed_metrics(verl_metric):
        return _metric_pipeline_floats()

    import verl.utils.torch_functional as verl_F
    from verl.utils import tensordict_utils as tu
    from verl.utils.metric import AggregationType, Metric, reduce_metrics
    from verl.utils.py_functional import append_to_dict, rename_dict

    from .source import engine_function

    train_mini_batch = engine_function(ENGINE_WORKERS, "TrainingWorker.train_mini_batch")
    gathers_token_counts = _gathers_token_counts()

    def emit(values, mask):
        pg_metrics = {PG_KEY: verl_F.masked_mean(values, mask).detach().item()}
        return Metric.from_dict(pg_metrics, aggregation=AggregationType.MEAN)

    def reduce_micro(micro_dicts):
        aggregated = {}
        for metrics in micro_dicts:
            append_to_dict(aggregated, metrics)
        return aggregated

    def reduce_dp(rank_dicts):
        # allgather_dict_into_dict, in-process: {key: [value of rank 0, value of rank 1, ...]}
        gathered = {}
        for rank_metrics in rank_dicts:
            for key, val in rank_metrics.items():
                gathered.setdefault(key, []).append(val)
        return gathered

    @calls(_dp_fold(Metric))
    def reduce_mini(mini_dicts):
        worker, data = _stand_in_training_worker(list(mini_dicts), gathers_token_counts)
        with _one_rank_group(gathers_token_counts):
            return dict(tu.get(train_mini_batch(worker, data), "metrics"))

    def finalize(metrics):
        return reduce_metrics(rename_dict(metrics, "actor/"))

    return MetricPipeline(
        emit=emit,
        reduce_micro=reduce_micro,
        reduce_dp=reduce_dp,
        reduce_mini=reduce_mini,
        finalize=finalize,
        stats={"mean": PG_KEY},
        emitted_to_final={PG_KEY: PG_KEY},
        equal_micro_batches_per_rank=True,  # prepare_micro_batches(same_micro_num_in_dp=True)
        transcribed=METRIC_PIPELINE_TRANSCRIBED,
    )


def _typed_metrics(verl_metric) -> bool:
    """Whether this verl logs typed metrics (``verl.utils.metric.Metric`` / ``AggregationType``, folded by
    ``Metric.aggregate_dp``: verl >= 0.8) or plain floats folded by ``reduce_metrics`` (before)."""
    return hasattr(verl_metric, "Metric") and hasattr(verl_metric, "AggregationType")


#: what :func:`_metric_pipeline_floats` does not run of verl's own code
METRIC_PIPELINE_FLOATS_TRANSCRIBED = (
    "emit is the actor's metric line (dp_actor.update_policy: 'actor/pg_clipfrac': pg_clipfrac.detach().item(), "
    "pg_clipfrac = masked_mean(clip indicator, response_mask)) with the case's token values in place of the 0/1 "
    "clip indicator; update_policy's micro- and mini-batch loop (append_to_dict of each micro-batch's floats into "
    "one dict) and the single controller's collection of the DP ranks' outputs (collect_dp_compute_data_proto) "
    "are simulated in-process; the functions they call (masked_mean, append_to_dict, DataProto.concat, "
    "reduce_metrics) are verl's own")


def _metric_pipeline_floats() -> MetricPipeline:
    """``actor/pg_clipfrac`` on a verl without typed metrics (before 0.8):

    * emit (per micro-batch): ``dp_actor.update_policy`` logs ``pg_clipfrac.detach().item()`` with
      ``pg_clipfrac = verl_F.masked_mean(indicator, response_mask)``;
    * reduce_micro: ``append_to_dict(metrics, micro_batch_metrics)`` for every micro-batch into the rank's one
      dict of lists;
    * reduce_dp: nothing yet: each rank keeps its dict until ``update_policy`` returns (the DP ranks' metrics
      are collected once, after the last mini-batch), so the ranks' dicts of one mini-batch are handed on;
    * reduce_mini: ``update_policy``'s ``metrics`` dict accumulates every mini-batch's micro-batches on its rank
      (``append_to_dict`` again); each rank's worker returns ``DataProto(meta_info={"metrics": metrics})`` and
      the single controller collects them with ``DataProto.concat`` (``collect_dp_compute_data_proto``):
      verl <= 0.5 keeps the *first* rank's ``meta_info`` ("The meta_info is assumed to be identical and will use
      the first one"), 0.6 and 0.7 merge the ranks' metrics into ``{key: [rank 0's list, rank 1's list, ...]}``;
    * finalize: ``ray_trainer.fit`` applies ``reduce_metrics`` (np.mean; np.max / np.min for "max" / "min" keys).

    Every DP rank holds the same number of micro-batches (``equal_micro_batches_per_rank``): with fixed-size
    micro-batches each rank splits the same number of rows, and with ``use_dynamic_bsz``
    ``seqlen_balancing.rearrange_micro_batches(same_micro_num_in_dp=True)`` (the default since 0.4) all-reduces
    the count with MAX over the DP ranks. Unequal counts would hand 0.6's merged metrics a ragged list that
    ``np.mean`` rejects, which the trainer never does.
    """
    import verl.utils.torch_functional as verl_F
    from verl.protocol import DataProto
    from verl.utils.metric import reduce_metrics
    from verl.utils.py_functional import append_to_dict

    def emit(values, mask):
        return {PG_KEY: verl_F.masked_mean(values, mask).detach().item()}

    def reduce_micro(micro_dicts):
        aggregated: dict = {}
        for metrics in micro_dicts:
            append_to_dict(aggregated, metrics)
        return aggregated

    def reduce_dp(rank_dicts):
        return list(rank_dicts)  # collected after the last mini-batch (reduce_mini)

    @calls(DataProto.concat)
    def reduce_mini(minis):
        per_rank: list[dict] = []
        for rank_dicts in minis:
            for rank, metrics in enumerate(rank_dicts):
                if rank == len(per_rank):
                    per_rank.append({})
                for key, values in metrics.items():  # update_policy's append_to_dict, one value per micro-batch
                    for value in values:
                        append_to_dict(per_rank[rank], {key: value})
        return dict(DataProto.concat([DataProto(meta_info={"metrics": m}) for m in per_rank]).meta_info["metrics"])

    def finalize(metrics):
        return reduce_metrics(dict(metrics))

    return MetricPipeline(emit=emit, reduce_micro=reduce_micro, reduce_dp=reduce_dp, reduce_mini=reduce_mini,
                          finalize=finalize, stats={"mean": PG_KEY}, emitted_to_final={PG_KEY: PG_KEY},
                          equal_micro_batches_per_rank=True, transcribed=METRIC_PIPELINE_FLOATS_TRANSCRIBED)


# ------------------------------------------------------------------------------ metric statistics
#: catalog statistic -> (verl metric key, AggregationType member). After ``Metric.aggregate_dp`` the values
#: are floats that ``reduce_metrics`` folds over mini-batches by key *name* ("max" / "min" in the key:
#: np.max / np.min, else np.mean), so only the MIN / MAX keys hold "min" / "max".
VERL_STATISTICS = {
    "mean": ("actor/x/mean", "MEAN"), "min": ("actor/x/min", "MIN"), "max": ("actor/x/max", "MAX"),
    "sum": ("actor/x/sum", "SUM"), "count": ("actor/x/num_tokens", "SUM"),
    "len_mean": ("actor/response_length/mean", "MEAN"), "len_min": ("actor/response_length/min", "MIN"),
    "len_max": ("actor/response_length/max", "MAX"), "n_seq": ("actor/response_length/num_seqs", "SUM"),
}


def _metric_statistics() -> MetricPipeline:
    """Every ``AggregationType`` of verl's typed metrics (MEAN, SUM, MIN, MAX) through the worker's
    reducer: :func:`_metric_pipeline`'s chain (``append_to_dict`` over micro-batches, the DP gather and
    ``Metric.aggregate_dp``, ``append_to_dict`` over mini-batches, ``rename_dict`` + ``reduce_metrics``).

    * emit (per micro-batch, plain numbers; ``wrap`` builds ``Metric(aggregation, value)`` from each, as
      ``losses.ppo_loss`` does): the token mean as ``core_algos`` logs it
      (``verl_F.masked_mean(...).detach().item()``); min / max by
      ``verl.trainer.distillation.losses.compute_distillation_loss_range`` (``values[mask].min() / .max()``:
      it raises on a micro-batch without tokens, which then logs ±inf, the identities of min / max); sum
      (``verl_F.masked_sum``), token count and number of sequences as SUM metrics **times the DP size**: verl's
      SUM is "sum over micro-batches, mean over DP ranks" (``aggregate_dp``), built for losses that carry the
      DP factor (``agg_loss(..., dp_size)``; ``losses.ppo_loss`` picks SUM when ``dp_size > 1``), so a value
      logged with SUM must carry it too; sequence lengths as ``metric_utils._compute_response_info`` computes
      them (``response_mask.sum(-1).float()``) with their mean / min / max ``.item()``.
    * the value type of the case reaches ``Metric.append`` (which turns a 0-d tensor into ``.item()`` and
      rejects anything not int / float / Tensor / ndarray).
    """
    import torch
    import verl.utils.torch_functional as verl_F
    from verl.utils.metric import AggregationType, Metric

    try:  # a release without the distillation trainer still checks every other statistic
        from verl.trainer.distillation.losses import compute_distillation_loss_range
    except ImportError as exc:
        compute_distillation_loss_range, no_range = None, f"{type(exc).__name__}: {exc}"
    pipe = _metric_pipeline()
    aggregation = {key: AggregationType[agg] for key, agg in VERL_STATISTICS.values()}
    k = {stat: key for stat, (key, _) in VERL_STATISTICS.items()}
    stats = dict(k) if compute_distillation_loss_range is not None else {
        stat: key for stat, key in k.items() if stat not in ("min", "max")}

    def emit(values, mask, info):
        dp = info["dp_size"]
        response_mask = mask.bool()
        out = {k["mean"]: verl_F.masked_mean(values, response_mask).detach().item()}
        if compute_distillation_loss_range is None:
            pass  # not in this release: the token min / max are not emitted (nor checked)
        elif bool(response_mask.any()):
            rng = compute_distillation_loss_range(values, response_mask)
            out[k["min"]] = rng["distillation/loss_min"].values[0]
            out[k["max"]] = rng["distillation/loss_max"].values[0]
        else:
            out[k["min"]], out[k["max"]] = math.inf, -math.inf
        out[k["sum"]] = verl_F.masked_sum(values, response_mask).detach().item() * dp
        out[k["count"]] = int(response_mask.sum().item()) * dp
        response_length = response_mask.sum(-1).float()
        out[k["len_mean"]] = torch.mean(response_length).detach().item()
        out[k["len_min"]] = torch.min(response_length).detach().item()
        out[k["len_max"]] = torch.max(response_length).detach().item()
        out[k["n_seq"]] = int(response_mask.shape[0]) * dp
        return out

    def wrap(key, value):
        return Metric(aggregation=aggregation[key], value=value)

    return MetricPipeline(
        emit=emit, reduce_micro=pipe.reduce_micro, reduce_dp=pipe.reduce_dp, reduce_mini=pipe.reduce_mini,
        finalize=pipe.finalize, stats=stats, equal_micro_batches_per_rank=True, wrap=wrap,
        transcribed=None if compute_distillation_loss_range is not None else
        f"the token min / max are not checked: this verl has no compute_distillation_loss_range ({no_range})")


# ------------------------------------------------------------------------ KL and policy losses
#: verl's spellings of the KL estimators (``kl_penalty_forward``'s branches; each also with "+")
KL_NAMES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
#: names ``kl_penalty`` knows that are not checked, with why
KL_UNCHECKED = {"full": "raises NotImplementedError in verl 0.9.1 (kl_penalty_forward)",
                "full+": "raises NotImplementedError in verl 0.9.1 (kl_penalty_forward)"}


def _kl_estimator():
    """``core_algos.kl_penalty`` for each name (straight-through ``+`` modes included): Variants."""
    from verl.trainer.ppo import core_algos

    from rlconform.harness.catalog.binding import Variants

    def bind(name):
        def kl(logprob, ref_logprob, mask):
            return core_algos.kl_penalty(logprob, ref_logprob, name)  # verl's estimator takes no mask

        kl.__qualname__ = f"verl.kl_penalty[{name}]"
        return calls(core_algos.kl_penalty)(kl)

    import inspect

    try:  # the straight-through "+" modes are newer than verl 0.5 (kl_penalty strips the suffix)
        straight_through = 'endswith("+")' in inspect.getsource(core_algos.kl_penalty)
    except (OSError, TypeError):
        straight_through = True
    names = KL_NAMES + (tuple(n + "+" for n in KL_NAMES) if straight_through else ())
    return Variants({n: bind(n) for n in names}, unchecked=dict(KL_UNCHECKED))


#: verl registry name -> catalog variant (rlconform.harness.families.policy_loss.VARIANTS)
POLICY_LOSS_NAMES = {name: name for name in ("vanilla", "gspo", "sapo", "gpg", "clip_cov", "kl_cov", "geo_mean",
                                             "dro", "cispo", "dppo_tv", "dppo_kl")}
POLICY_LOSS_UNCHECKED = {
    "bypass_mode": "with the default rollout_correction (loss_type='ppo_clip', rollout_rs=None) the vanilla loss "
    "(bound as 'vanilla'); its rejection sampling and rollout_corr/* metrics have no reference",
}
#: the loss_agg_mode verl forces per policy loss (``compute_policy_loss_sapo``, core_algos.py:1688)
SAPO_AGG_MODES = {"sapo": "seq-mean-token-mean"}
#: verl metric key (after stripping 'actor/') -> catalog key, per registry name when it differs
_METRIC_KEYS = {"pg_clipfrac": "pg_clipfrac", "ppo_kl": "ppo_kl", "pg_clipfrac_lower": "pg_clipfrac_lower"}


#: catalog statistic of op batch_metrics -> verl's key (``metric_utils.compute_data_metrics``)
BATCH_METRIC_KEYS = {
    **{f"score_{s}": f"critic/score/{s}" for s in ("mean", "max", "min")},
    **{f"reward_{s}": f"critic/rewards/{s}" for s in ("mean", "max", "min")},
    **{f"advantages_{s}": f"critic/advantages/{s}" for s in ("mean", "max", "min")},
    **{f"returns_{s}": f"critic/returns/{s}" for s in ("mean", "max", "min")},
    **{f"response_length_{s}": f"response_length/{s}" for s in ("mean", "max", "min", "clip_ratio")},
    **{f"non_aborted_length_{s}": f"response_length_non_aborted/{s}" for s in ("mean", "max", "min", "clip_ratio")},
    "aborted_ratio": "response/aborted_ratio",
    **{f"prompt_length_{s}": f"prompt_length/{s}" for s in ("mean", "max", "min", "clip_ratio")},
    **{f"values_{s}": f"critic/values/{s}" for s in ("mean", "max", "min")},
    "vf_explained_var": "critic/vf_explained_var",
}


def _batch_metrics():
    """``metric_utils.compute_data_metrics(batch, use_critic)`` on the trainer's batch (a ``DataProto`` of the case's
    tensors, as ``RayPPOTrainer.fit`` hands it after the update): variant ``actor`` with ``use_critic=False``,
    ``critic`` with ``use_critic=True``; verl's keys of the catalog's statistics renamed to the catalog's names
    (:data:`BATCH_METRIC_KEYS`; one missing is the op's ``lost metric``). Not compared: ``num_turns/*`` and
    ``tool_call_counts/*``, computed from non-tensor fields (``__num_turns__``, ``tool_call_counts``) the check's batch
    does not hold (listed in the binding's notes)."""
    from verl import DataProto
    from verl.trainer.ppo.metric_utils import compute_data_metrics

    from rlconform.harness.catalog.binding import Variants

    def bind(use_critic):
        @calls(compute_data_metrics)
        def batch_metrics(batch):
            metrics = compute_data_metrics(DataProto.from_dict(tensors=dict(batch)), use_critic=use_critic)
            return {stat: metrics[key] for stat, key in BATCH_METRIC_KEYS.items() if key in metrics}

        batch_metrics.__qualname__ = f"verl.compute_data_metrics[use_critic={use_critic}]"
        return batch_metrics

    return Variants({"actor": bind(False), "critic": bind(True)})


@functools.cache
def _policy_step():
    """verl's trainer step from the batch to the gradient: :mod:`.verl_step` (built once: both step ops use it)."""
    from .verl_step import policy_step

    return policy_step(_one_rank_group, ACTOR_CONFIG, POLICY_LOSS_CONFIG)


def _policy_loss():
    """Every loss of ``core_algos.POLICY_LOSS_REGISTRY`` (read at run time): bound to its catalog variant,
    or listed unchecked (a fork's new entry shows up unchecked).

    Config: one ``ActorConfig`` per variant with the catalog's parameters (clip 0.2/0.2, clip_ratio_c 3,
    τ 1.0/1.05, ``PolicyLossConfig(dro_beta=0.5, clip_cov_ratio=1.0, clip_cov_lb=1, clip_cov_ub=5,
    kl_cov_ratio=0.2, ppo_kl_coef=1.0)``); each call sets ``config.global_batch_info`` as
    ``losses.ppo_loss`` gets it (dp_size 1, batch_num_tokens = the mini-batch's valid tokens,
    global_batch_size = its rows) and passes ``loss_agg_mode="token-mean"``. Metric keys lose their
    ``actor/`` prefix (kl_cov's ``actor/ppo_kl`` is mean |Δ|: catalog ``ppo_kl_abs``). Micro-batch
    metrics are folded as the FSDP worker does (:func:`_metric_pipeline`'s chain: ``Metric(MEAN)`` per
    micro-batch, ``append_to_dict``, ``Metric.aggregate_dp``, ``reduce_metrics``): a mean of
    micro-batch means.
    """
    from verl.trainer.ppo import core_algos
    from verl.utils import metric as verl_metric

    from rlconform.harness.catalog.binding import LossVariants

    config = _actor_config()
    legacy_actor = _has_legacy_worker("actor")

    def bind(name, fn=None, worker_vanilla=False):
        fn = fn or core_algos.get_policy_loss_fn(name)
        cfg = config()
        keys = dict(_METRIC_KEYS, ppo_kl="ppo_kl_abs") if name == "kl_cov" else _METRIC_KEYS

        def loss(old_log_prob, log_prob, advantages, response_mask, info):
            global_info = hasattr(cfg, "global_batch_info")  # verl >= 0.7
            if global_info:
                cfg.global_batch_info.update(dp_size=info.dp_size, batch_num_tokens=info.global_nnz,
                                             global_batch_size=info.global_batch_size, loss_scale_factor=None)
            if worker_vanilla:  # verl < 0.6: the worker calls the unregistered compute_policy_loss for "vanilla"
                result = fn(old_log_prob=old_log_prob, log_prob=log_prob, advantages=advantages,
                            response_mask=response_mask, **accepted_keywords(fn, dict(
                                cliprange=cfg.clip_ratio, cliprange_low=cfg.clip_ratio_low,
                                cliprange_high=cfg.clip_ratio_high, clip_ratio_c=cfg.clip_ratio_c,
                                loss_agg_mode="token-mean")))
            else:
                result = fn(old_log_prob=old_log_prob, log_prob=log_prob, advantages=advantages,
                            response_mask=response_mask, **accepted_keywords(fn, dict(
                                loss_agg_mode="token-mean", config=cfg)))
            value, metrics = _policy_loss_result(result)
            if not global_info and legacy_actor:
                # no global batch info: dp_actor.update_policy backpropagates policy_loss / gradient_accumulation
                # (ppo_mini_batch_size // ppo_micro_batch_size_per_gpu: this rank's micro-batches)
                value = value / info.num_micro_batches
            out = {}
            for k, v in metrics.items():
                short = k.removeprefix("actor/")
                out[keys.get(short, short)] = v
            return value, out

        loss.__qualname__ = f"verl.policy_loss[{name}]"
        return loss

    if _typed_metrics(verl_metric):  # verl >= 0.8: typed metrics folded by the worker's chain
        Metric, AggregationType = verl_metric.Metric, verl_metric.AggregationType

        @calls(_dp_fold(Metric))
        def combine_metrics(parts):
            pipe = _metric_pipeline()
            micro = [Metric.from_dict(dict(m), aggregation=AggregationType.MEAN) for m, _ in parts]
            final = pipe.finalize(pipe.reduce_mini([pipe.reduce_dp([pipe.reduce_micro(micro)])]))
            return {k.removeprefix("actor/"): v for k, v in final.items()}
    else:  # older verl: dp_actor.update_policy appends each micro-batch's floats, reduce_metrics folds
        from verl.utils.py_functional import append_to_dict

        @calls(verl_metric.reduce_metrics)
        def combine_metrics(parts):
            gathered: dict = {}
            for m, _ in parts:
                append_to_dict(gathered, dict(m))
            return dict(verl_metric.reduce_metrics(gathered))

    impls, unchecked = {}, {}
    for name in sorted(core_algos.POLICY_LOSS_REGISTRY):
        if name in POLICY_LOSS_NAMES:
            impls[POLICY_LOSS_NAMES[name]] = bind(name)
        else:
            unchecked[name] = POLICY_LOSS_UNCHECKED.get(name, "registered in verl; no catalog variant")
    if "vanilla" not in core_algos.POLICY_LOSS_REGISTRY and hasattr(core_algos, "compute_policy_loss"):
        # before "vanilla" was registered the actor called compute_policy_loss(..., cliprange=...)
        # for loss_mode "vanilla" (dp_actor.update_policy)
        impls["vanilla"] = bind("vanilla", core_algos.compute_policy_loss, worker_vanilla=True)
    # compute_policy_loss_sapo ignores the loss_agg_mode it is passed: "for SAPO, we need to aggregate the loss
    # at the sequence level (seq-mean-token-mean)", agg_loss(..., loss_agg_mode="seq-mean-token-mean",
    # **config.global_batch_info) (verl/trainer/ppo/core_algos.py:1688): a declared convention, checked as such
    # every loss is called with loss_agg_mode="token-mean" (bind's loss above), SAPO's forced mode aside
    return LossVariants(impls, unchecked=unchecked, combine_metrics=combine_metrics, agg_modes=SAPO_AGG_MODES,
                        calls_agg_mode="token-mean")


#: the actor configuration the catalog's policy losses are checked with (:func:`_policy_loss`)
ACTOR_CONFIG = dict(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, clip_ratio=0.2, clip_ratio_low=0.2,
                    clip_ratio_high=0.2, clip_ratio_c=3.0, tau_pos=1.0, tau_neg=1.05, loss_agg_mode="token-mean")
POLICY_LOSS_CONFIG = dict(loss_mode="vanilla", dro_beta=0.5, clip_cov_ratio=1.0, clip_cov_lb=1.0, clip_cov_ub=5.0,
                          kl_cov_ratio=0.2, ppo_kl_coef=1.0)


def _actor_config():
    """A zero-argument builder of the actor config this verl's policy losses read: the
    ``verl.workers.config.actor.ActorConfig`` dataclass with only the fields it has (tau_pos / tau_neg,
    dro_beta... are newer), or, on a verl without typed worker configs (before 0.6), the OmegaConf
    ``DictConfig`` of ``actor_rollout_ref.actor`` that ``dp_actor`` hands them (``config=self.config``; the
    losses read ``config.clip_ratio*`` and ``config.policy_loss.*``)."""
    try:
        from verl.workers.config.actor import ActorConfig, PolicyLossConfig
    except ImportError:
        from omegaconf import OmegaConf

        return lambda: OmegaConf.create(dict(ACTOR_CONFIG, policy_loss=dict(POLICY_LOSS_CONFIG)))

    def config():
        actor = {k: v for k, v in ACTOR_CONFIG.items() if k not in ("clip_ratio", "loss_agg_mode")}
        return ActorConfig(**accepted_keywords(ActorConfig, dict(
            actor, policy_loss=PolicyLossConfig(**accepted_keywords(PolicyLossConfig, {
                k: v for k, v in POLICY_LOSS_CONFIG.items() if k != "loss_mode"})))))

    return config


def _has_legacy_worker(kind: str) -> bool:
    """Whether this verl ships the legacy FSDP ``kind`` worker (``verl/workers/<kind>/dp_<kind>.py``: verl <= 0.7),
    read from the package's files without importing it (its import pulls in the model stack)."""
    import importlib.util
    import os

    spec = importlib.util.find_spec("verl")
    roots = list(spec.submodule_search_locations or ()) if spec is not None else []
    return any(os.path.exists(os.path.join(root, "workers", kind, f"dp_{kind}.py")) for root in roots)


def _policy_loss_result(result):
    """(loss, metrics dict) of a policy loss: verl >= 0.6 returns ``(pg_loss, pg_metrics)``; before, the
    losses returned ``(pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower)``, which ``dp_actor`` logs as
    ``actor/pg_clipfrac``, ``actor/ppo_kl``, ``actor/pg_clipfrac_lower`` (``.detach().item()``)."""
    if len(result) == 2 and isinstance(result[1], dict):
        return result
    value, clipfrac, ppo_kl, clipfrac_lower = result
    return value, {"actor/pg_clipfrac": clipfrac.detach().item(), "actor/ppo_kl": ppo_kl.detach().item(),
                   "actor/pg_clipfrac_lower": clipfrac_lower.detach().item()}


# ---------------------------------------------------------------------- value loss, IS weights
def _value_loss():
    """``core_algos.compute_value_loss`` as ``verl.workers.utils.losses.value_loss`` calls it, per micro-batch:
    ``loss_agg_mode`` = the catalog variant, ``cliprange_value`` = 0.2 (the catalog's; verl's
    ``CriticConfig`` default is 0.5), ``dp_size`` / ``batch_num_tokens`` / ``global_batch_size`` from the
    mini-batch (every sequence, empty ones included, as for the actor), ``loss_scale_factor`` =
    ``info.loss_scale_factor``. Micro-batch losses are summed (FSDP gradient accumulation).
    ``critic/vf_clipfrac`` is a plain float per micro-batch, folded as every worker metric
    (``append_to_dict`` -> allgather -> ``reduce_metrics``: a mean of micro-batch means).
    ``unclipped`` is not provided: ``compute_value_loss`` always clips (``clip_by_value``)."""
    from verl.trainer.ppo import core_algos

    from rlconform.harness.catalog.binding import LossVariants
    from rlconform.harness.families.value_loss import CLIPRANGE_VALUE, VARIANTS

    fn = core_algos.compute_value_loss
    # a compute_value_loss without the global batch info (before 0.9) aggregates per micro-batch;
    # the legacy critic (workers/critic/dp_critic.py, verl <= 0.7) then backpropagates vf_loss /
    # gradient_accumulation (this rank's micro-batches), the engine worker's value_loss the unscaled vf_loss
    scale_by_micro_batches = "dp_size" not in accepted_keywords(fn, {"dp_size": 1}) and _has_legacy_worker("critic")

    def bind(mode):
        def value_loss(vpreds, values, returns, response_mask, info):
            # only the keywords this verl accepts (no global batch info before 0.9)
            loss, clipfrac = fn(vpreds=vpreds, returns=returns, values=values, response_mask=response_mask,
                                cliprange_value=CLIPRANGE_VALUE, loss_agg_mode=mode, **accepted_keywords(fn, dict(
                                    dp_size=info.dp_size, batch_num_tokens=info.global_nnz,
                                    global_batch_size=info.global_batch_size,
                                    loss_scale_factor=info.loss_scale_factor)))
            if scale_by_micro_batches:
                loss = loss / info.num_micro_batches
            return loss, {"vf_clipfrac": clipfrac.detach().item()}

        value_loss.__qualname__ = f"verl.compute_value_loss[{mode}]"
        return value_loss

    from verl.utils import metric as verl_metric

    @calls(verl_metric.reduce_metrics)  # vf_clipfrac is a plain float: reduce_metrics' np.mean over micro-batches
    def combine_metrics(parts):
        pipe = _metric_pipeline()  # the typed or the float pipeline, whichever this verl has
        micro = [dict(m) for m, _ in parts]
        final = pipe.finalize(pipe.reduce_mini([pipe.reduce_dp([pipe.reduce_micro(micro)])]))
        return {k.removeprefix("actor/"): v for k, v in final.items()}  # the pipeline's rename_dict

    modes = _agg_modes(core_algos.agg_loss)
    impls = {v: bind(mode) for v, (eps, mode) in VARIANTS.items() if eps is not None and mode in modes}
    return LossVariants(impls, combine_metrics=combine_metrics)


#: catalog variant of ``importance_ratio`` -> (verl ``rollout_is``, ``rollout_is_threshold``)
ROLLOUT_IS = {"token_tis": ("token", 2.0), "sequence_tis": ("sequence", 5.0), "token_icepop": ("token", "0.5_2.0")}


def _importance_ratio():
    """verl's rollout-correction IS weights: ``rollout_corr_helper.compute_rollout_correction_and_rejection_mask``
    (the entry point the trainer and ``apply_bypass_mode`` call) with ``old_log_prob`` = the catalog's
    log_prob, ``rollout_log_prob`` = its old_log_prob, ``rollout_is`` token / sequence and a TIS threshold
    (2.0 / 5.0) or the IcePop band ``"0.5_2.0"``, no batch normalisation, no rejection sampling; the weights are
    ``proto.batch["rollout_is_weights"]`` (detached by design, ``rollout_is_weights.detach()`` in
    ``compute_rollout_correction_weights``: the op is bound ``detached``, a gradient to log_prob fails).
    Batch normalisation and every rejection-sampling option
    (``SUPPORTED_ROLLOUT_RS_OPTIONS``, read at run time) are listed unchecked."""
    from verl.trainer.ppo import rollout_corr_helper as rc

    from rlconform.harness.catalog.binding import Variants

    fn = rc.compute_rollout_correction_and_rejection_mask

    def bind(level, threshold):
        def importance_ratio(log_prob, old_log_prob, mask):
            proto, _, _ = fn(old_log_prob=log_prob, rollout_log_prob=old_log_prob, response_mask=mask,
                             rollout_is=level, rollout_is_threshold=threshold)
            return proto.batch["rollout_is_weights"]

        importance_ratio.__qualname__ = f"verl.rollout_is_weights[{level}, {threshold}]"
        return importance_ratio

    unchecked = {
        "batch_normalize": "rollout_is_batch_normalize=True rescales the weights to mean 1 over the batch: "
                           "no reference",
    }
    for name in sorted(getattr(rc, "SUPPORTED_ROLLOUT_RS_OPTIONS", ())):
        unchecked[f"rollout_rs={name}"] = "a rejection-sampling mask, not an IS weight: checked by op rollout_rejection_mask"
    return Variants({v: bind(*spec) for v, spec in ROLLOUT_IS.items()}, unchecked=unchecked)


#: catalog variant of ``rollout_rejection_mask`` -> (verl ``rollout_rs``, ``rollout_rs_threshold``)
ROLLOUT_RS = {
    "token_k1": ("token_k1", "2.0"), "token_k1_asym": ("token_k1", "0.5_1.5"), "seq_sum_k1": ("seq_sum_k1", "0.2_5.0"),
    "seq_mean_k1": ("seq_mean_k1", "0.8_1.25"), "token_k2": ("token_k2", "0.5"), "token_k3": ("token_k3", "0.5"),
    "seq_sum_k2": ("seq_sum_k2", "2.0"), "seq_sum_k3": ("seq_sum_k3", "2.0"), "seq_mean_k2": ("seq_mean_k2", "0.1"),
    "seq_mean_k3": ("seq_mean_k3", "0.1"), "seq_max_k2": ("seq_max_k2", "0.5"), "seq_max_k3": ("seq_max_k3", "0.5"),
    "chained": ("token_k1,seq_mean_k3", "2.0,0.1"),
}
#: verl's metric key (after the ``rollout_corr/`` prefix) -> the catalog's diagnostic
ROLLOUT_CORR_METRICS = {
    "rollout_rs_masked_fraction": "rs_masked_fraction", "rollout_rs_seq_masked_fraction": "rs_seq_masked_fraction",
    "rollout_is_mean": "is_mean", "rollout_is_ratio_fraction_high": "is_fraction_high",
    "rollout_is_ratio_fraction_low": "is_fraction_low", "rollout_is_eff_sample_size": "is_ess",
    "kl": "kl", "k3_kl": "k3_kl", "chi2_token": "chi2_token", "chi2_seq": "chi2_seq",
    "training_ppl": "training_ppl", "rollout_ppl": "rollout_ppl", "log_ppl_diff": "log_ppl_diff",
    "ppl_ratio": "ppl_ratio",
}


def _rollout_rejection_mask():
    """verl's rejection sampling: ``rollout_corr_helper.compute_rollout_correction_and_rejection_mask`` (the
    entry point ``compute_rollout_correction_and_add_to_batch`` calls) with ``old_log_prob`` = the catalog's
    log_prob, ``rollout_log_prob`` = its old_log_prob, ``rollout_rs`` / ``rollout_rs_threshold`` per variant
    (:data:`ROLLOUT_RS`) and ``rollout_is="token"``, threshold 2.0 (so that ``compute_is_metrics`` runs); the
    kept mask is the modified ``response_mask`` (a float mask in, as the trainer's DataProto holds it), the
    metrics those of :data:`ROLLOUT_CORR_METRICS` (``compute_rs_metrics``' per-option keys, ``*_std`` and the
    ``*_seq_*`` breakdowns are not compared: listed unchecked)."""
    from verl.trainer.ppo import rollout_corr_helper as rc

    from rlconform.harness.catalog.binding import Variants

    fn = rc.compute_rollout_correction_and_rejection_mask

    def bind(option, threshold):
        def rollout_rejection_mask(log_prob, old_log_prob, mask):
            m = mask.to(log_prob.dtype)
            _, kept, metrics = fn(old_log_prob=log_prob, rollout_log_prob=old_log_prob, response_mask=m,
                                  rollout_is="token", rollout_is_threshold=2.0, rollout_rs=option,
                                  rollout_rs_threshold=threshold)
            out = {}
            for key, value in metrics.items():
                name = ROLLOUT_CORR_METRICS.get(key.removeprefix("rollout_corr/"))
                if name is not None:
                    out[name] = value
            return kept, out

        rollout_rejection_mask.__qualname__ = f"verl.rollout_rs[{option}, {threshold}]"
        return rollout_rejection_mask

    unchecked = {
        "seq_all_k1": "no verl option rejects a row when any token's ratio is outside the bounds (SkyRL's outlier "
                      "mask); verl's seq_max_k2 / seq_max_k3 do it for k2 / k3 (bound)",
        "compute_rs_metrics per-option keys": "rollout_rs_<option>_{mean,max,min,std,fraction_high,fraction_low,"
                                              "seq_*}: a per-option breakdown with no catalog metric yet",
        "compute_is_metrics sequence level": "rollout_is='sequence' metrics (the weights are importance_ratio's "
                                             "sequence_tis; rollout_is_mean / _min / _max / _ratio_fraction_high "
                                             "are policy_step_metrics' token-mean-with-seq-tis): the others no "
                                             "catalog metric yet",
    }
    supported = rollout_rs_options(rc)
    return Variants({v: bind(*spec) for v, spec in ROLLOUT_RS.items()
                     if all(opt.strip() in supported for opt in spec[0].split(","))}, unchecked=unchecked)


def rollout_rs_options(rc) -> set[str]:
    """The ``rollout_rs`` option names this verl accepts (``rollout_corr_helper.SUPPORTED_ROLLOUT_RS_OPTIONS``,
    0.7+; a variant whose option the release lacks is not provided there). Raises ``ImportError``
    (the op is unavailable) for a verl without the set: 0.6's ``rollout_rs`` is an aggregation level
    (``token`` / ``sequence`` / ``geometric`` with upper / lower IS-weight thresholds), no option the catalog's
    variants are."""
    supported = getattr(rc, "SUPPORTED_ROLLOUT_RS_OPTIONS", None)
    if supported is None:
        raise ImportError(f"verl {_version()} has no rollout_corr_helper.SUPPORTED_ROLLOUT_RS_OPTIONS: its rollout_rs "
                          "is an aggregation level (token / sequence / geometric with IS-weight thresholds), not the "
                          "divergence options (token_k1, seq_mean_k3, ...) the catalog's variants are",
                          name="SUPPORTED_ROLLOUT_RS_OPTIONS")
    return set(supported)


# ---------------------------------------------------------------------------------- advantages
#: verl registry name -> the catalog variants of ``outcome_advantage`` it implements (the trainer's call).
VERL_ESTIMATORS = {
    "grpo": ("grpo", "drgrpo"),
    "gdpo": ("gdpo",),
    "grpo_passk": ("grpo_passk",),
    "reinforce_plus_plus_baseline": ("reinforce_plus_plus_baseline",),
    "rloo": ("rloo",),
    "opo": ("opo",),
    "reinforce_plus_plus": ("reinforce_plus_plus",),
    "remax": ("remax",),
    "gpg": ("gpg",),
}
#: verl registry name -> (catalog implementation name, the name of the default implementation whose variants
#: it implements): second implementations of an estimator, checked as ``variant+vectorized``.
VERL_SECOND_IMPLEMENTATIONS = {"grpo_vectorized": ("vectorized", "grpo"), "rloo_vectorized": ("vectorized", "rloo")}
#: why a registered name is not a variant of ``outcome_advantage`` (anything else registered: "not in the catalog").
VERL_UNCHECKED = {
    "gae": "a critic-value estimator: checked as op 'gae'",
    "optimal_token_baseline": "needs old log-probs and Σπ²: checked as op 'optimal_token_baseline'",
    "tir_optimal_token_baseline": "multi-turn optimal token baseline: no float64 reference in rlconform.reference",
}


def _trainer_mask(response_mask):
    """``batch["response_mask"]`` as verl's trainer holds it: ``compute_response_mask`` slices the tokenizer's
    int64 ``attention_mask`` (verl's gae and reinforce_plus_plus compute ``1 - response_mask``, which a bool
    mask would make raise: a failure no trainer run can reach)."""
    import torch

    return response_mask.to(torch.int64)


def _trainer_uids(index):
    """``non_tensor_batch["uid"]`` as verl's trainer holds it: an object ndarray of uid strings, one per row."""
    import numpy as np

    return np.array([str(u) for u in np.asarray(index).reshape(-1).tolist()], dtype=object)


def _gdpo_inputs(reward_components, response_mask):
    """What ``ray_trainer.compute_advantage`` passes GDPO: reward keys ``c0 .. c{K-1}`` in the config, one
    per-row score per key in ``non_tensor_batch`` (what ``compute_score`` returned: the component's value
    at the row's last valid token, the column verl writes it back to), and ``batch`` with ``prompts``
    [B, 1] and the integer ``attention_mask`` [B, 1 + T]: 1 up to the row's last valid token, so a
    multi-turn row's tool-observation tokens are attended as in the trainer (verl's
    ``valid_response_length`` = attention_mask.sum − 1 is then the last valid token)."""
    import numpy as np
    import torch

    b, t = response_mask.shape
    valid = response_mask.bool()
    # the last valid column (−1 → verl's last column for an empty row, as valid_response_length gives it)
    last = torch.where(valid.any(-1), t - 1 - valid.flip(-1).long().argmax(-1), torch.full((b,), -1))
    attended = torch.arange(t)[None, :] <= last[:, None]
    keys = [f"c{k}" for k in range(reward_components.shape[0])]
    non_tensor_batch = {key: np.array(comp[torch.arange(b), last].tolist()) for key, comp in
                        zip(keys, reward_components)}
    batch = {"prompts": torch.zeros(b, 1, dtype=torch.long),
             "attention_mask": torch.cat([torch.ones(b, 1, dtype=torch.long), attended.long()], dim=1)}
    return keys, non_tensor_batch, batch


def _verl_estimator(fn, name: str, variant: str, algo_config):
    """``outcome_advantage[variant]`` as ``ray_trainer.compute_advantage`` calls verl's ``name``: the GRPO
    branch passes ``norm_adv_by_std_in_grpo`` itself; every other estimator gets ``token_level_rewards``,
    ``response_mask``, ``config`` (AlgoConfig: γ = λ = 1, ``norm_adv_by_std_in_grpo``), ``index`` and, when
    present, ``reward_baselines`` (remax) or ``non_tensor_batch`` / ``batch`` (gdpo); the mask as the trainer
    holds it (int64, :func:`_trainer_mask`), uids as an object array of str. ε, f_norm are verl's defaults
    (1e-6, 1.0: the catalog's)."""
    norm = variant != "drgrpo"

    def outcome_advantage(token_level_rewards, response_mask, index, reward_baselines=None, reward_components=None):
        uids = _trainer_uids(index)
        response_mask = _trainer_mask(response_mask)
        if name == "grpo":
            return fn(token_level_rewards=token_level_rewards, response_mask=response_mask, index=uids,
                      norm_adv_by_std_in_grpo=norm)
        cfg = dict(gamma=1.0, lam=1.0, norm_adv_by_std_in_grpo=norm)
        kwargs = {}
        if reward_baselines is not None:
            kwargs["reward_baselines"] = reward_baselines
        if name == "gdpo" and reward_components is not None:
            keys, kwargs["non_tensor_batch"], kwargs["batch"] = _gdpo_inputs(reward_components, response_mask)
            cfg.update(gdpo_reward_keys=keys, gdpo_reward_weights=[1.0] * len(keys))
        return fn(token_level_rewards=token_level_rewards, response_mask=response_mask,
                  config=algo_config(**cfg), index=uids, **kwargs)

    outcome_advantage.__qualname__ = f"verl.outcome_advantage[{variant}]({name})"
    return calls(fn)(outcome_advantage)


def _algo_config():
    """``config=`` of the estimators as the trainer passes it: ``verl.trainer.config.AlgoConfig``
    (verl >= 0.5), or before it the OmegaConf ``DictConfig`` ``self.config.algorithm`` (the estimators read
    ``config.get("norm_adv_by_std_in_grpo", True)``, ``config.gamma``)."""
    try:
        from verl.trainer.config import AlgoConfig
    except ImportError:
        from omegaconf import OmegaConf

        return lambda **fields: OmegaConf.create(fields)
    return AlgoConfig


def _outcome_advantage():
    """verl's ``ADV_ESTIMATOR_REGISTRY`` as read now: every name bound (:data:`VERL_ESTIMATORS`), bound as a
    second implementation of another name's variants (:data:`VERL_SECOND_IMPLEMENTATIONS`: ``grpo_vectorized``
    as ``grpo+vectorized`` and ``drgrpo+vectorized``, ``rloo_vectorized`` as ``rloo+vectorized``, each called
    as the trainer calls it) or listed unchecked with its reason (a name this module does not know: a new or
    fork-only estimator)."""
    from verl.trainer.ppo import core_algos

    from rlconform.harness.catalog.binding import Variants

    AlgoConfig = _algo_config()
    impls, unchecked, implementations = {}, {}, {}
    registry = core_algos.ADV_ESTIMATOR_REGISTRY
    for name in registry:
        if name in VERL_ESTIMATORS:
            fn = core_algos.get_adv_estimator_fn(name)
            impls.update({v: _verl_estimator(fn, name, v, AlgoConfig) for v in VERL_ESTIMATORS[name]})
        elif name in VERL_SECOND_IMPLEMENTATIONS and VERL_SECOND_IMPLEMENTATIONS[name][1] in registry:
            impl, plain = VERL_SECOND_IMPLEMENTATIONS[name]
            fn = core_algos.get_adv_estimator_fn(name)
            implementations.setdefault(impl, {}).update(
                {v: _verl_estimator(fn, name, v, AlgoConfig) for v in VERL_ESTIMATORS[plain]})
        elif name in VERL_SECOND_IMPLEMENTATIONS:
            unchecked[name] = (f"a second implementation of {VERL_SECOND_IMPLEMENTATIONS[name][1]!r}, which this "
                               f"verl does not register: nothing to check it against")
        else:
            unchecked[name] = VERL_UNCHECKED.get(name, "not in the catalog (a new or fork-only estimator)")
    return Variants(impls, unchecked=unchecked, implementations=implementations)


def _gae(fn):
    def gae(token_level_rewards, values, response_mask, gamma, lam):
        return fn(token_level_rewards=token_level_rewards, values=values, response_mask=_trainer_mask(response_mask),
                  gamma=gamma, lam=lam)

    gae.__qualname__ = "verl.gae"
    return gae


def _masked_whiten(fn):
    def masked_whiten(values, mask, shift_mean):
        return fn(values, mask, shift_mean=shift_mean)

    masked_whiten.__qualname__ = "verl.masked_whiten"
    return masked_whiten


# ------------------------------------------------------------------------- distributed (TP / DP)
TPM = "verl.utils.megatron.tensor_parallel"


def _megatron_parallel_state():
    from ._compat import import_megatron

    return import_megatron("megatron.core.parallel_state")


def _require_tp_group(ps, group, fn_name: str) -> None:
    """verl's vocab-parallel functions take no group: they read Megatron's parallel_state TP group. The
    harness initialises parallel_state for the layout and passes that group; anything else is a misuse."""
    current = ps.get_tensor_model_parallel_group() if ps.model_parallel_is_initialized() else None
    if group is not current:
        raise RuntimeError(f"verl's {fn_name} reads megatron.core.parallel_state's TP group; the caller's group "
                           f"{group!r} is not that group ({current!r}): initialise parallel_state for the layout")


def _vocab_parallel(name: str, op: str, with_labels: bool = False, chunked: bool = False):
    """Loader of verl's ``tensor_parallel.<name>`` as the canonical ``vocab_parallel_*`` op (``chunked``: the
    function takes ``chunk_size``, passed through)."""

    def loader():
        from ._compat import import_megatron

        fn = getattr(import_megatron(TPM), name)
        ps = _megatron_parallel_state()
        if chunked:
            def impl(local_logits, group, chunk_size=2048):
                _require_tp_group(ps, group, name)
                return fn(local_logits, chunk_size=chunk_size)
        elif with_labels:
            def impl(local_logits, labels, group):
                _require_tp_group(ps, group, name)
                return fn(local_logits, labels)
        else:
            def impl(local_logits, group):
                _require_tp_group(ps, group, name)
                return fn(local_logits)
        impl.__name__ = op
        impl.__qualname__ = f"verl.{op}"
        impl.rlconform_parallel_state = True  # the distributed tests pass parallel_state's TP group
        return impl

    return Lazy(loader=loader)


def _dp_metric_all_reduce():
    """``actor/pg_clipfrac`` (see :func:`_metric_pipeline`) on real DP ranks, one micro-batch per rank:
    emit (``masked_mean(...).item()`` as a ``Metric(MEAN)``) -> ``append_to_dict`` -> the real
    ``verl.utils.torch_functional.allgather_dict_into_dict`` over the DP group (``all_gather_object``) ->
    ``Metric.aggregate_dp`` (as ``engine_workers.train_mini_batch``) -> ``reduce_metrics``."""
    from verl.utils import metric as verl_metric
    from verl.utils import torch_functional as verl_F

    if not _typed_metrics(verl_metric) or not hasattr(verl_F, "allgather_dict_into_dict"):
        # the missing names, and where this release folds the ranks' metrics instead
        missing = [n for n, ok in (("verl.utils.metric.Metric", hasattr(verl_metric, "Metric")),
                                   ("verl.utils.torch_functional.allgather_dict_into_dict",
                                    hasattr(verl_F, "allgather_dict_into_dict"))) if not ok]
        raise ImportError(f"verl {_version()} has no DP metric all-reduce (missing: {', '.join(missing)}): its "
                          "workers return their metrics to the single controller, which keeps the first DP rank's "
                          "(DataProto.concat in collect_dp_compute_data_proto); checked by metric_pipeline's DP "
                          "stage")
    Metric, allgather_dict_into_dict = verl_metric.Metric, verl_F.allgather_dict_into_dict

    pipeline = _metric_pipeline()

    # the gather only moves values: Metric.aggregate_dp is what averages the ranks' means (its site)
    @calls(_dp_fold(Metric), allgather_dict_into_dict)
    def dp_metric_all_reduce(local_values, local_mask, group):
        local = pipeline.reduce_micro([pipeline.emit(local_values, local_mask)])
        gathered = allgather_dict_into_dict(local, group=group)  # {key: [rank 0 value, rank 1 value, ...]}
        ranks = [{k: v[i] for k, v in gathered.items()} for i in range(len(next(iter(gathered.values()))))]
        final = pipeline.finalize(pipeline.reduce_mini([pipeline.reduce_dp(ranks)]))
        return final[PG_KEY]

    dp_metric_all_reduce.__qualname__ = "verl.dp_metric_all_reduce"
    return dp_metric_all_reduce


def _cp_masked_mean():
    """``verl.utils.torch_functional.distributed_masked_mean(local_tensor, local_mask)`` as ``cp_masked_mean``:
    ``Σ(x·mask)`` and ``Σ mask`` each ``all_reduce``d (SUM) over the *default* (world) process group, then one
    division, in the values' dtype. The mask is passed in the values' dtype, as both its call sites do
    (``rollout_corr_helper.compute_rollout_correction_weights``, batch normalisation of the IS weights:
    ``response_mask.to(dtype=rollout_is_weights.dtype)`` per token, ``(...> 0).to(dtype=...)`` per
    sequence), so 16-bit counts round as they do there.

    verl takes no group: it reduces over every rank of the job. The adapter carries
    ``rlconform_world_group = True``; the distributed checks then run it only on layouts whose world is the
    CP group times ranks holding the same shard (a CP regime's TP ranks: both sums scale by ``tp``, the
    ratio does not), and in the unsharded run give the idle ranks an empty shard, so every rank of the world
    takes part in the collective (a layout with DP ranks is refused there)."""
    from verl.utils import torch_functional as verl_F

    fn = verl_F.distributed_masked_mean

    def cp_masked_mean(local_values, local_mask, group):  # group unused: verl reduces over the default group
        return fn(local_values, local_mask.to(local_values.dtype))

    cp_masked_mean.__qualname__ = "verl.cp_masked_mean"
    cp_masked_mean.rlconform_world_group = True  # reduces over the default group, not the one it is given
    return cp_masked_mean


EXP_TF = "verl.utils.experimental.torch_functional"


def _fused_linear():
    """``FusedLinearForPPO(chunk_size, impl_backend="torch").forward(hidden, weight, labels, temperature)`` as verl's
    models call it (``dense_common.py`` & co. construct it with the default chunk_size 512 and the torch backend
    unless ``_verl_fused_kernels_backend`` says liger; liger_kernel is not installed here, and verl falls back
    to torch then). Contract: hidden ``[T, H]`` or ``[B, T, H]`` (``assert orig_ndim in (2, 3)``); log-probs
    always float32 ("Logits are upcasted to fp32 before computing log_probs, which are also fp32": the source's
    comment, with an assert); the entropy's dtype is stated nowhere (the code allocates it with
    ``hidden_states.new_zeros``, which is behaviour, not contract): not checked. The class has no docstring:
    the contract is read from that comment."""
    import importlib

    module_class = importlib.import_module(EXP_TF).FusedLinearForPPO
    forward = module_class.forward  # nn.Module.__call__ adds nothing here (no hooks); held for the coverage table

    def fused_linear_token_stats(hidden, weight, labels, temperature, chunk_size):
        # impl_backend only where the constructor has it (verl <= 0.5 has the torch path only)
        module = module_class(**accepted_keywords(module_class.__init__, dict(chunk_size=chunk_size,
                                                                              impl_backend="torch")))
        return forward(module, hidden, weight, labels,
                       temperature=temperature)

    fused_linear_token_stats.__qualname__ = "verl.FusedLinearForPPO"
    return Implementation(fused_linear_token_stats, ranks=(2, 3), out_dtype={"logprobs": "float32"},
                          doc="hidden (T, H) or (B, T, H); 'log_probs, which are also fp32'; entropy dtype "
                          "not stated, not checked")


KERNEL = "verl.utils.kernel.linear_cross_entropy"


def _triton_linear_ce():
    """``linear_cross_entropy(hidden, weight, labels, temperature, "none")`` (``LinearCrossEntropy.apply``) as
    verl's Triton model backend calls it (``models/transformers/dense_common.py forward_with_triton_backend``):
    the fused Triton kernels of ``verl/utils/kernel/kernels.py``, CUDA only (``needs="cuda"``). Contract, from
    its docstring: "hidden: (batch_size, num_tokens, hidden_size) -> (batch_size * num_tokens, hidden_size)",
    labels likewise flattened: the outputs are one row per token, so the flat ``[T, H]`` rank is the one whose
    output shape is stated (rank 3 returns flat rows: a shape the docstring gives, not the caller's); no
    output dtype stated (the kernel allocates float32): not checked; no chunk size (the kernel tiles itself)."""
    import importlib

    kernel = importlib.import_module(KERNEL).LinearCrossEntropy

    def triton_linear_cross_entropy(hidden, weight, labels, temperature, chunk_size):
        return kernel.apply(hidden, weight, labels, float(temperature), "none")

    triton_linear_cross_entropy.__qualname__ = "verl.linear_cross_entropy"
    return triton_linear_cross_entropy


#: verl's alternative implementations of catalog ops, each checked as the op under regimes
#: ``impl@data`` with the contract its docstring states.
IMPLEMENTATIONS = {
    "fused_linear_token_stats": {
        # the Triton kernel verl's models run on GPUs: unavailable: needs CUDA on a CPU run
        "triton": Implementation(Lazy(loader=_triton_linear_ce), ranks=(2,), needs="cuda",
                                 doc="hidden (batch_size, num_tokens, hidden_size) -> (batch_size * num_tokens, "
                                 "hidden_size); output dtype not stated, not checked; CUDA only (Triton)"),
    },
    "entropy": {
        # "logits: Unnormalized log-probabilities of shape (batch_size, vocab_size)": 2-D only. "Converts chunks to
        # float32 for numerical stability during computation" is about the computation: the docstring states no
        # output dtype, so none is checked. verl's callers (engine option entropy_from_logits_with_chunking,
        # prefix_grouper_utils) pass no chunk_size: 2048 is among CHUNK_SIZES.
        "chunked": Implementation(Lazy(f"{TF}:entropy_from_logits_with_chunking"), ranks=(2,),
                                  chunk_arg="chunk_size",
                                  doc="logits (batch_size, vocab_size); output dtype not stated, not checked"),
    },
    "vocab_parallel_entropy": {
        # "vocab_parallel_logits: (batch_size, seq_len, vocab_size // tp_size) or (total_nnz, vocab_size // tp_size)
        # ... Returns: (batch_size, seq_len)": ranks 2 and 3; no dtype documented: not checked. Chunks along dim 1.
        "chunked": Implementation(_vocab_parallel("vocab_parallel_entropy_with_chunking", "vocab_parallel_entropy",
                                                  chunked=True), ranks=(2, 3), chunk_arg="chunk_size",
                                  called_rank=3,  # megatron/transformer_impl.py: logits [1, nnz, V/tp]
                                  doc="(batch_size, seq_len, vocab_size // tp_size) or (total_nnz, vocab_size // "
                                  "tp_size); output dtype not stated, not checked"),
    },
    "token_logprobs": {
        # "logits: Model output logits of shape (..., vocab_size)": any rank; no output dtype stated: not checked
        "naive": Implementation(Lazy(f"{TF}:logprobs_from_logits_naive"), ranks=(2, 3),
                                doc="logits (..., vocab_size), labels (...); output dtype not stated, not checked"),
        # "(batch_size, seq_len, vocab_size) or (batch_size, vocab_size)". logprobs_from_logits (token_logprobs)
        # calls it on every machine without flash-attn / NPU; bound on its own so that it is checked on a CUDA
        # machine too, where token_logprobs runs flash-attn's kernel instead.
        "rowwise": Implementation(Lazy(f"{TF}:logprobs_from_logits_v2"), ranks=(2, 3),
                                  doc="logits (batch_size, seq_len, vocab_size) or (batch_size, vocab_size); output "
                                  "dtype not stated, not checked"),
    },
}


#: the dtypes verl's trainer calls each op with (a defect only in other dtypes is ``precision``).
#: Logits come straight from the model (``transformer_impl.py``: ``output.logits`` under FSDP
#: ``mixed_precision.param_dtype``, default bf16; fp32 for an fp32 model), so the softmax statistics see
#: bf16 and fp32; log-probs computed from them (``logprobs_from_logits``: bf16 in, bf16 out) reach the
#: policy loss, KL, IS weights and ``agg_loss``; rewards, advantages and their statistics (``masked_var`` /
#: ``masked_whiten`` inside the estimators), values and metrics are fp32 tensors of the ``DataProto``.
#: Never float64, never float16 (verl's engines train in bf16).
LOGITS_DTYPES = ("float32", "bfloat16")
SCALAR_DTYPES = ("float32",)
ENGINE_DTYPES = {
    **{op: LOGITS_DTYPES for op in ("entropy", "token_logprobs", "sum_pi_squared", "vocab_parallel_token_logprobs",
                                    "vocab_parallel_entropy", "vocab_parallel_sum_pi_squared",
                                    "fused_linear_token_stats", "policy_loss", "kl_estimator", "importance_ratio",
                                    "agg_loss", "value_loss")},
    # the rollout and training log-probs of the DataProto: fp32
    "rollout_rejection_mask": SCALAR_DTYPES,
    **{op: SCALAR_DTYPES for op in ("masked_sum", "masked_mean", "masked_var", "masked_whiten", "outcome_advantage",
                                    "gae", "optimal_token_baseline", "metric_pipeline", "metric_statistics",
                                    "dp_metric_all_reduce", "cp_masked_mean")},
}

# ----------------------------------------------------------- declared conventions, preconditions, guards
def _nnz(case, key: str = "mask", cleared: bool = False) -> int:
    """Valid tokens of the mask the engine is handed for ``case``; ``cleared``: the family's mask_invariant
    clears the last bit of an all-valid mask (:mod:`rlconform.harness.families.reductions`; the advantage
    families append a masked column instead)."""
    import numpy as np

    if key not in case.inputs:  # a generated real-shapes input: thousands of tokens
        return 1 << 30
    m = np.asarray(case.inputs[key]).astype(bool)
    return int(m.sum()) - int(cleared and case.property == "mask_invariant" and m.size > 0 and bool(m.all()))


def _one_sample_group(case) -> bool:
    import numpy as np

    _, counts = np.unique(np.asarray(case.inputs["index"]), return_counts=True)
    return bool((counts == 1).any())


#: verl's deliberate behaviour: checked as declared, listed in "Conventions and guards"
DECLARED = (
    Declared(
        "masked_var_le_one_token", "guard", ("masked_var",),
        "the unbiased masked_var raises ValueError on 0 or 1 valid tokens ('At least one element in the mask "
        "has to be 1.' / 'The sum of the mask is one, which can cause a division by zero.')",
        "the Bessel correction n/(n-1) is undefined there; verl's comment: 'to avoid it you just need to use a "
        "larger minibatch_size'", "verl/utils/torch_functional.py:319",
        when=lambda case: bool(case.inputs.get("unbiased", True)) and _nnz(case, cleared=True) <= 1,
        raises="ValueError", match=r"At least one element in the mask has to be 1|The sum of the mask is one"),
    Declared(
        "masked_whiten_le_one_token", "guard", ("masked_whiten",),
        "masked_whiten raises masked_var's ValueError on 0 or 1 valid tokens (its variance is the unbiased one)",
        "whitening needs a variance: masked_var's guard (torch_functional.py:319, :323) on purpose",
        "verl/utils/torch_functional.py:342",
        when=lambda case: _nnz(case) <= 1,
        raises="ValueError", match=r"At least one element in the mask has to be 1|The sum of the mask is one"),
    Declared(
        "gae_whiten_le_one_token", "guard", ("gae",),
        "compute_gae_advantage_return whitens the advantages over the batch with masked_whiten, which raises "
        "masked_var's ValueError when the batch holds 0 or 1 valid tokens",
        "whitening needs a variance (masked_var's guard, torch_functional.py:319, on purpose)",
        "verl/trainer/ppo/core_algos.py:262",
        when=lambda case: _nnz(case, "response_mask") <= 1,
        raises="ValueError", match=r"At least one element in the mask has to be 1|The sum of the mask is one"),
    Declared(
        "batch_whiten_le_one_token", "guard", ("outcome_advantage",),
        "reinforce_plus_plus, reinforce_plus_plus_baseline and gdpo whiten over the whole batch with "
        "masked_whiten, which raises ValueError when the batch holds 0 or 1 valid tokens",
        "batch-level normalisation needs a variance (masked_var's guard, torch_functional.py:319)",
        "verl/trainer/ppo/core_algos.py:728",
        variants=("reinforce_plus_plus", "reinforce_plus_plus_baseline", "gdpo"),
        when=lambda case: _nnz(case, "response_mask") <= 1,
        raises="ValueError", match=r"At least one element in the mask has to be 1|The sum of the mask is one"),
    Declared(
        "passk_one_sample_group", "guard", ("outcome_advantage",),
        "grpo_passk raises ValueError on a group of one sample ('Pass@k requires at least 2 samples per group')",
        "pass@k's advantage (best minus second best) needs two samples", "verl/trainer/ppo/core_algos.py:518",
        variants=("grpo_passk",), when=_one_sample_group,
        raises="ValueError", match=r"Pass@k requires at least 2 samples per group"),
    Declared(
        "rewards_zero_outside_mask", "precondition", ("outcome_advantage", "optimal_token_baseline"),
        "token_level_rewards are zero outside the response mask (the outcome estimators sum the whole row: "
        "scores = token_level_rewards.sum(dim=-1); the optimal token baseline's returns multiply them by the mask)",
        "the reward manager writes the score on the last valid token of a zero tensor, so no caller passes "
        "anything else at masked positions", "verl/trainer/ppo/core_algos.py:304",
        inputs=("token_level_rewards", "rewards")),  # outcome_advantage's name, optimal_token_baseline's
    Declared(
        "singleton_group_raw_score", "convention", ("outcome_advantage",),
        "a group of one sample gets group statistics μ := 0, σ := 1, so its advantage is its own score "
        "(grpo s/(1 + ε); drgrpo, rloo, opo s; gpg α·s; reinforce_plus_plus_baseline and gdpo s before the batch "
        "whitening) where rlconform's reference gives 0 (the reference follows: singleton='raw'; a second "
        "implementation of these variants is held to it too)",
        "verl's estimators special-case the group of one ('if len(id2score[idx]) == 1: id2mean[idx] = "
        "torch.tensor(0.0); id2std[idx] = torch.tensor(1.0)'), also at core_algos.py:572 "
        "(reinforce_plus_plus_baseline), :622 (rloo), :678 (opo), :817 (gpg); gdpo calls grpo per component",
        "verl/trainer/ppo/core_algos.py:315",
        variants=("grpo", "drgrpo", "rloo", "opo", "gpg", "reinforce_plus_plus_baseline", "gdpo"),
        reference=(("singleton", "raw"),)),
    Declared(
        "sapo_seq_mean_token_mean", "convention", ("policy_loss",),
        "SAPO aggregates seq-mean-token-mean whatever loss_agg_mode it is passed (the reference follows: "
        "LossVariants.agg_modes)",
        "'for SAPO, we need to aggregate the loss at the sequence level' (SAPO's paper recommends it)",
        "verl/trainer/ppo/core_algos.py:1688", variants=("sapo",)),
    Declared(
        "sequence_is_extremes_of_raw_ratios", "convention", ("policy_step_metrics",),
        "with sequence-level TIS (rollout_is='sequence') rollout_is_min / rollout_is_max are the extremes of the raw "
        "sequence ratios exp(Σ log-ratio), before the TIS cap, beside rollout_is_mean, the token mean of the capped "
        "weights (the reference follows: is_extreme_weights='raw'; at the token level all three are the capped "
        "weights')",
        "compute_is_metrics: 'Sequence-level aggregation: use log-space for unclamped stats', 'Mean uses truncated "
        "weights to avoid overflow'", "verl/trainer/ppo/rollout_corr_helper.py:704",
        variants=("token-mean-with-seq-tis",), reference=(("is_extreme_weights", "raw"),)),
    Declared(
        "actor_metrics_mean_over_mini_batches", "convention", ("policy_step_metrics",),
        "with several mini-batches (ppo_mini_batch_size below the batch) each actor/ metric is one value per "
        "mini-batch (optimizer step), appended to a list that fit's reduce_metrics averages: the mean over the "
        "mini-batches, not the value over the batch's tokens (the reference follows: mini_batch_mean_metrics; "
        "actor/entropy and the rollout_corr/ metrics are computed once over the batch)",
        "one value per update step, as with ppo_epochs > 1, where a pooled value is not defined: train_mini_batch "
        "appends each mini-batch's metrics (append_to_dict) and reduce_metrics takes np.mean of the list "
        "(ray_trainer.py:1718)", "verl/workers/engine_workers.py:334",
        reference=(("mini_batch_mean_metrics", ("pg_loss", "entropy_loss", "pg_clipfrac", "pg_clipfrac_lower",
                                                 "ppo_kl", "kl_loss")),)),
    Declared(
        "is_log_ratio_clamp_20", "convention", ("rollout_rejection_mask",),
        "the rollout_corr/ IS weights and χ² metrics clamp each token's (and each row's) log-ratio to ±20 before "
        "exp (SAFETY_BOUND), so ESS, is_mean and χ² are those of the clamped weights (the reference follows: "
        "log_ratio_clamp=20)",
        "'safety clamp' against exp overflow: SAFETY_BOUND = 20.0 in compute_rollout_correction_weights and "
        "compute_offpolicy_metrics", "verl/trainer/ppo/rollout_corr_helper.py:75",
        reference=(("log_ratio_clamp", 20.0),)),
    Declared(
        "entropy_backward_writes_logits", "precondition", ("vocab_parallel_entropy", "vocab_parallel_sum_pi_squared"),
        "_VocabParallelEntropy.backward reuses the logits it saved as scratch (vocab_parallel_logits.sub_(…) then "
        ".add_(…): their version moves, their values come back rounded), so the tensor passed to "
        "vocab_parallel_entropy must not be read after its backward; its forward writes nothing",
        "memory: the caller clones the logits before the entropy (logits_bak = logits.clone()) and computes Σπ² "
        "before it ('sum_pi_squared is non-destructive — must run before vocab_parallel_entropy'), so the "
        "log-probs and Σπ² never read the tensor the backward writes",
        "verl/utils/megatron/tensor_parallel.py:130",
        caller="verl/workers/engine/megatron/transformer_impl.py:1215",
        writes=("logits",), phase="backward", writer="_VocabParallelEntropy.backward",
        evidence=(r"vocab_parallel_sum_pi_squared\(\s*logits\s*\)", r"logits_bak\s*=\s*logits\.clone\(\)",
                  r"vocab_parallel_entropy(?:_with_chunking)?\(\s*logits\b",
                  r"vocab_parallel_log_probs_from_logits\(\s*logits_bak\b"),
        hazard="a caller that reads the logits after the entropy's backward (or saved them for its own backward) "
               "sees them changed: clone them first, and compute Σπ² before the entropy"),
    cross_entropy_writes_logits(
        ("vocab_parallel_token_logprobs",),
        "upstream, on purpose: 'In-place subtraction reduces memory pressure.'; verl passes it its own clone "
        "(logits_bak) and reads nothing of it afterwards"),
)

RC = "verl.trainer.ppo.rollout_corr_helper"
#: the policy loss's token fractions and means (pg_clipfrac, ppo_kl): ppo_loss marks them Metric MEAN, so the fold
#: (Metric.aggregate_dp, right for what it is told) averages the micro-batches' means; the marking is the wrong line
_PG_METRICS_MEAN = (r"\bmetric (pg_clipfrac|pg_clipfrac_lower|ppo_kl)\b", "verl.workers.utils.losses:ppo_loss",
                    "micro-batch", r"pg_metrics = Metric\.from_dict\(pg_metrics, aggregation=AggregationType\.MEAN\)")
#: sequence TIS: compute_is_metrics takes the fraction above the cap, the min and the max over every row's log-ratio sum
#: (log_ratio_for_metrics, [B, 1]): a row with no valid token has the sum 0, a ratio of 1, and counts
_SEQ_IS_ROWS = (r"^metric rollout_is_(fraction_high|min|max)\b", f"{RC}:compute_is_metrics", "no valid token",
                r'metrics\["rollout_is_ratio_fraction_high"\] = exceeds_upper\.float\(\)\.mean\(\)\.item\(\)',
                "sequence_level")
#: the DP gather and the worker's metric chain of a metric marked MEAN (modelled on actor/pg_clipfrac): the marking's
_MEAN_MARKED = (r".", _PG_METRICS_MEAN[1], "", _PG_METRICS_MEAN[3])
#: a seq-mean step with a row that has no valid token (GSPO's draw: an aborted request's empty response, a row of
#: observation tokens only): agg_loss divides by the global_batch_size the trainer hands it (ppo_mini_batch_size,
#: every row), the defect sequence-level rejection shows; the step's site is ppo_loss, which hands it over
_SEQ_MEAN_EMPTY_ROW = (r"^(gradient of|metric pg_loss\b)[^,]*, seq-mean-", f"{CORE}:agg_loss",
                       "^a row with no valid token$")
OUTPUT_SITES = {"policy_step_metrics": (_PG_METRICS_MEAN, _SEQ_IS_ROWS, _SEQ_MEAN_EMPTY_ROW),
                "policy_step": (_SEQ_MEAN_EMPTY_ROW,), "policy_loss": (_PG_METRICS_MEAN,),
                "dp_metric_all_reduce": (_MEAN_MARKED,), "metric_pipeline": (_MEAN_MARKED,),
                # value_loss logs the critic's clip fraction as a plain float per micro-batch (averaged as they come)
                "value_loss": ((r"\bmetric vf_clipfrac\b", "verl.workers.utils.losses:value_loss", "micro-batch",
                                r'"critic/vf_clipfrac": vf_clipfrac\.detach\(\)\.item\(\)'),),
                # the function behind each output of compute_rollout_correction_and_rejection_mask (kept mask first)
                "rollout_rejection_mask": (
    ("^kept mask$", "verl.utils.torch_functional:masked_mean", "masked_mean"),
    ("^kept mask$", f"{RC}:compute_rollout_rejection_mask", ""),
    (r"^metric (kl|k3_kl|chi2_token|chi2_seq|training_ppl|rollout_ppl|log_ppl_diff|ppl_ratio)$",
     f"{RC}:compute_offpolicy_metrics", ""),
    (r"^metric is_", f"{RC}:compute_is_metrics", ""),
    (r"^metric rs_", f"{RC}:compute_rollout_rejection_mask", ""),
)}


#: an edge trigger that a configuration of verl produces on every step it rejects a sequence, keyed by the trigger
#: the checks read (Binding.variant_triggers): sequence-level rollout rejection (rollout_rs) writes the rejected
#: rows' response_mask to 0 (rollout_corr_helper.py: batch.batch["response_mask"] = modified_response_mask),
#: and the losses are then aggregated with global_batch_size = ppo_mini_batch_size, every sequence
_REJECTED_ROW = ("a row with no valid token, as sequence-level rollout rejection (rollout_rs) leaves every rejected "
                 "sequence: the trainer still counts it in global_batch_size = ppo_mini_batch_size")
VARIANT_TRIGGERS = {op: {"a row with no valid token": _REJECTED_ROW} for op in ("agg_loss", "policy_loss", "value_loss")}
# the step's own words for the same input (a row its rollout rejection removed), so that the step's normaliser
# counting that row joins agg_loss's defect
VARIANT_TRIGGERS.update({op: {"a row removed by rollout rejection": _REJECTED_ROW}
                         for op in ("policy_step", "policy_step_metrics")})
#: the configuration a variant sets, where it is the trigger of a failure seen on any input (Binding.variant_triggers)
VARIANT_TRIGGERS["outcome_advantage"] = {
    # compute_grpo_vectorized_outcome_advantage(…, norm_adv_by_std_in_grpo: bool = True, config=None) reads only
    # its keyword; ray_trainer.compute_advantage's non-GRPO branch passes the flag in config (AlgoConfig)
    "drgrpo+vectorized": "norm_adv_by_std_in_grpo=False (Dr. GRPO), passed in the AlgoConfig as the trainer "
                         "does: grpo_vectorized ignores config.norm_adv_by_std_in_grpo and divides by σ",
}


#: the faulty source line of an engine function whose failing and passing examples run the same lines
#: (Binding.fault_anchors): regular expressions resolved in the installed verl's source at run time, never
#: line numbers (rlconform.harness.core.fault_lines)
FAULT_ANCHORS = {  # engine function -> {kinds of failure (a regular expression) -> patterns of the faulty line}
    # a group of one sample: the leave-one-out baseline is replaced by an advantage of 0 (× (c > 1))
    "verl.trainer.ppo.core_algos.compute_rloo_vectorized_outcome_advantage": {
        "wrong value|implementations disagree": (r"\* \(c > 1\)\s*$",)},
    # grpo_vectorized reads its keyword norm_adv_by_std_in_grpo, never config.norm_adv_by_std_in_grpo
    "verl.trainer.ppo.core_algos.compute_grpo_vectorized_outcome_advantage": {
        "wrong value|implementations disagree": (r"^\s*if norm_adv_by_std_in_grpo:",)},
    # k1 = −log ratio, while the bounds are read as bounds of the ratio: asymmetric ones keep the inverse ratio
    "verl.trainer.ppo.rollout_corr_helper.compute_rollout_rejection_mask": {
        "wrong value": (r"token_k1: torch\.Tensor = -log_ratio_safe",
                        r"token_keep_bool = \(per_token_stat >= lower_log\)")},
    # logsumexp − Σ p·logits: cancels in bf16 / fp16, and 0 · (−inf) is NaN at a −inf logit
    "verl.utils.torch_functional.entropy_from_logits": {
        "wrong value|NaN|inf|inexact value": (r"entropy = torch\.logsumexp\(logits, dim=-1\) - torch\.sum\(",)},
    # Σ softmax · logits with the *unshifted* logits, then logits_max added back: in bf16 / fp16 the entropy
    # is a small difference of two numbers of the logits' size
    "verl.utils.megatron.tensor_parallel.vocab_parallel_entropy": {
        "wrong value|inexact value": (
            ("_VocabParallelEntropy.forward", r"sum_softmax_times_logits = mul_reduce\(softmax_logits, vocab_parallel_logits\)"),
            ("_VocabParallelEntropy.forward", r"entropy = logits_max \+ normalized_sum_exp_logits\.log\(\) - ")),
        # and at a −inf logit its softmax 0 times the logit −inf is NaN in that same product
        "NaN|inf": (("_VocabParallelEntropy.forward",
                     r"sum_softmax_times_logits = mul_reduce\(softmax_logits, vocab_parallel_logits\)"),)},
    "verl.utils.torch_functional.calculate_sum_pi_squared_from_logits": {
        "wrong value|NaN|inf|inexact value": (r"return torch\.exp\(torch\.logsumexp\(2\.0 \* logits",)},
    "verl.utils.torch_functional.entropy_from_logits_with_chunking": {
        "wrong value|NaN|inf|inexact value": (r"entropy_chunk = torch\.logsumexp\(logits_chunk, dim=-1\) - torch\.sum\(",)},
    # the seq-mean modes divide by the global_batch_size the trainer passes (ppo_mini_batch_size: every sequence,
    # fully masked ones included), while the same function without it counts only the sequences with a valid
    # token ("exclude fully masked sequences"); a masked NaN reaches the loss through loss_mat * loss_mask
    "verl.trainer.ppo.core_algos.agg_loss": {
        "wrong value|partition dependence": (r"loss = verl_F\.masked_sum\(seq_losses, seq_mask\) / global_batch_size",),
        "NaN|inf": (r"seq_losses = torch\.sum\(loss_mat \* loss_mask, dim=-1\)  # token-sum",
                    r"seq_losses = torch\.sum\(loss_mat \* loss_mask, dim=-1\) / \(seq_mask")},
    # the mean over micro-batches (and over DP ranks) of per-micro-batch means: exact only for equal token counts
    "verl.utils.metric.utils.reduce_metrics": {
        "partition dependence|wrong value": (r"metrics\[key\] = np\.mean\(val\)",)},
    "verl.utils.metric.utils.Metric.aggregate_dp": {
        "partition dependence|wrong value": (r"values=np\.mean\(value_arrays, axis=0\)",)},
    # per-sequence metrics averaged over every row, a row with no valid token (mean 0) included
    "verl.trainer.ppo.rollout_corr_helper.compute_offpolicy_metrics": {
        "wrong value": (r"training_ppl = torch\.exp\(-mean_log_prob_training\)\.mean\(\)",
                        r"rollout_ppl = torch\.exp\(-mean_log_prob_rollout\)\.mean\(\)",
                        r"chi2_seq = rho_squared_seq\.mean\(\) - 1\.0")},
    # ESS's mean + 1e-8: weights far below 1 are normalised by a mean of the 1e-8's size
    "verl.trainer.ppo.rollout_corr_helper.compute_is_metrics": {
        "wrong value|inexact value": (r"is_weights_normalized: torch\.Tensor = weights_for_ess / \(mean_for_ess \+ 1e-8\)",)},
    # masked positions are zeroed by multiplying with the mask: a NaN or inf there stays (NaN · 0 = NaN)
    "verl.utils.torch_functional.distributed_masked_mean": {
        "NaN|inf": (r"local_tensor = local_tensor \* local_mask",)},
    "verl.trainer.ppo.core_algos.compute_gae_advantage_return": {
        "NaN|inf": (r"nextvalues = values\[:, t\] \* response_mask\[:, t\]",
                    r"lastgaelam = lastgaelam_ \* response_mask\[:, t\]")},
    "verl.trainer.ppo.core_algos.compute_optimal_token_baseline_advantage": {
        # (the rewards are zero where masked: rewards_zero_outside_mask; old_log_probs and Σπ² are not)
        "NaN|inf": (r"w_cumulative = \(w_per_timestep \* response_mask\)",)},
    # GMPO's loss is the mean over the micro-batch's rows: with more than one micro-batch, the sum over
    # micro-batches the trainer makes is the number of micro-batches times the loss of the whole batch
    # (and a masked NaN reaches the row's ratio and advantage through · response_mask)
    "verl.trainer.ppo.core_algos.compute_policy_loss_geo_mean": {
        "partition dependence": (r"pg_loss = torch\.mean\(pg_losses\)",),
        "NaN|inf": (r"ratio = torch\.exp\(\(negative_approx_kl_min \* response_mask\)",
                    r"advantage = \(advantages \* response_mask\)\.sum")},
    "verl.trainer.ppo.core_algos.compute_policy_loss_gspo": {
        "NaN|inf": (r"negative_approx_kl_seq = torch\.sum\(negative_approx_kl \* response_mask",)},
    # exp of an unclamped log-ratio: inf past float32's 88.7, and −A · inf or 0 · inf is NaN
    "verl.trainer.ppo.core_algos.compute_policy_loss_clip_cov": {
        "NaN|inf": (r"^\s*ratio = torch\.exp\(negative_approx_kl\)",)},
    "verl.trainer.ppo.core_algos.compute_policy_loss_kl_cov": {
        "NaN|inf": (r"^\s*ratio = torch\.exp\(negative_approx_kl\)",)},
    # masked_sum in the values' dtype overflows fp16; the count's + 1e-8 moves a mean at a bound across it
    "verl.utils.torch_functional.masked_mean": {
        "NaN|inf": (r"s = masked_sum\(values, mask, axis\)",),
        "wrong value": (r"return s / \(mask\.sum\(axis=axis\) \+ 1e-8\)",)},
}


#: the entropy enters verl's loss only through the entropy bonus: ``ray_trainer`` computes it in the update step
#: when ``calculate_entropy or entropy_coeff != 0``, and always in the old-log-prob pass, which logs it
_ENTROPY_KNOB = {"knob": "actor_rollout_ref.actor.entropy_coeff", "default": "0",
                 "otherwise": "logging, the logged actor/entropy",
                 "why": "the entropy is in the loss only through the entropy bonus (entropy_coeff, default 0); "
                        "otherwise it is computed for the logged actor/entropy"}
#: Σπ² is computed in the old-log-prob pass only with ``calculate_sum_pi_squared`` (default False), for the
#: optimal_token_baseline estimators' path-variance weights (``ray_trainer._compute_old_log_prob``)
_SUM_PI_SQUARED_KNOB = {"knob": "actor_rollout_ref.actor.calculate_sum_pi_squared", "default": "False",
                        "otherwise": "not computed",
                        "why": "Σπ² is computed only with calculate_sum_pi_squared=True (default False), for the "
                               "optimal_token_baseline advantage estimators"}
IMPACT_KNOBS = {"entropy": _ENTROPY_KNOB, "vocab_parallel_entropy": _ENTROPY_KNOB,
                "sum_pi_squared": _SUM_PI_SQUARED_KNOB, "vocab_parallel_sum_pi_squared": _SUM_PI_SQUARED_KNOB}


binding = Binding(
    name="verl",
    impact_knobs=IMPACT_KNOBS,
    implementations=IMPLEMENTATIONS,
    variant_triggers=VARIANT_TRIGGERS,
    engine_dtypes=ENGINE_DTYPES,
    declared=DECLARED,
    output_sites=OUTPUT_SITES,
    fault_anchors=FAULT_ANCHORS,
    remedies=REMEDIES,
    configs={"defaults": verl_configs.defaults, "follows": verl_configs.FOLLOWS, "ops": verl_configs.ops(ROLLOUT_RS),
             "triggers": verl_configs.TRIGGERS, "sites": verl_configs.SITES, "derived": verl_configs.DERIVED,
             "twins": verl_configs.TWINS},
    version=_version(),
    ops={
        "entropy": Lazy(f"{TF}:entropy_from_logits"),
        "token_logprobs": Lazy(f"{TF}:logprobs_from_logits", adapt=_token_logprobs),
        "sum_pi_squared": Lazy(f"{TF}:calculate_sum_pi_squared_from_logits"),
        "masked_sum": Lazy(f"{TF}:masked_sum", adapt=functools.partial(_two_args, name="masked_sum")),
        "masked_mean": Lazy(f"{TF}:masked_mean", adapt=functools.partial(_two_args, name="masked_mean")),
        "masked_var": Lazy(f"{TF}:masked_var", adapt=_masked_var),
        "agg_loss": Lazy(f"{CORE}:agg_loss", adapt=_agg_loss),
        "optimal_token_baseline": Lazy(
            f"{CORE}:compute_optimal_token_baseline_advantage", adapt=_optimal_token_baseline
        ),
        "metric_pipeline": Lazy(loader=_metric_pipeline),
        "metric_statistics": Lazy(loader=_metric_statistics),
        "outcome_advantage": Lazy(loader=_outcome_advantage),
        "gae": Lazy(f"{CORE}:compute_gae_advantage_return", adapt=_gae),
        "masked_whiten": Lazy(f"{TF}:masked_whiten", adapt=_masked_whiten),
        "vocab_parallel_token_logprobs": _vocab_parallel(
            "vocab_parallel_log_probs_from_logits", "vocab_parallel_token_logprobs", with_labels=True),
        "vocab_parallel_entropy": _vocab_parallel("vocab_parallel_entropy", "vocab_parallel_entropy"),
        "vocab_parallel_sum_pi_squared": _vocab_parallel("vocab_parallel_sum_pi_squared",
                                                         "vocab_parallel_sum_pi_squared"),
        "dp_metric_all_reduce": Lazy(loader=_dp_metric_all_reduce),
        "cp_masked_mean": Lazy(loader=_cp_masked_mean),
        "fused_linear_token_stats": Lazy(loader=_fused_linear),
        "kl_estimator": Lazy(loader=_kl_estimator),
        "policy_loss": Lazy(loader=_policy_loss),
        "value_loss": Lazy(loader=_value_loss),
        "importance_ratio": Lazy(loader=_importance_ratio),
        "rollout_rejection_mask": Lazy(loader=_rollout_rejection_mask),
        "policy_step": Lazy(loader=_policy_step),
        "policy_step_metrics": Lazy(loader=_policy_step),
        "batch_metrics": Lazy(loader=_batch_metrics),
    },
    # verl computes Σπ² for the optimal token baseline only, as a detached statistic (compute_log_prob):
    # its gradient is not part of the contract (vocab_parallel_sum_pi_squared's raw all_reduce would make
    # it wrong at TP > 1), so only values are checked.
    # The rollout-correction IS weights are detached by design ("IS weights change the measure, not the
    # objective", rollout_corr_helper): their gradient is not part of the contract.
    forward_only=frozenset({"sum_pi_squared", "vocab_parallel_sum_pi_squared"}),
    detached=frozenset({"importance_ratio"}),  # rollout_corr_helper.py:625 rollout_is_weights.detach()
    notes={
        "entropy": "verl.utils.torch_functional.entropy_from_logits; entropy@chunked: entropy_from_logits_with_chunking "
        "(engine option; contract from its docstring: 2-D only, chunk_size drawn around boundaries; the docstring "
        "states no output dtype, so the output dtype is not checked).",
        "token_logprobs": "verl.utils.torch_functional.logprobs_from_logits(inplace_backward=True); without flash-attn "
        "this is logprobs_from_logits_v2 (the in-place flash-attn backward is CUDA-only); token_logprobs@naive: "
        "logprobs_from_logits_naive (ranks 2, 3); token_logprobs@rowwise: logprobs_from_logits_v2 (ranks 2, 3); "
        "neither docstring states an output dtype: not checked.",
        "sum_pi_squared": "verl.utils.torch_functional.calculate_sum_pi_squared_from_logits",
        "masked_sum": "verl.utils.torch_functional.masked_sum",
        "masked_mean": "verl.utils.torch_functional.masked_mean (denominator nnz + 1e-8)",
        "masked_var": "verl.utils.torch_functional.masked_var",
        "agg_loss": "verl.trainer.ppo.core_algos.agg_loss per micro-batch with dp_size, batch_num_tokens=global nnz, "
        "global_batch_size=all sequences of the mini-batch (ppo_mini_batch_size*n), loss_scale_factor; "
        "sum over micro-batches, mean over DP (FSDP engine)",
        "optimal_token_baseline": "verl.trainer.ppo.core_algos.compute_optimal_token_baseline_advantage (defaults)",
        "metric_pipeline": "actor/pg_clipfrac: masked_mean per micro-batch -> Metric(MEAN) -> append_to_dict -> "
        "allgather (in-process) -> TrainingWorker.train_mini_batch (from source: Metric.aggregate_dp, append_to_dict "
        "over mini-batches) -> rename_dict + reduce_metrics",
        "metric_statistics": "Metric(MEAN | SUM | MIN | MAX) per micro-batch (token mean by masked_mean, min / max by "
        "distillation compute_distillation_loss_range, sum / counts x dp_size for SUM, response lengths as "
        "metric_utils) -> append_to_dict -> allgather + Metric.aggregate_dp -> reduce_metrics",
        "vocab_parallel_token_logprobs": "verl.utils.megatron.tensor_parallel.vocab_parallel_log_probs_from_logits "
        "(= -megatron vocab_parallel_cross_entropy on parallel_state's TP group; fp32 shards overwritten in place)",
        "vocab_parallel_entropy": "verl.utils.megatron.tensor_parallel.vocab_parallel_entropy (parallel_state TP group; "
        "backward does sub_/add_ on the caller's logits; torch.compile'd mul_reduce: the first call per worker "
        "and dtype compiles, tens of seconds on CPU); vocab_parallel_entropy@chunked: "
        "vocab_parallel_entropy_with_chunking, ranks 2 and 3 from its docstring, which states no output dtype: "
        "not checked",
        "vocab_parallel_sum_pi_squared": "verl.utils.megatron.tensor_parallel.vocab_parallel_sum_pi_squared "
        "(parallel_state TP group; plain dist.all_reduce inside autograd: its gradient sees local sums)",
        "dp_metric_all_reduce": "actor/pg_clipfrac on real DP ranks: masked_mean -> Metric(MEAN) -> "
        "allgather_dict_into_dict over the DP group -> Metric.aggregate_dp -> reduce_metrics",
        "cp_masked_mean": "verl.utils.torch_functional.distributed_masked_mean(values, mask.to(values.dtype)) on the "
        "CP ranks: masked sum and count all-reduced over the default (world) group (the job's world = the CP group, "
        "with TP ranks holding the same shard); the mask in the values' dtype as rollout_corr_helper passes it",
        "fused_linear_token_stats": "verl.utils.experimental.torch_functional.FusedLinearForPPO(chunk_size, "
        "impl_backend='torch').forward(hidden, weight, labels, temperature); contract: ranks 2, 3, log-probs float32 (the "
        "source's comment); the entropy's dtype is stated nowhere: not checked",
        "kl_estimator": "verl.trainer.ppo.core_algos.kl_penalty(logprob, ref_logprob, name) (no mask)",
        "batch_metrics": "verl.trainer.ppo.metric_utils.compute_data_metrics(DataProto of the batch, use_critic) as "
        "RayPPOTrainer.fit calls it; num_turns/* and tool_call_counts/* (from non-tensor fields) are not compared",
        "policy_loss": "core_algos.get_policy_loss_fn(name) for every POLICY_LOSS_REGISTRY entry, "
        "loss_agg_mode='token-mean', global_batch_info of the mini-batch; micro-batch losses summed; metrics "
        "Metric(MEAN) per micro-batch -> aggregate_dp -> reduce_metrics",
        "value_loss": "core_algos.compute_value_loss(vpreds, returns, values, mask, cliprange_value=0.2, loss_agg_mode, "
        "dp_size, batch_num_tokens, global_batch_size, loss_scale_factor) per micro-batch, summed; critic/vf_clipfrac "
        "(a float per micro-batch) -> append_to_dict -> reduce_metrics (mean of micro-batch means)",
        "importance_ratio": "rollout_corr_helper.compute_rollout_correction_and_rejection_mask(old_log_prob=log_prob, "
        "rollout_log_prob=old_log_prob, rollout_is=token|sequence, rollout_is_threshold=2.0|5.0) -> "
        "rollout_is_weights (detached: forward-only)",
        "rollout_rejection_mask": "rollout_corr_helper.compute_rollout_correction_and_rejection_mask(old_log_prob=log_prob, "
        "rollout_log_prob=old_log_prob, response_mask=float mask, rollout_is='token', rollout_is_threshold=2.0, "
        "rollout_rs=<option>, rollout_rs_threshold=<spec>) -> modified response_mask and the rollout_corr/ metrics "
        "(rejected fractions, IS mean / ESS / raw high-low fractions, KL, k3-KL, chi2, perplexities)",
        "outcome_advantage": "core_algos.ADV_ESTIMATOR_REGISTRY as ray_trainer.compute_advantage calls it (uids as an "
        "object ndarray of str; AlgoConfig(gamma=1, lam=1, norm_adv_by_std_in_grpo); drgrpo = grpo with "
        "norm_adv_by_std_in_grpo=False; gdpo components through non_tensor_batch/batch); grpo_vectorized as "
        "grpo+vectorized / drgrpo+vectorized and rloo_vectorized as rloo+vectorized, called as the trainer's "
        "non-GRPO branch calls them (norm_adv_by_std_in_grpo only in the AlgoConfig)",
        "gae": "core_algos.compute_gae_advantage_return (gamma, lam as floats)",
        "masked_whiten": "verl.utils.torch_functional.masked_whiten (masked_mean with nnz + 1e-8; masked_var raises "
        "for nnz <= 1)",
        "policy_step": "RayPPOTrainer._compute_old_log_prob -> ActorRolloutRefWorker.compute_log_prob -> "
        "TrainingWorker.infer_batch -> FSDPEngine.forward_backward_batch (forward only) on the proximal model; "
        "RayPPOTrainer._update_actor -> TrainingWorker.train_mini_batch -> forward_backward_batch -> "
        "FSDPEngineWithLMHead.forward_step -> losses.ppo_loss (vanilla, or gspo for the GSPO variant); reduce_metrics "
        "(see verl_step.py)",
    },
)

# ------------------------------------------------------------------------------------ coverage
#: verl's numerics modules: every public function there is bound or justified in NOT_BOUND
NUMERICS_MODULES = (TF, "verl.utils.experimental.torch_functional", CORE, "verl.utils.metric", TPM,
                    "verl.workers.utils.losses")


def _import(name: str):
    """verl's Megatron helpers import megatron-core, which needs :func:`._compat.import_megatron`'s shim."""
    import importlib

    if "megatron" in name:
        from ._compat import import_megatron

        return import_megatron(name)
    return importlib.import_module(name)


def _policy_loss_registry():
    from verl.trainer.ppo import core_algos

    return dict(core_algos.POLICY_LOSS_REGISTRY)


def _adv_estimator_registry():
    from verl.trainer.ppo import core_algos

    return dict(core_algos.ADV_ESTIMATOR_REGISTRY)


def _kl_modes():
    """The names ``core_algos.kl_penalty`` accepts, read from the engine's code: the strings
    ``kl_penalty_forward`` compares its ``kl_penalty`` argument with, each also with the ``+`` suffix
    (``kl_penalty`` strips it and adds the straight-through k2 gradient)."""
    from verl.trainer.ppo import core_algos

    from rlconform.harness.catalog.coverage import compared_strings

    base = compared_strings(core_algos.kl_penalty_forward, "kl_penalty")
    return {name: None for name in base + [b + "+" for b in base]}


_NOT_NUMERICS = "not numerics: "
_LR = "optimizer-side, outside the RL objective: a learning-rate schedule (LambdaLR); no catalog op"
_MCORE_CFG = _NOT_NUMERICS + "builds Megatron ModelParallelConfig / parallel-layer keyword arguments"
#: every public function of :data:`NUMERICS_MODULES` that no op binds, with why. Registry entries
#: reuse the reasons the report gives for unchecked variants.
NOT_BOUND: dict[str, str] = {
    # ---- verl.utils.torch_functional
    f"{TF}.gather_from_labels": "torch.gather on the last dim (no arithmetic of its own); called by "
    "logprobs_from_logits_naive (bound as token_logprobs@naive)",
    f"{TF}.logprobs_from_logits_flash_attn": "called by logprobs_from_logits when flash-attn is installed (CUDA "
    "only); unreachable on the CPU machines the reports are made on",
    f"{TF}.logprobs_from_logits_torch_npu": "called by logprobs_from_logits on Ascend NPUs (torch_npu); unreachable "
    "on CPU",
    f"{TF}.clip_by_value": "elementwise torch.max(torch.min(x, hi), lo); called by compute_value_loss (bound as "
    "value_loss): "
    "no reduction or rounding of its own",
    f"{TF}.distributed_mean_max_min_std": "no catalog op yet: mean / max / min / std of already-selected values "
    "(no mask) all-reduced over the default (world) group; the distributed metric family binds DP reductions "
    "through a group (dp_metric_all_reduce); a world-group statistics op is left open",
    f"{TF}.allgather_dict_tensors": _NOT_NUMERICS + "all_gather of a dict of tensors and concatenation (data "
    "movement, no arithmetic)",
    f"{TF}.broadcast_dict_tensor": _NOT_NUMERICS + "broadcast of a dict of tensors",
    f"{TF}.split_dict_tensor_into_batches": _NOT_NUMERICS + "splits a TensorDict into batches",
    f"{TF}.expand_as_nested": _NOT_NUMERICS + "repeats a per-sequence tensor into a nested (jagged) layout",
    f"{TF}.get_response_mask": _NOT_NUMERICS + "builds the 0/1 response mask from EOS positions",
    f"{TF}.pad_2d_list_to_length": _NOT_NUMERICS + "pads token-id lists",
    f"{TF}.pad_sequence_to_length": _NOT_NUMERICS + "pads a tensor to a length",
    f"{TF}.postprocess_data": _NOT_NUMERICS + "tokenizer output padding / truncation",
    f"{TF}.tokenize_and_postprocess_data": _NOT_NUMERICS + "tokenization",
    f"{TF}.remove_pad_token": _NOT_NUMERICS + "strips padding from token ids",
    f"{TF}.get_unpad_data": _NOT_NUMERICS + "cu_seqlens / indices for flash-attn varlen",
    f"{TF}.prepare_decoder_attention_mask": _NOT_NUMERICS + "builds the causal attention mask",
    f"{TF}.log_probs_from_logits_response": "slices response logits and labels, then calls logprobs_from_logits "
    "(bound as token_logprobs); the slicing is layout, not arithmetic",
    f"{TF}.log_probs_from_logits_response_rmpad": "unpad / roll / pad around logprobs_from_logits (bound as "
    "token_logprobs); needs flash_attn.bert_padding (CUDA): unreachable on CPU",
    f"{TF}.log_probs_from_logits_all_rmpad": "pad around logprobs_from_logits (bound as token_logprobs); needs "
    "flash-attn or NPU pad_input: unreachable on CPU",
    f"{TF}.post_process_logits": "divides logits by the temperature in place (the sampling temperature); no catalog "
    "op yet for temperature scaling (a token-statistic input transform)",
    f"{TF}.compute_grad_norm": "optimizer-side, outside the RL objective: the global gradient L2 norm (logged); no "
    "catalog op",
    f"{TF}.get_cosine_schedule_with_warmup": _LR,
    f"{TF}.get_constant_schedule_with_warmup": _LR,
    f"{TF}.get_wsd_schedule_with_warmup": _LR,
    f"{TF}.check_device_is_available": _NOT_NUMERICS + "a device-availability context manager",
    f"{TF}.use_original_torch_compile": _NOT_NUMERICS + "a context manager restoring torch.compile",
    # ---- verl.trainer.ppo.core_algos
    f"{CORE}.AdvantageEstimator": _NOT_NUMERICS + "the enum of estimator names (the registry entries are listed "
    "separately)",
    f"{CORE}.register_adv_est": _NOT_NUMERICS + "the registration decorator of ADV_ESTIMATOR_REGISTRY",
    f"{CORE}.get_adv_estimator_fn": _NOT_NUMERICS + "registry lookup (the binding calls it to fetch each estimator)",
    f"{CORE}.register_policy_loss": _NOT_NUMERICS + "the registration decorator of POLICY_LOSS_REGISTRY",
    f"{CORE}.get_policy_loss_fn": _NOT_NUMERICS + "registry lookup (the binding calls it to fetch each loss)",
    f"{CORE}.AdaptiveKLController.update": "no catalog op yet: the adaptive KL coefficient (Ziegler et al. 2019, "
    "proportional controller on the observed KL; KL / loss family)",
    f"{CORE}.FixedKLController.update": _NOT_NUMERICS + "a no-op: the coefficient stays fixed",
    f"{CORE}.get_kl_controller": _NOT_NUMERICS + "builds a KL controller from the config",
    f"{CORE}.kl_penalty_forward": "called by kl_penalty (bound as kl_estimator[*]) for every mode; the modes are "
    "listed as 'kl_penalty modes' entries",
    f"{CORE}.compute_rewards": "no catalog op yet: token rewards minus kl_ratio · (log π_old − log π_ref) (k1 KL "
    "in the reward; KL family)",
    f"{CORE}.compute_entropy_loss": "entropy_from_logits (bound as entropy) then agg_loss (bound as agg_loss); the "
    "composition has no op of its own ('for backward compatibility' per its docstring)",
    f"{CORE}.compute_policy_loss": "deprecated in verl 0.9.1 (@deprecated -> compute_policy_loss_vanilla, bound as "
    "policy_loss[vanilla]); not in POLICY_LOSS_REGISTRY",
    f"{CORE}.compute_policy_loss_reinforce": "called by compute_policy_loss_bypass_mode for "
    "rollout_correction.loss_type='reinforce' (not the default); no catalog variant yet for REINFORCE with "
    "rollout IS weights (policy-loss family)",
    f"{CORE}.compute_pf_ppo_reweight_data": "no catalog op yet: PF-PPO score-weighted resampling of a batch "
    "(a sampling step on a DataProto, not a tensor formula the catalog models)",
    # ---- verl.utils.metric
    "verl.utils.metric.utils.Metric.append": "called by Metric.__init__ / extend, which the bound metric_pipeline "
    "and metric_statistics run (Metric.from_dict, Metric(aggregation, value) with every value type, append_to_dict): "
    "reached through them, not bound on its own",
    "verl.utils.metric.utils.Metric.extend": "called by Metric.append for a Metric value (append_to_dict over "
    "micro-batches in the bound metric_pipeline)",
    "verl.utils.metric.utils.Metric.init_list": "called by verl.utils.py_functional.append_to_dict in the bound "
    "metric_pipeline: an empty Metric of the same aggregation",
    "verl.utils.metric.utils.Metric.aggregate": "not reached on the worker path: Metric.aggregate_dp (bound: "
    "metric_pipeline, metric_statistics) folds every Metric before reduce_metrics, which calls aggregate only for "
    "a Metric that skipped the DP gather; both run the same Metric._aggregate (np.mean / np.sum / np.min / np.max), "
    "checked for all four AggregationTypes by metric_statistics through aggregate_dp",
    # ---- verl.utils.megatron.tensor_parallel
    f"{TPM}.update_kwargs_with_config": _MCORE_CFG,
    f"{TPM}.get_default_kwargs_for_model_parallel_config": _MCORE_CFG,
    f"{TPM}.get_default_model_parallel_config": _MCORE_CFG,
    f"{TPM}.get_common_default_kwargs_for_parallel_linear": _MCORE_CFG,
    f"{TPM}.get_default_kwargs_for_column_parallel_linear": _MCORE_CFG,
    f"{TPM}.get_default_kwargs_for_row_parallel_linear": _MCORE_CFG,
    f"{TPM}.get_default_kwargs_for_parallel_embedding": _MCORE_CFG,
    f"{TPM}.is_tensor_parallel_param": _NOT_NUMERICS + "reads a parameter attribute",
    f"{TPM}.get_tensor_parallel_partition_dim": _NOT_NUMERICS + "reads a parameter attribute",
    f"{TPM}.get_tensor_parallel_partition_stride": _NOT_NUMERICS + "reads a parameter attribute",
    f"{TPM}.vocab_parallel_log_probs_from_logits_response_rmpad": "unpad / roll / pad around "
    "vocab_parallel_log_probs_from_logits (bound as vocab_parallel_token_logprobs); needs flash-attn: "
    "unreachable on CPU",
    # ---- verl.workers.utils.losses
    "verl.workers.utils.losses.sft_loss": "no catalog op yet: the SFT negative log-likelihood over a TensorDict "
    "(token-mean over the DP group); the RL catalog has no supervised loss",
    "verl.workers.utils.losses.value_loss": "the critic wrapper around compute_value_loss (bound as value_loss, "
    "driven per micro-batch as this wrapper calls it): a TensorDict adapter with no arithmetic of its own",
}
RCH = "verl.trainer.ppo.rollout_corr_helper"
_RS_CALLED = ("checked by op rollout_rejection_mask: called by compute_rollout_correction_and_rejection_mask "
              "(bound) for every rollout_rejection_mask finding")
_DISTILL = ("not yet bound: on-policy distillation loss (teacher top-k log-probs vs the student's log-softmax); "
            "the catalog has no distillation / forward-KL op yet")
_ENGINE_OUT = ("not yet bound: the training engine's model-output post-processing (calls logprobs_from_logits / "
               "entropy_from_logits / calculate_sum_pi_squared_from_logits, bound as token_logprobs, entropy, "
               "sum_pi_squared, on the model's logits, and wires which of them are computed: verl PR #6153's Σπ²); "
               "needs a model forward and a TensorDict micro-batch")
_FWD_BWD = "model forward: the engine's forward-backward over micro-batches (model call, loss_fn, all_reduce of metrics)"
_FIT = "not numerics on its own: the trainer loop (it calls the bound advantage / loss / metric functions)"
_HF_TRITON = "model forward: a patched HF model forward returning log-probs / entropy from the fused Triton kernel"
NOT_BOUND.update({
    # ---- found by whole-package discovery, outside NUMERICS_MODULES
    f"{RCH}.compute_rollout_rejection_mask": _RS_CALLED,
    f"{RCH}.compute_rs_metrics": _RS_CALLED + " (its per-option keys are listed unchecked)",
    f"{RCH}.compute_is_metrics": _RS_CALLED + " (rollout_is='token')",
    f"{RCH}.compute_offpolicy_metrics": _RS_CALLED,
    f"{RCH}.compute_rollout_correction_weights": "checked by op importance_ratio: called by "
    "compute_rollout_correction_and_rejection_mask (bound) for every importance_ratio finding",
    "verl.trainer.distillation.megatron.losses.vocab_parallel_log_softmax": "not yet bound: log-softmax over TP "
    "vocab shards (MAX then SUM all_reduce of exp over the TP group); needs megatron parallel_state's TP group "
    "and a catalog op returning the full log-softmax (vocab_parallel_token_logprobs takes labels)",
    "verl.trainer.distillation.megatron.losses._VocabParallelKLDivergence.forward": _DISTILL + " (TP vocab shards)",
    "verl.trainer.distillation.megatron.losses._VocabParallelKLDivergence.backward": _DISTILL + " (its gradient)",
    "verl.trainer.distillation.fsdp.losses.compute_forward_kl_topk": _DISTILL,
    "verl.trainer.distillation.fsdp.losses.kl_divergence": _DISTILL + " (elementwise p·(log p − log q))",
    "verl.trainer.distillation.losses.compute_forward_kl_topk": _DISTILL + " (registry entry, dispatches to the "
    "FSDP / Megatron implementation)",
    "verl.trainer.distillation.losses.compute_distillation_loss_reverse_kl_estimator": _DISTILL + " (reverse KL "
    "through kl_penalty, bound as kl_estimator)",
    "verl.trainer.distillation.losses.distillation_loss": _DISTILL + " (the wrapper: agg_loss of the per-token loss)",
    "verl.trainer.ppo.metric_utils.compute_variance_proxy_metrics": "not yet bound: gradient-variance proxy "
    "metrics from Σπ² and advantages (a logged metric; the Σπ² it reads is bound as sum_pi_squared)",
    "verl.trainer.ppo.ray_trainer.apply_kl_penalty": "not yet bound: the KL penalty in the reward, token scores − "
    "β·kl_penalty(old, ref)·mask, and its masked_mean metric (kl_penalty and masked_mean are bound as "
    "kl_estimator and masked_mean); no catalog op for the reward transform",
    "verl.trainer.ppo.ray_trainer.RayPPOTrainer.fit": _FIT,
    "verl.trainer.ppo.prefix_grouper_utils.pg_forward": "model forward: prefix-shared forward returning log-probs "
    "via logprobs_from_logits (bound as token_logprobs)",
    "verl.trainer.sft_trainer.SFTTrainer.fit": _FIT + " (SFT)",
    "verl.experimental.fully_async_policy.fully_async_trainer.FullyAsyncTrainer.fit_step": _FIT,
    "verl.experimental.one_step_off_policy.ray_trainer.OneStepOffRayTrainer.fit_step": _FIT,
    "verl.experimental.separation.ray_trainer.SeparateRayPPOTrainer.fit_step": _FIT,
    "verl.utils.debug.metrics.calculate_debug_metrics": "not yet bound: debug metrics of rollout vs actor "
    "log-prob differences (logged only, behind a debug flag)",
    "verl.utils.megatron.router_replay_patch.patched_routing": "model forward: Megatron MoE router patched to "
    "replay recorded routing decisions (softmax / sigmoid scores)",
    "verl.utils.seqlen_balancing.rearrange_micro_batches": _NOT_NUMERICS + "partitions a batch into micro-batches "
    "(all_reduce MAX of the micro-batch count)",
    "verl.utils.dynamic_cp_scheduler.postprocess_dynamic_cp_batch": _NOT_NUMERICS + "gathers CP-scheduled outputs "
    "back into batch order",
    "verl.utils.megatron.router_replay_utils.pp_gather": _NOT_NUMERICS + "gathers MoE router decisions over PP ranks",
    "verl.workers.config.distillation.DistillationTeacherModelConfig.validate_and_prepare_for_distillation":
    _NOT_NUMERICS + "config validation",
    "verl.workers.engine.fsdp.transformer_impl.FSDPEngineWithLMHead.prepare_model_outputs": _ENGINE_OUT,
    "verl.workers.engine.automodel.transformer_impl.AutomodelEngineWithLMHead.prepare_model_outputs": _ENGINE_OUT,
    "verl.workers.engine.torchtitan.transformer_impl.TorchTitanEngineWithLMHead.prepare_model_outputs": _ENGINE_OUT,
    "verl.workers.engine.fsdp.transformer_impl.FSDPEngine.forward_backward_batch": _FWD_BWD,
    "verl.workers.engine.automodel.transformer_impl.AutomodelEngine.forward_backward_batch": _FWD_BWD,
    "verl.workers.engine.megatron.transformer_impl.MegatronEngine.forward_backward_batch": _FWD_BWD,
    "verl.workers.engine.torchtitan.transformer_impl.TorchTitanEngine.forward_backward_batch": _FWD_BWD,
    "verl.workers.engine.veomni.transformer_impl.VeOmniEngine.forward_backward_batch": _FWD_BWD,
    "verl.models.transformers.dense_common.forward_with_triton_backend": _HF_TRITON,
    "verl.models.transformers.glm4v.forward_with_triton_backend": _HF_TRITON,
    "verl.models.transformers.qwen2_vl.forward_with_triton_backend": _HF_TRITON,
    "verl.models.transformers.qwen3_5.forward_with_triton_backend": _HF_TRITON,
    "verl.models.transformers.qwen3_vl.forward_with_triton_backend": _HF_TRITON,
})
#: whole subpackages discovery reads that are not the RL objective; a name above takes precedence
NOT_BOUND_UNDER: dict[str, str] = {
    "verl.models.": "model forward: model definitions and patches (attention, MoE routing, packed-sequence "
    "layout), not the RL objective",
    "verl.utils.kernel.": "kernel: needs CUDA: the Triton kernels behind linear_cross_entropy (bound: "
    "fused_linear_token_stats@triton, checked with --device cuda) and the fp8 kernels (not the RL objective)",
    "verl.workers.rollout.": "not in the RL objective: rollout-server generation (sampling log-probs are inputs "
    "of importance_ratio)",
    "verl.checkpoint_engine.": _NOT_NUMERICS + "weight synchronisation between trainer and rollout",
    "verl.model_merger.": _NOT_NUMERICS + "checkpoint conversion",
    "verl.utils.profiler.": _NOT_NUMERICS + "timing / profiling statistics",
}
NOT_BOUND.update({f"{CORE}.POLICY_LOSS_REGISTRY[{k!r}]": v for k, v in POLICY_LOSS_UNCHECKED.items()})
NOT_BOUND.update({f"{CORE}.ADV_ESTIMATOR_REGISTRY[{k!r}]": v for k, v in VERL_UNCHECKED.items()
                  if k not in ("gae", "optimal_token_baseline")})  # those two are ops of their own: bound
NOT_BOUND.update({f"{CORE}.kl_penalty modes[{k!r}]": v for k, v in KL_UNCHECKED.items()})

COVERAGE = Coverage(
    modules=NUMERICS_MODULES,
    registries={f"{CORE}.POLICY_LOSS_REGISTRY": _policy_loss_registry,
                f"{CORE}.ADV_ESTIMATOR_REGISTRY": _adv_estimator_registry,
                f"{CORE}.kl_penalty modes": _kl_modes},
    registry_ops={f"{CORE}.POLICY_LOSS_REGISTRY": "policy_loss", f"{CORE}.ADV_ESTIMATOR_REGISTRY": "outcome_advantage",
                  f"{CORE}.kl_penalty modes": "kl_estimator"},
    not_bound=NOT_BOUND,
    importer=_import,
    not_bound_under=NOT_BOUND_UNDER,
)
binding.coverage = COVERAGE
