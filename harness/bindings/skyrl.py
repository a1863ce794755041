"""SkyRL 0.4.0 (``skyrl``, the SkyRL-train backend) bound to the op catalog
(install: ``install/engines.sh PY skyrl``; imports go through :mod:`._compat` for Python 3.11).

==========================  =======================================================================
op                          SkyRL callable (adapter semantics)
==========================  =======================================================================
metric_pipeline             the policy entropy through SkyRL's own code (:func:`_metric_pipeline`):
                            ``PolicyWorkerBase._forward_backward_micro`` on a stand-in worker (0.4.0:
                            ``masked_mean(entropy, loss_mask).item()``) -> ``worker_utils.reduce_metrics``
                            -> ``worker_utils.all_reduce_metrics`` (DP) -> the trainer's
                            ``_execute_training_step`` and ``train_critic_and_policy`` (from source).
                            In 0.4.0 a mean of per-micro-batch / per-rank means: “mean of per-shard means”.
agg_loss                    the policy-loss reduction (:func:`_agg_loss`): the trainer pre-scales the
                            per-token loss with ``ppo_utils.apply_loss_reduction_to_advantages_minibatch``
                            over the whole mini-batch, each micro-batch reduces with
                            ``ppo_utils.reduce_loss`` (masked sum) and backpropagates it times
                            ``dp_size``; gradient accumulation sums, DP averages.
entropy                     ``utils.torch_utils.chunked_entropy_from_logits(logits[B,S,V],
                            requires_grad=True)`` (``-Σ exp(logp)·logp`` with ``logp = log_softmax``,
                            in the input dtype); what the FSDP model wrapper logs as entropy
token_logprobs              ``utils.torch_utils.logprobs_from_logits(logits, labels)`` (verl's v2 path
                            without flash-attn)
masked_mean                 ``utils.torch_utils.masked_mean(values, mask)`` (``/ clamp(nnz, 1)``)
masked_var                  ``utils.ppo_utils.masked_var(values, mask, unbiased)``
kl_estimator                ``ppo_utils.compute_approx_kl(logprob, ref, loss_mask=mask,
                            kl_estimator_type=k1|abs|k2|k3)``
policy_loss                 every ``ppo_utils.PolicyLossRegistry`` entry (:func:`_policy_loss`):
                            advantages pre-scaled for ``token_mean`` over the mini-batch, loss =
                            the registered function's masked sum (``cross_entropy`` ignores the
                            advantages: its plain masked sum, compared token-sum, a declared
                            convention); metrics folded by ``worker_utils.reduce_metrics``
value_loss                  ``ppo_utils.ppo_critic_loss`` x ``b / B`` per micro-batch (:func:`_value_loss`):
                            variants ``seq-mean-token-mean`` (value_clip 0.2) and ``unclipped``
importance_ratio            ``off_policy_correction_utils.compute_tis_ratio`` token / sequence TIS
                            (:func:`_importance_ratio`; detached)
rollout_rejection_mask      ``off_policy_correction_utils.compute_off_policy_correction`` with one token /
                            product / geometric / outlier-token mask (:func:`_rollout_rejection_mask`)
outcome_advantage           ``ppo_utils.AdvantageEstimatorRegistry`` read at run time; each estimator
                            called through ``ppo_utils.compute_advantages_and_returns`` as the trainer
                            calls it (:func:`_trainer_call`); ``gae`` listed unchecked (its own op)
gae                         the same call with ``adv_estimator="gae"``, γ and λ in the config
masked_whiten               ``utils.ppo_utils.masked_whiten(values, mask, shift_mean)``
==========================  =======================================================================

For the distributed tests, :func:`dp_all_reduce_metrics` runs SkyRL's real ``all_reduce_metrics``
over a real process group (gloo on CPU, with :func:`._compat.skyrl_cuda_device_on_cpu`); the op
``dp_metric_all_reduce`` (:func:`_dp_metric_all_reduce`) drives it from each DP rank's token values.
"""

from __future__ import annotations

import functools
import importlib.metadata
import math
from collections import defaultdict

from rlconform.harness.catalog.binding import AggLoss, Binding, Coverage, Declared, Implementation, Lazy, MetricPipeline
from rlconform.harness.catalog.engine_site import calls

from . import skyrl_configs
from ._compat import accepted_keywords, import_skyrl, skyrl_cuda_device_on_cpu
from .skyrl_remedies import REMEDIES

WORKER_UTILS = "skyrl.backends.skyrl_train.workers.worker_utils"
TORCH_UTILS = "skyrl.backends.skyrl_train.utils.torch_utils"
PPO_UTILS = "skyrl.backends.skyrl_train.utils.ppo_utils"
_OPC = "skyrl.backends.skyrl_train.utils.off_policy_correction_utils"
STRATEGY = "skyrl.backends.skyrl_train.distributed.strategy"

ENTROPY_KEY = "policy_entropy"
FINAL_ENTROPY_KEY = "policy/policy_entropy"


def _version() -> str | None:
    try:
        return importlib.metadata.version("skyrl")
    except importlib.metadata.PackageNotFoundError:
        return None


def _skyrl(module: str, attr: str | None = None):
    mod = import_skyrl(module)
    return getattr(mod, attr) if attr else mod


# ------------------------------------------------------------------------------ DP all-reduce
class _InProcessDPStrategy:
    """Stands in for SkyRL's ``DistributedStrategy`` when the DP ranks are simulated in one process.

    ``all_reduce_metrics`` (called unchanged, once, with rank 0's dict) routes each key to
    ``strategy.all_reduce(sub_dict, op=...)``; this object answers with what every rank would hold
    after ``DistributedStrategy.all_reduce`` (strategy.py) ran on all ranks: each rank turns its
    Python float into ``torch.Tensor([v])`` (float32); ``op="mean"`` divides it in place by the DP
    world size and all-reduces with SUM; ``"min"``/``"max"``/``"sum"`` all-reduce with that op; the
    result comes back with ``.item()``. The SUM is accumulated in float32 in rank order (gloo's ring
    order may differ in the last bit for more than two ranks). A key missing on some rank would make
    the real collectives mismatch; here it raises ``KeyError``.
    """

    def __init__(self, rank_dicts: list[dict]):
        self.rank_dicts = rank_dicts
        self.world_size = len(rank_dicts)

    def all_reduce(self, data, op="mean", group=None):
        import torch

        assert op in ("mean", "max", "sum", "min")
        out = {}
        for key in data:
            per_rank = []
            for rank, metrics in enumerate(self.rank_dicts):
                if key not in metrics:
                    raise KeyError(f"metric {key!r} missing on DP rank {rank}: SkyRL's all-reduce would mismatch")
                value = metrics[key]
                is_tensor = isinstance(value, torch.Tensor)
                t = value if is_tensor else torch.Tensor([value])
                if op == "mean":
                    t = t / self.world_size  # the real code does `data /= group_size` on its own copy
                per_rank.append((t, is_tensor))
            acc = per_rank[0][0].clone()
            for t, _ in per_rank[1:]:
                if op in ("mean", "sum"):
                    acc += t
                elif op == "max":
                    acc = torch.maximum(acc, t)
                else:
                    acc = torch.minimum(acc, t)
            out[key] = acc if per_rank[0][1] else acc.item()
        return out


def dp_all_reduce_metrics(metrics: dict, group=None, sum_loss_metrics: bool = True) -> dict:
    """SkyRL's real ``all_reduce_metrics`` over a real process group (every DP rank calls it).

    The strategy is SkyRL's own ``DistributedStrategy.all_reduce`` bound to a minimal object (the
    class is abstract; ``all_reduce`` only reads ``world_size``, used when ``group`` is None). On a
    CPU machine it runs under :func:`._compat.skyrl_cuda_device_on_cpu`.
    """
    import types

    import torch.distributed as dist

    worker_utils = _skyrl(WORKER_UTILS)
    strategy_cls = _skyrl(STRATEGY, "DistributedStrategy")
    strategy = types.SimpleNamespace(world_size=dist.get_world_size())
    def all_reduce(data, op="mean", group=None):
        return strategy_cls.all_reduce(strategy, data, op=op, group=group)

    strategy.all_reduce = all_reduce
    with skyrl_cuda_device_on_cpu():
        return worker_utils.all_reduce_metrics(metrics, strategy, group=group, sum_loss_metrics=sum_loss_metrics)


def _dp_metric_all_reduce():
    """The policy entropy metric on real DP ranks (op ``dp_metric_all_reduce``): each rank logs
    ``masked_mean(entropy, loss_mask).item()`` for its one micro-batch, ``worker_utils.reduce_metrics``
    folds the micro-batches, and the real ``all_reduce_metrics`` runs over the DP group
    (:func:`dp_all_reduce_metrics`): a mean of per-rank means (SkyRL issue #1822; “mean of per-shard means” / “mean of ratios across DP ranks”)."""
    worker_utils = _skyrl(WORKER_UTILS)
    masked_mean = _skyrl(TORCH_UTILS, "masked_mean")

    def dp_metric_all_reduce(local_values, local_mask, group):
        micro = {ENTROPY_KEY: masked_mean(local_values, local_mask).item()}
        local = worker_utils.reduce_metrics({k: [v] for k, v in micro.items()}, sum_loss_metrics=True)
        return dp_all_reduce_metrics(local, group=group, sum_loss_metrics=True)[ENTROPY_KEY]

    dp_metric_all_reduce.__qualname__ = "skyrl.dp_metric_all_reduce"
    return dp_metric_all_reduce


# ------------------------------------------------------------------------------ metric pipeline
WORKER = "skyrl.backends.skyrl_train.workers.worker"
TRAINER = "skyrl.train.trainer"

#: what :func:`_metric_pipeline` does not run of SkyRL's own code, shown on every finding of the
#: op (``transcribed``) and in the coverage table
METRIC_PIPELINE_TRANSCRIBED = (
    "PolicyWorkerBase.forward_backward's micro-batch loop (collect each micro-batch's dict into lists, drop "
    "loss_fn_outputs, reduce_metrics(sum_loss_metrics=True), all_reduce_metrics over the DP group) is "
    "transcribed: its SampleBasedBatchIterator cuts equal-size micro-batches, so the checked partitions "
    "cannot be fed through it; the functions it calls are SkyRL's own")


class _FakeEntropyModel:
    """Stands in for SkyRL's ``HFModelWrapper`` in ``_forward_backward_micro``: called as
    ``model(sequences, num_actions, ..., return_output=True, compute_entropy=True)``, it returns log-probs
    ``[b, num_actions]`` (zeros; the policy loss and backward are irrelevant to the entropy metric) and
    ``{"entropy": [b, num_actions + 1]}``, the case's token values placed where the worker slices them
    (``entropy_BS[:, -num_actions - 1 : -1]``)."""

    def __init__(self):
        self.entropy = None

    def train(self, mode: bool = True):
        return self

    def __call__(self, sequences, num_actions, **kwargs):
        import torch

        values = self.entropy
        b = values.shape[0]
        full = torch.cat([values, values.new_zeros(b, 1)], dim=1)
        return torch.zeros(b, num_actions, dtype=torch.float32), {"entropy": full}


def _stand_in_worker(dp_size: int):
    """A stand-in ``self`` for ``PolicyWorkerBase._forward_backward_micro``: SkyRL's own default
    ``AlgorithmConfig`` (KL and entropy losses off, as the defaults a trainer logs ``policy_entropy`` with),
    the registered policy loss of its ``policy_loss_type``, a no-op ``strategy.backward``, a scheduler with
    learning rate 0."""
    import types

    worker = _skyrl(WORKER)
    config = import_skyrl("skyrl.train.config")
    algorithm = config.AlgorithmConfig()
    for name, value in (("use_kl_loss", False), ("use_entropy_loss", False)):
        if hasattr(algorithm, name):
            setattr(algorithm, name, value)
    return types.SimpleNamespace(
        model=_FakeEntropyModel(), cfg=types.SimpleNamespace(algorithm=algorithm), optimizer=None,
        policy_loss_fn=worker.PolicyLossRegistry.get(algorithm.policy_loss_type),
        mesh_rank=types.SimpleNamespace(dp_size=dp_size),
        strategy=types.SimpleNamespace(backward=lambda loss, model, optimizer: None),
        scheduler=types.SimpleNamespace(get_last_lr=lambda: [0.0]))


def _experience(values, mask):
    """A ``replay_buffer.Experience`` of one micro-batch ``[b, T]``: ``loss_mask`` is the case's mask, the
    sequences ``[b, T + 1]`` zeros, old log-probs and advantages zeros, no rollout log-probs, no response mask
    (0.4's ``response_mask`` is 0.2 / 0.3's ``action_mask``: whichever field the release's dataclass has)."""
    import torch

    replay_buffer = import_skyrl("skyrl.train.dataset.replay_buffer")
    b, T = values.shape
    fields = dict(sequences=torch.zeros(b, T + 1, dtype=torch.long), action_log_probs=torch.zeros(b, T),
                  base_action_log_probs=None, values=None, returns=None, advantages=torch.zeros(b, T),
                  attention_mask=torch.ones(b, T + 1, dtype=torch.long), loss_mask=mask, response_mask=None,
                  action_mask=None,
                  rollout_logprobs=None, rollout_expert_indices=None, num_actions=T, info={}, metadata={})
    return replay_buffer.Experience(**accepted_keywords(replay_buffer.Experience, fields))


class _StagedStatus(dict):
    """What ``dispatch.forward_backward_from_staged`` returns, in either release's form: SkyRL ≥ 0.3 reads a
    ``WorkerOutput``'s ``.metrics``, 0.2.0's ``_execute_training_step`` iterates the status dict itself
    (``for k, v in status.items()``); this is both (the stand-in fits the release)."""

    @property
    def metrics(self) -> dict:
        return dict(self)


def _stand_in_trainer(minis=None, reduced=None):
    """A stand-in ``self`` for ``RayPPOTrainer._execute_training_step`` / ``train_critic_and_policy``: one
    epoch; ``dispatch`` hands back each mini-batch's DP-reduced dict as ``forward_backward_from_staged``'s
    ``WorkerOutput.metrics`` and ``optim_step`` returns None (no grad norm); ``_normalize_advantages`` is the
    identity (the advantages do not reach the metric)."""
    import types

    data = types.SimpleNamespace(metadata={"policy_mini_batch_boundaries": list(range(len(minis or [])))})
    dispatch = types.SimpleNamespace(
        stage_data=lambda model, data, boundaries: list(minis or []),
        forward_backward_from_staged=lambda model, metrics: _StagedStatus(metrics),
        optim_step=lambda model: None, empty_cache=lambda: None)
    trainer = types.SimpleNamespace(
        cfg=types.SimpleNamespace(trainer=types.SimpleNamespace(update_epochs_per_batch=1)), dispatch=dispatch,
        _normalize_advantages=lambda data, boundaries, prompt_boundaries=None: data, has_critic=False,
        all_timings={}, all_metrics={}, global_step=0)
    trainer._execute_training_step = lambda model, data: dict(reduced)
    return trainer, data


@functools.cache
def _policy_step():
    """SkyRL's trainer step from the batch to the gradient: :mod:`.skyrl_step` (built once: both step ops use it)."""
    from .skyrl_step import policy_step

    return policy_step()


def _metric_pipeline() -> MetricPipeline:
    """The policy entropy metric, from worker to logger, through the installed SkyRL's own code (a fork's fix is what gets checked).

    * emit: ``PolicyWorkerBase._forward_backward_micro`` (workers/worker.py), the real method, on a stand-in
      worker (:func:`_stand_in_worker`) whose model (:class:`_FakeEntropyModel`) returns the micro-batch's
      token values as the entropy: 0.4.0 logs ``{"policy_entropy": masked_mean(entropy_BS, loss_mask).item()}``
      with the loss and its metrics; every key it logs is followed (``loss_fn_outputs`` dropped, as
      ``forward_backward`` does).
    * reduce_micro: ``worker_utils.reduce_metrics(all_metrics, sum_loss_metrics=True)`` over the micro-batches'
      dicts collected into lists (``forward_backward``'s loop: transcribed, see
      :data:`METRIC_PIPELINE_TRANSCRIBED`).
    * reduce_dp: ``worker_utils.all_reduce_metrics(result, strategy, sum_loss_metrics=True)``, the real
      function, with :class:`_InProcessDPStrategy` standing in for the DP collectives.
    * reduce_mini: ``RayPPOTrainer._execute_training_step`` (train/trainer.py: the mini-batch loop,
      ``reduce_metrics(sum_loss_metrics=False)``, its ``finalize_*`` derivations), compiled from the installed
      source by :func:`.source.engine_function` (``trainer.py`` / ``trainer_utils.py`` do not import without
      ``torchdata`` and the generator stack), on :func:`_stand_in_trainer`.
    * finalize: ``RayPPOTrainer.train_critic_and_policy``, likewise: every key logged as ``policy/<key>``.

    0.4.0 logs a mean of per-micro-batch / per-rank / per-mini-batch means (“mean of per-shard means”; SkyRL issue #1822,
    fixed upstream by its sum/count PR). With TokenBasedBatchIterator SkyRL pads DP ranks with
    fully masked micro-batches; they log entropy 0.0 and are averaged in (“empty micro-batch counted”).

    Raises ``ModuleNotFoundError`` / ``AttributeError`` when the installed SkyRL has no such worker method or
    trainer function (a binding error of this op).
    """
    import warnings

    from .source import engine_function

    worker_utils = _skyrl(WORKER_UTILS)
    forward_backward_micro = _skyrl(WORKER, "PolicyWorkerBase")._forward_backward_micro
    execute_training_step = engine_function(TRAINER, "RayPPOTrainer._execute_training_step", import_skyrl)
    train_critic_and_policy = engine_function(TRAINER, "RayPPOTrainer.train_critic_and_policy", import_skyrl)

    def emit(values, mask, info=None):
        info = info or {"dp_size": 1, "num_micro_batches": 1}
        worker = _stand_in_worker(info["dp_size"])
        worker.model.entropy = values
        with skyrl_cuda_device_on_cpu(), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="CUDA is not available", category=UserWarning)
            status = forward_backward_micro(worker, _experience(values, mask), 1.0 / info["num_micro_batches"])
        status.pop("loss_fn_outputs", None)
        return status

    def _collect(dicts):
        all_metrics = defaultdict(list)
        for metrics in dicts:
            for k, v in metrics.items():
                all_metrics[k].append(v)
        return all_metrics

    def reduce_micro(micro_dicts):
        return worker_utils.reduce_metrics(_collect(micro_dicts), sum_loss_metrics=True)

    def reduce_dp(rank_dicts):
        strategy = _InProcessDPStrategy(list(rank_dicts))
        return worker_utils.all_reduce_metrics(dict(rank_dicts[0]), strategy, group=None, sum_loss_metrics=True)

    def reduce_mini(mini_dicts):
        trainer, data = _stand_in_trainer(minis=mini_dicts)
        return execute_training_step(trainer, "policy", data)

    def finalize(metrics):
        trainer, data = _stand_in_trainer(reduced=metrics)
        train_critic_and_policy(trainer, data)
        return trainer.all_metrics

    return MetricPipeline(
        emit=emit,
        reduce_micro=reduce_micro,
        reduce_dp=reduce_dp,
        reduce_mini=reduce_mini,
        finalize=finalize,
        stats={"mean": FINAL_ENTROPY_KEY},
        emitted_to_final=lambda key: f"policy/{key}",
        transcribed=METRIC_PIPELINE_TRANSCRIBED,
    )


# ------------------------------------------------------------------------------ metric statistics
#: catalog statistic -> SkyRL metric key. SkyRL's reducers pick the statistic by key: ``_max`` -> max,
#: ``_min`` -> min, ``loss`` / ``_loss`` -> sum (worker level, ``sum_loss_metrics=True``: over micro-batches
#: and over DP; the trainer then averages mini-batches), anything else -> mean. The token min / max / mean
#: are ``compute_minibatch_rollout_logprob_diff_metrics``'s own keys; a sum or a count can only be logged
#: under the ``_loss`` convention (SkyRL has no other summing key).
SKYRL_STATISTICS = {
    "mean": "minibatch_rollout_logprobs_abs_diff_mean", "min": "minibatch_rollout_logprobs_abs_diff_min",
    "max": "minibatch_rollout_logprobs_abs_diff_max", "sum": "token_sum_loss", "count": "num_tokens_loss",
    "len_mean": "response_length_mean", "len_min": "response_length_min", "len_max": "response_length_max",
    "n_seq": "num_seqs_loss",
}


def _metric_statistics() -> MetricPipeline:
    """Every statistic SkyRL 0.4.0's metric reducers handle, along :func:`_metric_pipeline`'s path
    (``reduce_metrics(sum_loss_metrics=True)`` over micro-batches, the real ``all_reduce_metrics`` over DP
    with :class:`_InProcessDPStrategy`, the trainer's ``reduce_metrics`` over mini-batches, ``policy/``;
    the trainer's ``finalize_minibatch_rollout_logprob_diff_std``, which replaces the ``sq_mean`` key by a
    std, is not applied: the emitted second moment is followed as it is reduced).

    * emit: ``worker_utils.compute_minibatch_rollout_logprob_diff_metrics(action_log_probs=values,
      rollout_logprobs=0, loss_mask)`` — the engine's per-micro-batch token mean, ``sq_mean``, min and max
      of ``|Δ log π|`` (= the non-negative values), the loss mask in the values' dtype as the trainer holds
      it; a token sum in SkyRL's masked idiom (``(values * loss_mask).sum().item()``, the numerator of
      ``torch_utils.masked_mean``; SkyRL has no masked sum), the token count and the number of sequences
      (``int``), sequence lengths' mean / min / max (``loss_mask`` row sums).
    * the value type of the case is what the reducers receive (``reduce_metrics`` keeps only ``int`` /
      ``float`` values and prints the others; ``strategy.all_reduce`` turns every number into
      ``torch.Tensor([v])``, float32).
    """
    worker_utils = _skyrl(WORKER_UTILS)
    pipe = _metric_pipeline()
    emitter = worker_utils.compute_minibatch_rollout_logprob_diff_metrics
    k = SKYRL_STATISTICS

    def emit(values, mask):
        import torch

        loss_mask = mask.to(values.dtype)
        out = dict(emitter(values, torch.zeros_like(values), loss_mask))
        out[k["sum"]] = (values * loss_mask).sum().item()
        out[k["count"]] = int(mask.bool().sum().item())
        lengths = mask.bool().sum(-1)
        out[k["len_mean"]] = lengths.double().mean().item()
        out[k["len_min"]] = int(lengths.min().item())
        out[k["len_max"]] = int(lengths.max().item())
        out[k["n_seq"]] = int(mask.shape[0])
        return out

    sq_mean = "minibatch_rollout_logprobs_abs_diff_sq_mean"
    def reduce_mini(mini_dicts):  # the trainer's reduce_metrics, without its finalize_* derivations
        all_metrics = defaultdict(list)
        for metrics in mini_dicts:
            for key, value in metrics.items():
                all_metrics[key].append(value)
        return worker_utils.reduce_metrics(all_metrics, sum_loss_metrics=False)

    def finalize(metrics):
        return {f"policy/{key}": value for key, value in metrics.items()}

    return MetricPipeline(
        emit=emit, reduce_micro=pipe.reduce_micro, reduce_dp=pipe.reduce_dp, reduce_mini=reduce_mini,
        finalize=finalize, stats={stat: f"policy/{key}" for stat, key in k.items()},
        transcribed="the trainer's stages (RayPPOTrainer._execute_training_step's fold over mini-batches, "
        "train_critic_and_policy's 'policy/' prefix) are transcribed: reduce_metrics(sum_loss_metrics=False) is "
        "called directly, without finalize_minibatch_rollout_logprob_diff_std (the sq_mean key is followed as "
        "reduced); the emitted token sum, count and lengths are SkyRL's idioms, not a SkyRL function",
        emitted_to_final={key: f"policy/{key}" for key in list(k.values()) + [sq_mean]})


# ------------------------------------------------------------------------------------ agg_loss
#: catalog mode -> SkyRL ``trainer.algorithm.loss_reduction``. SkyRL has no token-sum or
#: seq-mean-token-sum; its "token_mean_legacy" (per-micro-batch token mean, averaged) and
#: "prompt_mean" have no catalog mode.
SKYRL_MODES = {
    "token-mean": "token_mean",
    "seq-mean-token-mean": "sequence_mean",
    "seq-mean-token-sum-norm": "seq_mean_token_sum_norm",
}


def _agg_loss() -> AggLoss:
    """SkyRL's policy-loss reduction, per micro-batch.

    SkyRL normalises the *advantages* once per mini-batch (``RayPPOTrainer._normalize_advantages`` ->
    ``ppo_utils.apply_loss_reduction_to_advantages_minibatch`` over the whole mini-batch, before it is
    sharded over DP), then every policy loss ends with ``ppo_utils.reduce_loss`` (the masked *sum*),
    and the worker backpropagates ``policy_loss * dp_size`` per micro-batch (gradient accumulation
    sums; DP averages gradients). The per-token loss is linear in the advantage, so the harness's
    per-token loss takes the advantage's place.

    The catalog calls this per micro-batch with the mini-batch's totals in ``info``; SkyRL's
    mini-batch function needs the mini-batch itself. The adapter calls it on the micro-batch's rows
    followed by zero-advantage "context" rows standing for the rest of the mini-batch: as many rows as
    the mini-batch has sequences beyond this micro-batch (``info.global_batch_size - b``), of width T,
    holding ``info.global_nnz - nnz(micro-batch)`` unmasked tokens. The real function then sees the
    mini-batch's batch size and token count, and the micro-batch's rows come back scaled exactly as in
    SkyRL; the context rows are dropped. ``max_seq_len`` (required by SkyRL for
    seq_mean_token_sum_norm) is ``info.loss_scale_factor``, or T when that is None.
    """
    import torch

    apply_reduction = _skyrl(PPO_UTILS, "apply_loss_reduction_to_advantages_minibatch")
    reduce_loss = _skyrl(PPO_UTILS, "reduce_loss")

    def loss(loss_mat, mask, mode, info):
        reduction = SKYRL_MODES[mode]
        b, T = loss_mat.shape
        local_nnz = int((mask != 0).sum())
        ctx_rows = max(info.global_batch_size - b, 0)
        ctx_nnz = max(int(info.global_nnz) - local_nnz, 0)
        if reduction == "token_mean" and ctx_rows * T < ctx_nnz:
            ctx_rows = math.ceil(ctx_nnz / max(T, 1))  # row count is irrelevant for token_mean
        ctx_mask = torch.zeros(ctx_rows * T, dtype=mask.dtype, device=mask.device)
        ctx_mask[:ctx_nnz] = 1
        ctx_mask = ctx_mask.view(ctx_rows, T)
        ctx_adv = torch.zeros(ctx_rows, T, dtype=loss_mat.dtype, device=loss_mat.device)
        scaled = apply_reduction(
            advantages=torch.cat([loss_mat, ctx_adv]),
            loss_mask=torch.cat([mask, ctx_mask]),
            loss_reduction=reduction,
            micro_batch_size=b,
            max_seq_len=info.loss_scale_factor if info.loss_scale_factor is not None else T,
        )[:b]
        policy_loss = reduce_loss(scaled, mask)
        return policy_loss * info.dp_size  # grad_sum_correction_factor (workers/worker.py)

    loss.__qualname__ = "skyrl.agg_loss"
    return AggLoss(loss=loss, modes=tuple(SKYRL_MODES), micro_combine="sum", dp_combine="mean")


# ------------------------------------------------------------------------ KL and policy losses
def _kl_estimator():
    """``ppo_utils.compute_approx_kl`` for each ``kl_estimator_type`` it accepts, with the loss mask."""
    from rlconform.harness.catalog.binding import Variants

    fn = _skyrl(PPO_UTILS, "compute_approx_kl")

    def bind(name):
        def kl(logprob, ref_logprob, mask):
            return fn(logprob, ref_logprob, loss_mask=mask, kl_estimator_type=name)

        kl.__qualname__ = f"skyrl.compute_approx_kl[{name}]"
        return kl

    return Variants({n: bind(n) for n in ("k1", "abs", "k2", "k3")})


#: SkyRL registry name -> [(catalog variant, AlgorithmConfig overrides)]
POLICY_LOSS_NAMES = {
    "regular": [("ppo_clip", {})],
    "dual_clip": [("vanilla", {})],
    "gspo": [("gspo", {})],
    "sapo": [("sapo", {})],
    "cispo": [("cispo", {"cispo": {"cispo_eps_clip_low": 0.2, "cispo_eps_clip_high": 0.2}})],
    "rollout_is": [("rollout_is", {})],
    "dppo": [("dppo_binary_tv", {"dppo": {"dppo_type": "binary_tv", "delta_low": 0.2, "delta_high": 0.2}}),
             ("dppo_binary_kl", {"dppo": {"dppo_type": "binary_kl", "delta_low": 0.2, "delta_high": 0.2}})],
    "clip_cov": [("clip_cov", {"clip_cov": {"clip_ratio": 1.0, "clip_cov_lb": 1.0, "clip_cov_ub": 5.0}})],
    "kl_cov": [("kl_cov", {"kl_cov": {"kl_cov_frac": 0.2, "ppo_kl_coef": 1.0}})],
    "cross_entropy": [("cross_entropy", {})],
    "importance_sampling": [("importance_sampling", {})],
}
#: SkyRL metric key -> catalog key
_METRIC_KEYS = {"clip_ratio": "pg_clipfrac", "cispo/ratio_mean": "ratio_mean",
                "cispo/ratio_clamped_mean": "ratio_clamped_mean", "importance_ratio": "ratio_mean"}


def _scale_for_minibatch(apply_reduction, values, mask, reduction, info):
    """``apply_loss_reduction_to_advantages_minibatch`` on a micro-batch's rows followed by zero "context"
    rows standing for the rest of the mini-batch (see :func:`_agg_loss`); the micro-batch's rows back."""
    import torch

    b, T = values.shape
    local_nnz = int((mask != 0).sum())
    ctx_rows = max(info.global_batch_size - b, 0)
    ctx_nnz = max(int(info.global_nnz) - local_nnz, 0)
    if reduction == "token_mean" and ctx_rows * T < ctx_nnz:
        ctx_rows = math.ceil(ctx_nnz / max(T, 1))  # row count is irrelevant for token_mean
    ctx_mask = torch.zeros(ctx_rows * T, dtype=mask.dtype, device=mask.device)
    ctx_mask[:ctx_nnz] = 1
    ctx_mask = ctx_mask.view(ctx_rows, T)
    ctx_adv = torch.zeros(ctx_rows, T, dtype=values.dtype, device=values.device)
    return apply_reduction(
        advantages=torch.cat([values, ctx_adv]),
        loss_mask=torch.cat([mask, ctx_mask]),
        loss_reduction=reduction,
        micro_batch_size=b,
        max_seq_len=info.loss_scale_factor if info.loss_scale_factor is not None else T,
    )[:b]


def _policy_loss():
    """Every loss of ``ppo_utils.PolicyLossRegistry`` (``list_available()`` at run time), bound to its
    catalog variant(s) or listed unchecked.

    As the trainer does: the advantages are pre-scaled for ``loss_reduction="token_mean"`` over the
    mini-batch (``apply_loss_reduction_to_advantages_minibatch``, driven as in :func:`_agg_loss`), the
    registered function returns the masked *sum* (``reduce_loss``), times ``dp_size`` (1). Config:
    ``AlgorithmConfig(policy_loss_type=name)`` with the catalog's parameters (clip 0.2/0.2, c = 3, cispo
    clip 0.2/0.2, dppo δ 0.2, clip_cov ratio 1, kl_cov frac 0.2 / coef 1). ``rollout_logprobs`` =
    old_log_prob (rollout_is and dppo read the behaviour policy from it; no off-policy correction is
    configured). The loss mask is passed in the log-probs' dtype. Metric keys are renamed to the
    catalog's (``clip_ratio`` -> ``pg_clipfrac``, ...); micro-batch metrics fold with
    ``worker_utils.reduce_metrics(..., sum_loss_metrics=True)`` (a mean of micro-batch means).
    """
    import dataclasses as dc

    from rlconform.harness.catalog.binding import LossVariants

    ppo_utils = _skyrl(PPO_UTILS)
    worker_utils = _skyrl(WORKER_UTILS)
    AlgorithmConfig = _skyrl("skyrl.train.config", "AlgorithmConfig")
    registry = ppo_utils.PolicyLossRegistry

    def config(name, overrides):
        c = AlgorithmConfig(policy_loss_type=name, eps_clip_low=0.2, eps_clip_high=0.2, clip_ratio_c=3.0,
                            loss_reduction="token_mean")
        for k, v in overrides.items():
            c = dc.replace(c, **{k: dc.replace(getattr(c, k), **v)})
        return c

    def bind(name, overrides):
        fn = registry.get(name)
        cfg = config(name, overrides)

        def loss(old_log_prob, log_prob, advantages, response_mask, info):
            # the registry entry this variant runs (``regular`` and ``dual_clip`` share one function and differ
            # only in the config's policy_loss_type; the coverage table tells them apart by this name)
            if cfg.policy_loss_type != name:
                raise RuntimeError(f"config for {cfg.policy_loss_type!r} bound to registry entry {name!r}")
            m = response_mask.to(log_prob.dtype)
            adv = _scale_for_minibatch(ppo_utils.apply_loss_reduction_to_advantages_minibatch, advantages, m,
                                       "token_mean", info)
            value, metrics = fn(log_prob, old_log_prob, adv, config=cfg, loss_mask=m,
                                rollout_logprobs=old_log_prob)
            return value * info.dp_size, {_METRIC_KEYS.get(k, k): v for k, v in metrics.items()}

        loss.__qualname__ = f"skyrl.policy_loss[{name}]"
        return loss

    # a wrong logged metric is located at the fold (a mean of the micro-batches' means), not at the loss
    @calls(worker_utils.reduce_metrics)
    def combine_metrics(parts):
        collected = defaultdict(list)
        for metrics, _ in parts:
            for k, v in metrics.items():
                collected[k].append(v)
        return worker_utils.reduce_metrics(collected, sum_loss_metrics=True)

    impls, unchecked = {}, {}
    for name in registry.list_available():
        if name in POLICY_LOSS_NAMES:
            for variant, overrides in POLICY_LOSS_NAMES[name]:
                impls[variant] = bind(name, overrides)
        else:
            unchecked[name] = "registered in SkyRL; no catalog variant"
    # cross_entropy returns the plain sum of −log π over the loss mask: its callers pre-scale the mask (the SFT
    # collators by 1 / the batch's valid tokens, Tinker's weights as given): a declared convention
    # (cross_entropy_weighted_sum), the reference aggregates it token-sum (CROSS_ENTROPY_AGG_MODES)
    return LossVariants(impls, unchecked=unchecked, combine_metrics=combine_metrics,
                        agg_modes={v: m for v, m in CROSS_ENTROPY_AGG_MODES.items() if v in impls})


# ---------------------------------------------------------------------------------- token ops
# ---------------------------------------------------------------------- value loss, TIS ratios
#: catalog variant of ``value_loss`` -> SkyRL ``AlgorithmConfig.value_clip`` (SkyRL's only aggregation is the
#: mean over the micro-batch's rows of per-row token means: catalog ``seq-mean-token-mean``)
VALUE_LOSS_VARIANTS = {"seq-mean-token-mean": 0.2, "unclipped": None}


def _value_loss():
    """``ppo_utils.ppo_critic_loss(values, old_values, returns, config, loss_mask)`` as
    ``CriticWorkerBase._forward_backward_micro`` calls it: the loss is ½·(1/b)·Σ_rows masked row means of
    the micro-batch (empty rows count 0), scaled by ``microbatch_weight = b / B`` (token-based batching;
    the fixed-size path divides the accumulated gradient by the number of micro-batches instead, the
    same for equal micro-batches). ``values_clipfrac`` (catalog ``vf_clipfrac``: a token mean over the
    micro-batch) is folded by ``worker_utils.reduce_metrics`` (a mean of micro-batch means). The loss mask
    is passed in vpreds' dtype, as the trainer holds it."""
    import dataclasses as dc

    from rlconform.harness.catalog.binding import LossVariants

    fn = _skyrl(PPO_UTILS, "ppo_critic_loss")
    worker_utils = _skyrl(WORKER_UTILS)
    AlgorithmConfig = _skyrl("skyrl.train.config", "AlgorithmConfig")

    def bind(variant, clip):
        cfg = dc.replace(AlgorithmConfig(), value_clip=clip)

        def value_loss(vpreds, values, returns, response_mask, info):
            m = response_mask.to(vpreds.dtype)
            loss, clipfrac = fn(vpreds, values, returns, config=cfg, loss_mask=m)
            loss = loss * (vpreds.shape[0] / max(info.global_batch_size, 1))
            return loss, ({} if clipfrac is None else {"vf_clipfrac": clipfrac})

        value_loss.__qualname__ = f"skyrl.ppo_critic_loss[value_clip={clip}]"
        return value_loss

    @calls(worker_utils.reduce_metrics)  # vf_clipfrac's fold: a mean of micro-batch means
    def combine_metrics(parts):
        collected = defaultdict(list)
        for metrics, _ in parts:
            for k, v in metrics.items():
                collected[k].append(v)
        return worker_utils.reduce_metrics(collected)

    return LossVariants({v: bind(v, clip) for v, clip in VALUE_LOSS_VARIANTS.items()},
                        combine_metrics=combine_metrics)


#: catalog variant of ``importance_ratio`` -> SkyRL ``off_policy_correction.tis_ratio_type``
TIS_VARIANTS = {"token_tis": "token", "sequence_tis": "sequence"}
#: OffPolicyCorrectionConfig fields that configure the TIS weight itself (every other field is a mask)
_TIS_FIELDS = ("tis_ratio_type", "token_tis_ratio_clip_high", "sequence_tis_ratio_clip_high")


def _importance_ratio():
    """``off_policy_correction_utils.compute_tis_ratio(old_log_probs, rollout_logprobs, loss_mask,
    tis_ratio_type, off_policy_correction)`` with ``old_log_probs`` = the catalog's log_prob,
    ``rollout_logprobs`` = its old_log_prob, the default caps (token 2.0, sequence 5.0); the sequence
    ratio ([B, 1]) is broadcast over the row (how ``apply_off_policy_correction`` multiplies it). The
    weights are detached by design (the op is bound ``detached``: a gradient to log_prob fails). Every other ``OffPolicyCorrectionConfig`` field (read
    at run time: sequence / outlier-token / token masks) is listed unchecked."""
    import dataclasses as dc

    from rlconform.harness.catalog.binding import Variants

    fn = _skyrl("skyrl.backends.skyrl_train.utils.off_policy_correction_utils", "compute_tis_ratio")
    cfg = _skyrl("skyrl.train.config", "OffPolicyCorrectionConfig")()

    def bind(kind):
        def importance_ratio(log_prob, old_log_prob, mask):
            ratio, _ = fn(log_prob, old_log_prob, mask.to(log_prob.dtype), kind, cfg)
            return ratio.expand_as(log_prob)

        importance_ratio.__qualname__ = f"skyrl.compute_tis_ratio[{kind}]"
        return importance_ratio

    unchecked = {f"off_policy_correction.{f.name}": "a rejection mask (sequences/tokens dropped), not an IS weight: "
                 "checked by op rollout_rejection_mask" for f in dc.fields(cfg) if f.name not in _TIS_FIELDS}
    return Variants({v: bind(k) for v, k in TIS_VARIANTS.items()}, unchecked=unchecked)


#: catalog variant of ``rollout_rejection_mask`` -> the OffPolicyCorrectionConfig fields that enable it, and
#: SkyRL's metric key of the rejected fraction -> the catalog's diagnostic
SKYRL_RS = {
    "token_k1": ({"token_mask_is_threshold_low": 0.5, "token_mask_is_threshold_high": 2.0},
                 {"token_mask_ratio": "rs_masked_fraction"}),
    "token_k1_asym": ({"token_mask_is_threshold_low": 0.5, "token_mask_is_threshold_high": 1.5},
                      {"token_mask_ratio": "rs_masked_fraction"}),
    "seq_sum_k1": ({"sequence_mask_metric": "product", "product_mask_low": 0.2, "product_mask_high": 5.0},
                   {"product_sequence_mask_masked_ratio": "rs_seq_masked_fraction"}),
    "seq_mean_k1": ({"sequence_mask_metric": "geometric", "geo_mask_low": 0.8, "geo_mask_high": 1.25},
                    {"geo_sequence_mask_masked_ratio": "rs_seq_masked_fraction"}),
    "seq_all_k1": ({"outlier_token_is_threshold_low": 0.5, "outlier_token_is_threshold_high": 2.0},
                   {"outlier_seq_masked_ratio": "rs_seq_masked_fraction"}),
}


def _rollout_rejection_mask():
    """``off_policy_correction_utils.compute_off_policy_correction(old_log_probs, rollout_logprobs, loss_mask,
    off_policy_correction)`` (the driver ``apply_off_policy_correction`` calls) with ``old_log_probs`` = the
    catalog's log_prob, ``rollout_logprobs`` = its old_log_prob, a float loss mask, no TIS and one mask enabled
    per variant (:data:`SKYRL_RS`: token mask, product / geometric sequence mask, outlier-token mask); the kept
    mask is the returned loss_mask, the metric SkyRL's rejected fraction of that mask. SkyRL has no k2 / k3
    divergence filters (verl's token_k2 ... seq_max_k3) and no chaining of two filters of one kind: those
    catalog variants are not provided."""
    import dataclasses as dc

    from rlconform.harness.catalog.binding import Variants

    fn = _skyrl(OPC, "compute_off_policy_correction")
    config = _skyrl("skyrl.train.config", "OffPolicyCorrectionConfig")

    def bind(variant, fields, keys):
        cfg = dc.replace(config(), **fields)

        def rollout_rejection_mask(log_prob, old_log_prob, mask):
            _, metrics, kept = fn(log_prob, old_log_prob, mask.to(log_prob.dtype), cfg)
            return kept, {name: metrics[key] for key, name in keys.items() if key in metrics}

        rollout_rejection_mask.__qualname__ = f"skyrl.compute_off_policy_correction[{variant}]"
        return rollout_rejection_mask

    unchecked = {"is_ratio_mean / is_ratio_std / is_ratio_max / is_ratio_min": "compute_off_policy_correction's IS "
                 "ratio statistics over (is_ratio * loss_mask), padding zeros included in std / min: no catalog "
                 "metric yet", "outlier_seq_over_high_ratio / *_under_low_ratio": "per-side row fractions: no "
                 "catalog metric yet"}
    return Variants({v: bind(v, *spec) for v, spec in SKYRL_RS.items()}, unchecked=unchecked)


def _entropy():
    fn = _skyrl(TORCH_UTILS, "chunked_entropy_from_logits")

    def entropy(logits):
        # SkyRL takes [batch, seqlen, vocab]; other shapes are viewed as [1, N, V] (a view when
        # contiguous) and the result is viewed back.
        if logits.dim() == 3:
            return fn(logits, requires_grad=True)
        lead = logits.shape[:-1]
        out = fn(logits.reshape(1, -1, logits.shape[-1]), requires_grad=True)
        return out.reshape(lead)

    entropy.__qualname__ = "skyrl.entropy"
    return entropy


def _token_logprobs():
    fn = _skyrl(TORCH_UTILS, "logprobs_from_logits")

    def token_logprobs(logits, labels):
        return fn(logits, labels)

    token_logprobs.__qualname__ = "skyrl.token_logprobs"
    return token_logprobs


def _masked_mean():
    fn = _skyrl(TORCH_UTILS, "masked_mean")

    def masked_mean(values, mask):
        return fn(values, mask)

    masked_mean.__qualname__ = "skyrl.masked_mean"
    return masked_mean


def _masked_var():
    fn = _skyrl(PPO_UTILS, "masked_var")

    def masked_var(values, mask, unbiased):
        return fn(values, mask, unbiased=unbiased)

    masked_var.__qualname__ = "skyrl.masked_var"
    return masked_var


# ---------------------------------------------------------------------------------- advantages
#: SkyRL registry name -> the catalog variants of ``outcome_advantage`` it implements.
SKYRL_ESTIMATORS = {"grpo": ("grpo", "drgrpo"), "rloo": ("rloo",), "maxrl": ("maxrl",),
                    "reinforce++": ("reinforce_plus_plus",)}
#: why a registered name is not a variant of ``outcome_advantage`` (anything else: "not in the catalog").
SKYRL_UNCHECKED = {"gae": "a critic-value estimator: checked as op 'gae'"}


def _algorithm_config(**fields):
    return _skyrl("skyrl.train.config", "AlgorithmConfig")(**fields)


def _trainer_call(estimator: str, cfg, token_level_rewards, response_mask, index, values=None):
    """``ppo_utils.compute_advantages_and_returns`` exactly as ``RayPPOTrainer.compute_advantages_and_returns``
    calls it (non-step-wise): ``response_mask`` int64 as the trainer holds it, ``index`` =
    ``metadata["uids"]`` (a list of str), γ, λ and
    ``grpo_norm_by_std`` from the algorithm config."""
    import torch

    fn = _skyrl(PPO_UTILS, "compute_advantages_and_returns")
    # dataset/preprocess.py builds response_mask as int64 (np.int64 -> torch.from_numpy)
    return fn(token_level_rewards=token_level_rewards, response_mask=response_mask.to(torch.int64),
              index=[str(u) for u in index], adv_estimator=estimator, config=cfg, values=values,
              gamma=cfg.gamma, lambd=cfg.lambd, grpo_norm_by_std=cfg.grpo_norm_by_std)


def _registered(name: str):
    """The estimator function ``AdvantageEstimatorRegistry`` holds under ``name`` (the engine callable the
    report names; None when the registry cannot say)."""
    try:
        return _skyrl(PPO_UTILS, "AdvantageEstimatorRegistry").get(name)
    except Exception:  # noqa: BLE001 - only the report's engine site depends on it
        return None


def _skyrl_estimator(name: str, variant: str):
    """``outcome_advantage[variant]`` through the trainer's call of registry entry ``name`` with
    ``AlgorithmConfig(advantage_estimator=name, gamma=1, lambd=1, grpo_norm_by_std=variant != "drgrpo")``
    (ε: the estimators' default 1e-6); no critic (``values=None``)."""
    cfg = _algorithm_config(advantage_estimator=name, gamma=1.0, lambd=1.0, grpo_norm_by_std=variant != "drgrpo")

    def outcome_advantage(token_level_rewards, response_mask, index):
        return _trainer_call(name, cfg, token_level_rewards, response_mask, index)

    outcome_advantage.__qualname__ = f"skyrl.outcome_advantage[{variant}]({name})"
    return calls(_registered(name))(outcome_advantage)


def _outcome_advantage():
    """``ppo_utils.AdvantageEstimatorRegistry.list_available()`` as read now: every name bound
    (:data:`SKYRL_ESTIMATORS`) or listed unchecked with its reason."""
    from rlconform.harness.catalog.binding import Variants

    registry = _skyrl(PPO_UTILS, "AdvantageEstimatorRegistry")
    impls, unchecked = {}, {}
    for name in registry.list_available():
        if name in SKYRL_ESTIMATORS:
            impls.update({v: _skyrl_estimator(name, v) for v in SKYRL_ESTIMATORS[name]})
        else:
            unchecked[name] = SKYRL_UNCHECKED.get(name, "not in the catalog (a new or fork-only estimator)")
    return Variants(impls, unchecked=unchecked)


def _gae():
    estimator = "gae"  # the AdvantageEstimatorRegistry entry (held in the closure: the coverage table reads it)

    def gae(token_level_rewards, values, response_mask, gamma, lam):
        cfg = _algorithm_config(advantage_estimator=estimator, gamma=gamma, lambd=lam)
        uids = [str(i) for i in range(token_level_rewards.shape[0])]
        return _trainer_call(estimator, cfg, token_level_rewards, response_mask, uids, values=values)

    gae.__qualname__ = "skyrl.gae"
    return calls(_registered(estimator))(gae)


def _masked_whiten():
    fn = _skyrl(PPO_UTILS, "masked_whiten")

    def masked_whiten(values, mask, shift_mean):
        return fn(values, mask, shift_mean=shift_mean)

    masked_whiten.__qualname__ = "skyrl.masked_whiten"
    return masked_whiten


#: the dtypes SkyRL's trainer calls each op with. ``model_wrapper.py`` takes ``output["logits"]``
#: in the model's dtype (bf16 under FSDP mixed precision, fp32 otherwise) into ``logprobs_from_logits`` and
#: ``chunked_entropy_from_logits``; the log-probs feed the policy loss, KL and TIS ratios; rewards,
#: advantages, masks' statistics, values and metrics are fp32. Never float64 or float16.
LOGITS_DTYPES = ("float32", "bfloat16")
ENGINE_DTYPES = {
    **{op: LOGITS_DTYPES for op in ("entropy", "token_logprobs", "policy_loss", "kl_estimator", "importance_ratio",
                                    "agg_loss", "value_loss")},
    **{op: ("float32",) for op in ("masked_mean", "masked_var", "masked_whiten", "outcome_advantage", "gae",
                                   "rollout_rejection_mask",
                                   "metric_pipeline", "metric_statistics", "dp_metric_all_reduce")},
}


# ----------------------------------------------------------- declared conventions, preconditions, guards
def _nnz(case, key: str = "mask", cleared: bool = False) -> int:
    """Valid tokens of the mask SkyRL is handed for ``case``; ``cleared``: the reductions family's mask_invariant
    clears the last bit of an all-valid mask (:mod:`rlconform.harness.families.reductions`; the advantage
    families append a masked column instead, which leaves the count as it is)."""
    import numpy as np

    if key not in case.inputs:  # a generated real-shapes input: thousands of tokens
        return 1 << 30
    m = np.asarray(case.inputs[key]).astype(bool)
    return int(m.sum()) - int(cleared and case.property == "mask_invariant" and m.size > 0 and bool(m.all()))


#: masked_var's two messages (ppo_utils.py:137 on 0 valid tokens, :141 on 1)
_MASKED_VAR_RAISES = r"At least one element in the mask has to be 1|The sum of the mask is one"
#: the loss_agg_mode the reference aggregates a SkyRL policy loss with where it is not the catalog's token-mean
#: (LossVariants.agg_modes): cross_entropy's plain masked sum (declared: cross_entropy_weighted_sum)
CROSS_ENTROPY_AGG_MODES = {"cross_entropy": "token-sum"}

#: SkyRL's deliberate behaviour: checked as declared, listed in "Conventions and guards"
DECLARED = (
    Declared(
        "entropy_bonus_token_mean", "convention", ("policy_step", "policy_step_metrics"),
        "the entropy bonus is masked_mean(entropy, loss_mask), a token mean, whatever loss_reduction the policy loss "
        "uses (the reference follows: entropy_agg_mode='token-mean'); SkyRL adds it per micro-batch, weighted by the "
        "micro-batch's share of rows, which the reference does not follow (the split then moves the bonus: a row "
        "of its own)",
        "'The KL and entropy loss terms are not pre-scaled, so we just average them across microbatches and DP "
        "workers' (worker.py)", "skyrl/backends/skyrl_train/workers/worker.py:1217",
        reference=(("entropy_agg_mode", "token-mean"),)),
    Declared(
        "kl_loss_sequence_mean", "convention", ("policy_step", "policy_step_metrics"),
        "the KL loss is masked_mean(kl, loss_mask, dim=-1).mean(): each row's token mean, averaged over the rows, "
        "whatever loss_reduction the policy loss uses (the reference follows: kl_agg_mode='seq-mean-token-mean'); "
        "it is added per micro-batch, weighted by the micro-batch's share of rows",
        "'The KL and entropy loss terms are not pre-scaled, so we just average them across microbatches and DP "
        "workers' (worker.py)", "skyrl/backends/skyrl_train/workers/worker.py:1232",
        reference=(("kl_agg_mode", "seq-mean-token-mean"),)),
    Declared(
        "is_ratio_metrics_of_raw_ratios", "convention", ("policy_step_metrics",),
        "the off-policy correction logs is_ratio_mean / _min / _max of the raw token ratio exp(old − rollout "
        "log-probs), before the TIS cap, whatever tis_ratio_type (with sequence TIS: the token ratios, not the "
        "sequence weights; the reference follows: is_metric_weights='raw_token'; verl logs the capped weights)",
        "they are named after the ratio, and computed before compute_tis_ratio caps it "
        "(off_policy_correction_utils.py: is_ratio = safe_exp_delta(old_log_probs - rollout_logprobs, …))",
        "skyrl/backends/skyrl_train/utils/off_policy_correction_utils.py:309",
        reference=(("is_metric_weights", "raw_token"),)),
    Declared(
        "off_policy_mask_keeps_normaliser", "convention", ("policy_step", "policy_step_metrics"),
        "the off-policy correction's masks (sequence_mask_metric, outlier and token masks) multiply the per-token "
        "policy loss inside the loss, after the trainer has pre-scaled the advantages by the mini-batch's token "
        "count: the normaliser counts the masked tokens and rows (the reference follows: "
        "rejection_normaliser='batch', every per-token term zero at a masked token)",
        "SkyRL's off-policy correction docs: L = −E[M · min(…)], masked tokens 'contribute zero gradient while all "
        "other tokens in the sequence remain unaffected'", "skyrl/train/trainer.py:1527",
        reference=(("rejection_normaliser", "batch"),)),
    Declared(
        "metrics_mean_over_mini_batches", "convention", ("policy_step_metrics",),
        "with several mini-batches (policy_mini_batch_size below the batch) each metric is one value per "
        "mini-batch (optimizer step), collected in all_metrics and reduced by reduce_metrics: the mean over the "
        "mini-batches (the min / max of the _min / _max keys), not the value over the batch's tokens (the reference "
        "follows: mini_batch_mean_metrics)",
        "'Reduce metrics across all mini-batches and epochs' (trainer.py): one value per update step, as with "
        "update_epochs_per_batch > 1, where a pooled value is not defined", "skyrl/train/trainer.py:1582",
        reference=(("mini_batch_mean_metrics", ("pg_loss", "pg_clipfrac", "kl_loss", "rollout_is_mean",
                                                 "rollout_is_fraction_high")),)),
    Declared(
        "masked_var_le_one_token", "guard", ("masked_var",),
        "the unbiased masked_var raises ValueError on 0 or 1 valid tokens ('At least one element in the mask "
        "has to be 1.' / 'The sum of the mask is one, which can cause a division by zero.')",
        "the Bessel correction n/(n-1) is undefined there; SkyRL's comment (ppo_utils.py:138-139): 'note that if "
        "mask_sum == 1, then there is a division by zero issue; to avoid it you just need to use a larger "
        "minibatch_size'", "skyrl/backends/skyrl_train/utils/ppo_utils.py:141",
        when=lambda case: bool(case.inputs.get("unbiased", True)) and _nnz(case, cleared=True) <= 1,
        raises="ValueError", match=_MASKED_VAR_RAISES),
    Declared(
        "masked_whiten_le_one_token", "guard", ("masked_whiten",),
        "masked_whiten raises masked_var's ValueError on 0 or 1 valid tokens (it calls masked_var(values, mask): "
        "the unbiased variance)",
        "whitening needs a variance: masked_var's guard (ppo_utils.py:137, :141) on purpose",
        "skyrl/backends/skyrl_train/utils/ppo_utils.py:149",
        when=lambda case: _nnz(case) <= 1,
        raises="ValueError", match=_MASKED_VAR_RAISES),
    Declared(
        "gae_whiten_le_one_token", "guard", ("gae",),
        "compute_gae_advantage_return whitens the advantages over the whole batch (masked_whiten(advantages, "
        "response_mask)), which raises masked_var's ValueError when the batch holds 0 or 1 valid tokens",
        "whitening needs a variance (masked_var's guard, ppo_utils.py:141, on purpose)",
        "skyrl/backends/skyrl_train/utils/ppo_utils.py:1339",
        when=lambda case: _nnz(case, "response_mask") <= 1,
        raises="ValueError", match=_MASKED_VAR_RAISES),
    Declared(
        "batch_whiten_le_one_token", "guard", ("outcome_advantage",),
        "reinforce++ whitens the returns over the whole batch (masked_whiten(returns, response_mask), not per "
        "group), which raises masked_var's ValueError when the batch holds 0 or 1 valid tokens, whatever the "
        "groups (a batch of one one-token sample is also a group of one); grpo, rloo and maxrl never whiten",
        "batch-level normalisation needs a variance (masked_var's guard, ppo_utils.py:141)",
        "skyrl/backends/skyrl_train/utils/ppo_utils.py:1253",
        variants=("reinforce_plus_plus",),
        when=lambda case: _nnz(case, "response_mask") <= 1,
        raises="ValueError", match=_MASKED_VAR_RAISES),
    Declared(
        "rewards_zero_outside_mask", "precondition", ("outcome_advantage",),
        "token_level_rewards are zero outside the response mask (grpo, rloo and maxrl sum the whole row: "
        "scores = token_level_rewards.sum(dim=-1); reinforce++ carries the running return through it)",
        "the trainer writes each response's rewards into a zero tensor, right-aligned over the response's own "
        "tokens exactly as the response mask (train/dataset/preprocess.py:378-381; a response-level reward goes on "
        "the response's last token, trainer.py: per_token_reward = [0.0] * len(response)), and the KL penalty "
        "it may subtract is masked by the loss mask; no caller passes anything else at masked positions",
        "skyrl/train/dataset/preprocess.py:381", inputs=("token_level_rewards",)),
    Declared(
        "response_mask_right_aligned", "precondition", ("gae", "outcome_advantage"),
        "the response mask is right-aligned: each row's response tokens are its last ones (the checks draw "
        "masks so, each row's values moved with them); compute_gae_advantage_return's recursion carries "
        "nextvalues and lastgaelam through every column, which reaches a valid token only from the valid "
        "tokens after it in this layout",
        "the trainer left-pads prompt + response and right-aligns the response-level tensors "
        "(train/dataset/preprocess.py:364-366: 'Response tokens occupy the trailing response_len positions', "
        "response_mask = col_resp >= max_response - response_len), the mask trainer.py:1211 passes to "
        "compute_advantages_and_returns",
        "skyrl/train/dataset/preprocess.py:366", mask_layout="right_aligned"),
    Declared(
        "cross_entropy_weighted_sum", "convention", ("policy_loss",),
        "cross_entropy (SFT) returns the plain sum of −log π · loss_mask, whatever loss_reduction says: the "
        "normalisation is the caller's, in the loss mask it passes (the reference follows: token-sum, "
        "LossVariants.agg_modes); the trainer's advantage pre-scaling (apply_loss_reduction_to_advantages_minibatch) "
        "does not reach it, the loss ignores the advantages",
        "documented: 'The loss is computed as: -log_probs * loss_mask, summed over all tokens. This matches "
        "Tinker's cross_entropy semantics where the loss is a simple sum.' (ppo_utils.py:1071-1072); its callers "
        "pre-scale the mask: workers/worker.py:1155 ('Policy loss masks are pre-scaled to achieve the correct "
        "reduction when summing across the entire minibatch (see `DefaultCollator`)'), "
        "train/dataset/collators.py:64 (loss_mask / total_nonpad: a token mean over the batch; "
        "PackedDataCollator likewise, :309), and the Tinker backend passes the user's token weights as the "
        "loss mask (backends/skyrl_train_backend.py:785)",
        "skyrl/backends/skyrl_train/utils/ppo_utils.py:1089",
        variants=tuple(CROSS_ENTROPY_AGG_MODES)),
    Declared(
        "singleton_group_raw_score", "convention", ("outcome_advantage",),
        "a group of one sample gets group statistics μ := 0 (grpo also σ := 1), so its advantage is its own "
        "score (grpo s/(1 + ε); drgrpo s; maxrl s) where rlconform's reference gives 0 (the reference follows: "
        "singleton='raw'); rloo gives a singleton 0, as the reference",
        "ppo_utils.compute_grpo_outcome_advantage special-cases the group of one ('if len(id2score[idx]) == 1: "
        "id2mean[idx] = torch.tensor(0.0); id2std[idx] = torch.tensor(1.0)'); compute_maxrl_advantage "
        "likewise (ppo_utils.py:1415 μ := 0, then :1425 a = s − μ = s)",
        "skyrl/backends/skyrl_train/utils/ppo_utils.py:1378",
        variants=("grpo", "drgrpo", "maxrl"), reference=(("singleton", "raw"),)),
)


#: the SkyRL function behind each failing logged metric (Binding.output_sites): a metric lost on its way (``lost:``,
#: a non-number printed and dropped) is reduce_metrics'; a metric folded over micro-batches is reduce_metrics' (a
#: mean of micro-batch means), over DP ranks all_reduce_metrics' (a mean of rank means); the emitter's own token
#: min / max that sees a row with no valid token is the emitter's (the sequence lengths' min / max are the
#: binding's idiom, not a SkyRL function: their fold's)
_REDUCE, _ALL_REDUCE = f"{WORKER_UTILS}:reduce_metrics", f"{WORKER_UTILS}:all_reduce_metrics"
#: a NaN the step's garbage puts at a masked position (an advantage, a rollout log-prob) reaches the policy loss and
#: its gradient through reduce_loss's masked sum, NaN · 0 = NaN
_MASKED_NAN_LOSS = (r"^(gradient of|metric pg_loss\b)", f"{PPO_UTILS}:reduce_loss", "a masked position holding",
                    r"return \(loss \* loss_mask\)\.sum\(\)")
#: sequence TIS: compute_tis_ratio sums the row's log-ratios as token_tis_log_ratio * loss_mask, so a NaN rollout
#: log-prob at a masked position makes the row's weight NaN, at its valid tokens too (the rollout log-probs alone)
_SEQ_TIS_NAN = (r"^(gradient of|metric pg_loss\b).*masked rollout log-probs = .*\(token-mean-with-seq-tis\)",
                f"{_OPC}:compute_tis_ratio", "a masked position holding",
                r"seq_tis_log_ratio = \(token_tis_log_ratio \* loss_mask\)\.sum\(")
#: a sequence_mean step with a row that has no valid token (GSPO's draw: an overlong-filtered response, a row of
#: observation tokens only): the trainer's advantage pre-scaling divides by batch_size, every row
_SEQ_MEAN_EMPTY_ROW = (r"^(gradient of|metric pg_loss\b)[^,]*, seq-mean-",
                       f"{PPO_UTILS}:apply_loss_reduction_to_advantages_minibatch", "^a row with no valid token$")
_FOLDED = r"^(?!.*masked = )"  # not a masked-garbage clause: a NaN written there is the emitting code's
OUTPUT_SITES = {
    # the scaled advantages keep a masked NaN; reduce_loss's masked sum (NaN · 0) hands it to the loss
    "agg_loss": ((r"\b(value|gradient)$", f"{PPO_UTILS}:reduce_loss", "a masked position holding",
                  r"return \(loss \* loss_mask\)\.sum\(\)"),),
    "metric_statistics": (
        (r"^lost: ", _REDUCE, ""),
        (r"^policy/minibatch_rollout_logprobs_abs_diff_(min|max) \((min|max)\)",
         f"{WORKER_UTILS}:compute_minibatch_rollout_logprob_diff_metrics", ""),
        (_FOLDED, _ALL_REDUCE, "DP rank"),
        (_FOLDED, _REDUCE, ""),
    ),
    "metric_pipeline": ((r"^lost: ", _REDUCE, ""), (_FOLDED, _ALL_REDUCE, "DP rank"), (_FOLDED, _REDUCE, "micro-batch")),
    "dp_metric_all_reduce": ((_FOLDED, _ALL_REDUCE, ""),),
    # the step's clip ratio is one mean per micro-batch, folded by reduce_metrics (a mean of micro-batch means)
    # the clip ratio is taken over the mask from before the off-policy correction's (ppo_policy_loss computes it
    # first, then applies the correction): a masked row's clipped tokens still count
    "policy_step_metrics": (_SEQ_TIS_NAN, _MASKED_NAN_LOSS,
                            (r"^metric pg_clipfrac\b", f"{PPO_UTILS}:ppo_policy_loss", "off-policy correction masks"),
                            (r"^metric pg_clipfrac\b", _REDUCE, "micro-batch"),
                            # the off-policy correction's diagnostics: the min of is_ratio · loss_mask sees the masked
                            # zeros; the means are folded as a mean of micro-batch means
                            (r"^metric rollout_is_min\b", f"{_OPC}:compute_off_policy_correction", "^any input$",
                             r'metrics\["is_ratio_min"\] = \(is_ratio \* loss_mask\)\.min\(\)', "is_ratio_min"),
                            (r"^metric rollout_is_(mean|fraction_high)\b", _REDUCE, "micro-batch"),
                            (r"^metric kl_loss\b", f"{WORKER}:RefWorkerBase._forward_micro_batch",
                             "sampling temperature"), _SEQ_MEAN_EMPTY_ROW),
    # a wrong gradient at a temperature ≠ 1 of the KL variant: the reference log-probs of the KL loss are computed
    # at temperature 1 by the ref worker, the policy's at the sampling temperature
    "policy_step": (_SEQ_TIS_NAN, _MASKED_NAN_LOSS,
                    (r"^gradient of", f"{WORKER}:RefWorkerBase._forward_micro_batch", "sampling temperature"),
                    _SEQ_MEAN_EMPTY_ROW),
}


#: the faulty source line of a SkyRL function whose failing and passing examples run the same lines
#: (Binding.fault_anchors): regular expressions resolved in the installed SkyRL's source at run time, never line
#: numbers (rlconform.harness.core.fault_lines); ``(qualname, pattern)`` looks in a function of the same module
_PPO = "skyrl.backends.skyrl_train.utils.ppo_utils"
FAULT_ANCHORS = {  # engine function -> {kinds of failure (a regular expression) -> patterns of the faulty line}
    # the reference model's log-probs at temperature 1 (sample-support replay aside), the policy's at
    # cfg.algorithm.temperature: the KL loss compares two differently tempered policies
    f"{WORKER}.RefWorkerBase._forward_micro_batch": {
        "wrong value": (r"temperature=self\.cfg\.algorithm\.temperature if sample_support_replay else 1\.0",)},
    # the off-policy correction's mask is applied inside the policy loss (apply_off_policy_correction rewrites its
    # own loss_mask), while the entropy bonus and the KL term here read the mask from before it: a masked row still
    # gets their gradient (the documented design: a masked token contributes zero gradient)
    "skyrl.backends.skyrl_train.workers.worker.PolicyWorkerBase._forward_backward_micro": {
        ("wrong value", "off-policy correction masks"): (r"entropy = masked_mean\(entropy_BS, loss_mask\)",)},
    f"{_PPO}.ppo_policy_loss": {
        ("wrong value", "off-policy correction masks"): (
            r"clip_ratio = masked_mean\(\(-surr2 > -surr1\)\.float\(\), loss_mask\)",)},
    # the KL term is added to a loss the trainer sums after pre-scaling the *advantages* by the loss reduction
    # (apply_loss_reduction_to_advantages_minibatch): ppo_kl_coef·|Δ| is not scaled, so it weighs nnz times more
    f"{_PPO}.compute_policy_loss_kl_cov": {
        "wrong value": (r"pg_losses_kl = -advantages \* ratio \+ ppo_kl_coef \* abs_kl",),
        "NaN|inf": (r"pg_loss = reduce_loss\(loss=pg_losses, loss_mask=loss_mask\)",)},
    # the covariance is taken of the pre-scaled advantages (A / nnz), so clip_cov_lb < cov < clip_cov_ub (1, 5:
    # bounds for unscaled advantages) selects no token; and exp of the unclamped log-ratio overflows past 88.7
    f"{_PPO}.compute_policy_loss_clip_cov": {
        "wrong value": (r"cov_all = \(advantages - masked_mean\(advantages, loss_mask\)\)",
                        r"top_k_idx = \(cov_all < clip_cov_ub\) & \(cov_all > clip_cov_lb\)"),
        "NaN|inf": (r"^\s*ratio = torch\.exp\(negative_approx_kl\)",)},
    # the mean over rows of per-row means counts a row with no valid token (mean 0)
    f"{_PPO}.ppo_critic_loss": {
        "wrong value": (r"loss = masked_mean\(loss, loss_mask, dim=-1\)\.mean\(\)",)},
    # sequence_mean divides by batch_size, every row, a fully masked one included
    f"{_PPO}.apply_loss_reduction_to_advantages_minibatch": {
        "wrong value": (r"normalized_advantages = advantages / \(batch_size \* loss_mask\.sum\(dim=-1",)},
    # masked positions are zeroed by multiplying with the mask: a NaN or inf there stays (NaN · 0 = NaN)
    f"{_PPO}.cross_entropy_loss": {"NaN|inf": (r"loss = reduce_loss\(elementwise_loss, loss_mask\)",)},
    f"{_PPO}.importance_sampling_loss": {  # 0 / 0 on a micro-batch with no valid token
        "NaN|inf": (r"mean_ratio = \(prob_ratio \* loss_mask\)\.sum\(\) / loss_mask\.sum\(\)",)},
    "skyrl.backends.skyrl_train.utils.torch_utils.masked_mean": {
        "NaN|inf": (r"return \(tensor \* mask\)\.sum\(axis=dim\)",)},
    "skyrl.backends.skyrl_train.utils.torch_utils.chunked_entropy_from_logits": {  # 0 · (−inf) at a −inf logit
        "NaN|inf|wrong value": (r"chunk_entropy = -\(chunk_probs \* chunk_logprob\)\.sum\(-1\)",)},
    f"{_OPC}.compute_tis_ratio": {
        "NaN|inf": (r"seq_tis_log_ratio = \(token_tis_log_ratio \* loss_mask\)\.sum",)},
    # a NaN log-ratio at a masked position makes the row's sum NaN, and NaN is neither over nor under a bound:
    # the sequence is kept; its masked fractions count every row, a row with no valid token included
    f"{_OPC}.compute_off_policy_correction": {
        "masked-value|NaN|inf": (("compute_sequence_mask", r"geo_sequence_mask = ~seq_over_high & ~seq_under_low"),
                                 ("compute_sequence_mask", r"seq_in_bounds = ~seq_over_high & ~seq_under_low")),
        ("wrong value", "^(?!a ratio on a bound)"): (
            ("compute_sequence_mask", r"num_sequences = float\(geo_mean_ratio\.shape\[0\]\)"),
            ("compute_sequence_mask", r"num_sequences = float\(seq_tis_ratio\.shape\[0\]\)")),
        # a token ratio on a threshold: decided by safe_exp_delta's float32 exp of a float64 log-ratio
        ("wrong value", "^a ratio on a bound"): (
            ("compute_token_mask", r"token_is_ratio = safe_exp_delta\(token_is_log_ratio"),)},
    # micro-batch metrics: a mean of micro-batch means (exact only for equal token counts); a non-number printed
    # and dropped; the min of abs_diff · loss_mask sees the masked zeros
    f"{WORKER_UTILS}.reduce_metrics": {
        "partition dependence|wrong value": (r"reduced_metrics\[k\] = sum\(v\) / len\(v\)",),
        "missing output": (r'print\(f"Metrics for key \{k\} are not all numbers',)},
    f"{WORKER_UTILS}.all_reduce_metrics": {
        "partition dependence|wrong value": (r'status_mean = strategy\.all_reduce\(mean_metrics, op="mean"',)},
    f"{WORKER_UTILS}.compute_minibatch_rollout_logprob_diff_metrics": {
        "wrong value": (r"masked_abs_diff = abs_diff if loss_mask is None else abs_diff \* loss_mask",
                        r"MINIBATCH_ROLLOUT_LOGPROB_DIFF_MIN_KEY: masked_abs_diff\.min\(\)")},
}


#: the step's triggers in SkyRL's configuration words (Binding.variant_triggers)
STEP_TRIGGERS = {
    "a row removed by rollout rejection": "a row the off-policy correction masks (sequence_mask_metric, outlier or "
                                          "token masks; all off by default)",
    "a sampling temperature ≠ 1": "use_kl_loss=True (the default) with a sampling temperature ≠ 1 and "
                                  "enable_sample_support_replay off",
}

binding = Binding(
    name="skyrl",
    variant_triggers={op: STEP_TRIGGERS for op in ("policy_step", "policy_step_metrics")},
    fault_anchors=FAULT_ANCHORS,
    remedies=REMEDIES,
    configs={"defaults": skyrl_configs.defaults, "ops": skyrl_configs.ops(POLICY_LOSS_NAMES, SKYRL_MODES,
                                                                          SKYRL_ESTIMATORS),
             "triggers": skyrl_configs.TRIGGERS, "sites": skyrl_configs.SITES, "twins": skyrl_configs.TWINS},
    output_sites=OUTPUT_SITES,
    version=_version(),
    engine_dtypes=ENGINE_DTYPES,
    declared=DECLARED,
    # logprobs_from_logits_v2 ("a memory efficient implementation of logprobs_from_logits"; its
    # annotations say logits [batch_size, seqlen, vocab_size], and it loops over dim 0, so [N, V] works too:
    # ranks 2 and 3), bound on its own so that it is checked where token_logprobs runs flash-attn instead
    implementations={"token_logprobs": {"rowwise": Implementation(
        Lazy(f"{TORCH_UTILS}:logprobs_from_logits_v2"), ranks=(2, 3),
        doc="logits [batch_size, seqlen, vocab_size] (jaxtyping annotation); output dtype not stated, not checked")}},
    ops={
        "metric_pipeline": Lazy(loader=_metric_pipeline),
        "policy_step": Lazy(loader=_policy_step),
        "policy_step_metrics": Lazy(loader=_policy_step),
        "metric_statistics": Lazy(loader=_metric_statistics),
        "agg_loss": Lazy(loader=_agg_loss),
        "entropy": Lazy(loader=_entropy),
        "token_logprobs": Lazy(loader=_token_logprobs),
        "masked_mean": Lazy(loader=_masked_mean),
        "masked_var": Lazy(loader=_masked_var),
        "dp_metric_all_reduce": Lazy(loader=_dp_metric_all_reduce),
        "kl_estimator": Lazy(loader=_kl_estimator),
        "policy_loss": Lazy(loader=_policy_loss),
        "value_loss": Lazy(loader=_value_loss),
        "importance_ratio": Lazy(loader=_importance_ratio),
        "rollout_rejection_mask": Lazy(loader=_rollout_rejection_mask),
        "outcome_advantage": Lazy(loader=_outcome_advantage),
        "gae": Lazy(loader=_gae),
        "masked_whiten": Lazy(loader=_masked_whiten),
    },
    # compute_tis_ratio detaches its weights by design: their gradient is not part of the contract.
    detached=frozenset({"importance_ratio"}),  # compute_tis_ratio returns .detach()
    notes={
        "policy_step": "RayPPOTrainer._execute_training_step (compiled: _normalize_advantages, the mini-batch loop) -> "
        "PolicyWorkerBase.forward_backward -> _forward_backward_micro -> HFModelWrapper.forward (compiled) -> "
        "dual_clip (GSPO variant: gspo) policy loss + entropy bonus; old log-probs from PolicyWorkerBase.forward (see skyrl_step.py)",
        "value_loss": "ppo_utils.ppo_critic_loss (value_clip 0.2 or None; 1/2 mean over the micro-batch's rows of "
        "masked row means) x b/B (microbatch_weight); values_clipfrac folded by worker_utils.reduce_metrics",
        "rollout_rejection_mask": "off_policy_correction_utils.compute_off_policy_correction(no TIS; one of the "
        "token / product / geometric / outlier-token masks) -> loss_mask and its masked-ratio metric",
        "importance_ratio": "off_policy_correction_utils.compute_tis_ratio(token|sequence, clip_high 2.0|5.0; "
        "detached: forward-only)",
        "kl_estimator": "ppo_utils.compute_approx_kl(loss_mask=mask, kl_estimator_type=k1|abs|k2|k3)",
        "policy_loss": "ppo_utils.PolicyLossRegistry.get(name) for every registered name; advantages pre-scaled "
        "by apply_loss_reduction_to_advantages_minibatch (token_mean, mini-batch scope); masked-sum loss; "
        "metrics folded by worker_utils.reduce_metrics (mean of micro-batch means)",
        "metric_statistics": "compute_minibatch_rollout_logprob_diff_metrics (mean / sq_mean / _min / _max) plus "
        "token sum, count, number of sequences (_loss keys: the summing convention) and response lengths "
        "(_mean / _min / _max) per micro-batch -> the metric_pipeline path (reduce_metrics, all_reduce_metrics, "
        "trainer reduce_metrics, 'policy/')",
        "metric_pipeline": "policy_entropy: PolicyWorkerBase._forward_backward_micro (stand-in worker, fake model "
        "returning the values as entropy) per micro-batch -> worker_utils.reduce_metrics -> "
        "worker_utils.all_reduce_metrics (DP, float32 /world then SUM, simulated in-process) -> "
        "RayPPOTrainer._execute_training_step -> train_critic_and_policy ('policy/'), both compiled from the "
        "installed source",
        "agg_loss": "ppo_utils.apply_loss_reduction_to_advantages_minibatch (mini-batch scope, fed through context "
        "rows) + ppo_utils.reduce_loss, x dp_size; sum over micro-batches, mean over DP. Modes: token_mean, "
        "sequence_mean, seq_mean_token_sum_norm (max_seq_len = loss_scale_factor or T).",
        "entropy": "torch_utils.chunked_entropy_from_logits(requires_grad=True)",
        "token_logprobs": "torch_utils.logprobs_from_logits (v2 path without flash-attn)",
        "masked_mean": "torch_utils.masked_mean (nnz clamped to >= 1)",
        "masked_var": "ppo_utils.masked_var",
        "dp_metric_all_reduce": "policy_entropy on real DP ranks: torch_utils.masked_mean(...).item() -> "
        "worker_utils.reduce_metrics -> worker_utils.all_reduce_metrics over the gloo DP group "
        "(DistributedStrategy.all_reduce: float32 /= world, SUM)",
        "outcome_advantage": "ppo_utils.AdvantageEstimatorRegistry through ppo_utils.compute_advantages_and_returns "
        "as the trainer calls it (uids as list of str, AlgorithmConfig gamma=1, lambd=1, grpo_norm_by_std; drgrpo = "
        "grpo with grpo_norm_by_std=False; reinforce++ = reinforce_plus_plus)",
        "gae": "ppo_utils.compute_advantages_and_returns(adv_estimator='gae', gamma, lambd) (no masked-position skipping)",
        "masked_whiten": "ppo_utils.masked_whiten (torch_utils.masked_mean: / clamp(nnz, 1); masked_var raises for "
        "nnz <= 1)",
    },
)


# ------------------------------------------------------------------------------------ coverage
TRAINER_UTILS = "skyrl.train.utils.trainer_utils"
OPC = "skyrl.backends.skyrl_train.utils.off_policy_correction_utils"
#: SkyRL's numerics modules: ppo_utils, worker_utils (micro-batch and DP metric reduction),
#: torch_utils (token statistics) and trainer_utils (the trainer's metric finalisation)
NUMERICS_MODULES = (PPO_UTILS, WORKER_UTILS, TORCH_UTILS, TRAINER_UTILS)


def _registry(name: str):
    def load():
        registry = _skyrl(PPO_UTILS, name)
        return {n: registry.get(n) for n in registry.list_available()}

    load.__qualname__ = f"skyrl.{name}"
    return load


def _kl_modes():
    """The ``kl_estimator_type`` names ``ppo_utils.compute_approx_kl`` accepts, read from its code."""
    from rlconform.harness.catalog.coverage import compared_strings

    return {n: None for n in compared_strings(_skyrl(PPO_UTILS, "compute_approx_kl"), "kl_estimator_type")}


_REGISTRY_PLUMBING = "not numerics: registry plumbing (registration, lookup, Ray-actor synchronisation); the entries " \
    "are listed as registry entries"
_BATCHING = "not numerics: micro-batch iteration / reordering of TensorBatch rows (the partitions the catalog's " \
    "partition properties enumerate)"
#: every public function of :data:`NUMERICS_MODULES` that no op binds, with why
NOT_BOUND: dict[str, str] = {
    # ---- ppo_utils
    f"{PPO_UTILS}.AdaptiveKLController.update": "no catalog op yet: the adaptive KL coefficient (Ziegler et al. "
    "2019, proportional controller on the observed KL; KL / loss family)",
    f"{PPO_UTILS}.FixedKLController.update": "not numerics: a no-op, the coefficient stays fixed",
    f"{PPO_UTILS}.get_kl_controller": "not numerics: builds a KL controller from the config",
    f"{PPO_UTILS}.AdvantageEstimator": "not numerics: the enum of estimator names (the registry entries are listed)",
    f"{PPO_UTILS}.PolicyLossType": "not numerics: the enum of policy-loss names (the registry entries are listed)",
    f"{PPO_UTILS}.AdvantageEstimatorRegistry.repopulate_registry": _REGISTRY_PLUMBING,
    f"{PPO_UTILS}.PolicyLossRegistry.repopulate_registry": _REGISTRY_PLUMBING,
    f"{PPO_UTILS}.BaseFunctionRegistry.get": _REGISTRY_PLUMBING,
    f"{PPO_UTILS}.BaseFunctionRegistry.list_available": _REGISTRY_PLUMBING,
    f"{PPO_UTILS}.BaseFunctionRegistry.register": _REGISTRY_PLUMBING,
    f"{PPO_UTILS}.BaseFunctionRegistry.repopulate": _REGISTRY_PLUMBING,
    f"{PPO_UTILS}.BaseFunctionRegistry.reset": _REGISTRY_PLUMBING,
    f"{PPO_UTILS}.BaseFunctionRegistry.sync_with_actor": _REGISTRY_PLUMBING,
    f"{PPO_UTILS}.BaseFunctionRegistry.unregister": _REGISTRY_PLUMBING,
    f"{PPO_UTILS}.register_advantage_estimator": _REGISTRY_PLUMBING,
    f"{PPO_UTILS}.register_policy_loss": _REGISTRY_PLUMBING,
    f"{PPO_UTILS}.repopulate_all_registries": _REGISTRY_PLUMBING,
    f"{PPO_UTILS}.sync_registries": _REGISTRY_PLUMBING,
    # ---- torch_utils
    f"{TORCH_UTILS}.logprobs_from_logits_flash_attn": "called by logprobs_from_logits for CUDA logits with "
    "flash-attn installed; unreachable on the CPU machines the reports are made on",
    f"{TORCH_UTILS}.safe_exp_delta": "called by the bound policy losses (importance ratio exp(clamp(Δ, ±20)) in "
    "float32, cast back); no catalog op yet for the ratio itself (importance_ratio)",
    f"{TORCH_UTILS}.chunked_cross_entropy_from_log_probs": "entropy −Σ exp(l)·l of log-probs l (not logits): as an "
    "entropy@chunked implementation its adapter would have to compute log_softmax itself, arithmetic the harness "
    "must not add; no catalog op takes log-probs (an entropy_from_logprobs op would); no caller in SkyRL 0.4.0",
    # ---- worker_utils
    f"{WORKER_UTILS}.get_microbatch_iterator": _BATCHING,
    f"{WORKER_UTILS}.BaseBatchIterator.reorder_and_combine_batches": _BATCHING,
    f"{WORKER_UTILS}.BatchIterator.reorder_and_combine_batches": _BATCHING,
    f"{WORKER_UTILS}.SampleBasedBatchIterator.reorder_and_combine_batches": _BATCHING,
    f"{WORKER_UTILS}.TokenBasedBatchIterator.reorder_and_combine_batches": _BATCHING,
    f"{WORKER_UTILS}.TokenBasedBatchIterator.reorder_and_combine_items": _BATCHING,
    f"{WORKER_UTILS}.BaseBatchIterator.batch_to_experience": "not numerics: repackages a TensorBatch as an "
    "Experience",
    f"{WORKER_UTILS}.get_inference_weight_prefix": "not numerics: a weight-name prefix for weight sync",
    # ---- trainer_utils (needs torchdata, absent here: its items are read from the source file)
    TRAINER_UTILS: "the trainer's utilities, metric finalisation among them; it needs torchdata, absent from this "
    "environment, so nothing in it can be bound here (its items are listed from the source)",
    f"{TRAINER_UTILS}.finalize_minibatch_rollout_logprob_diff_std": "no catalog op yet: a std rebuilt from "
    "mean-reduced moments, sqrt(max(0, E[x²] − E[x]²)) after reduce_metrics averaged the per-micro-batch moments "
    "(cancellation, and a mean of means: metric family); the module does not import here",
    f"{TRAINER_UTILS}.calculate_per_dataset_metrics": "evaluation metrics (avg score, pass@n per data source) from "
    "generator outputs: no catalog op yet (reward statistics, not the training objective)",
    f"{TRAINER_UTILS}.get_intra_group_completion_time_std_cv": "not numerics of the objective: std / CV of "
    "rollout completion times (wall-clock telemetry)",
    f"{TRAINER_UTILS}.get_group_completion_metrics": "not numerics of the objective: completion-time mean / p90 / "
    "max (wall-clock telemetry)",
    f"{TRAINER_UTILS}.zero_variance_filter": "no catalog op yet: drops prompt groups whose rewards have zero "
    "variance (DAPO dynamic sampling: a selection of groups, advantage family)",
    f"{TRAINER_UTILS}.handle_dynamic_sampling": "no catalog op yet: DAPO dynamic sampling driver (filter / replace "
    "groups by reward variance; a selection step, advantage family)",
    f"{TRAINER_UTILS}.handle_filter_sampling": "no catalog op yet: dynamic sampling by filtering (see "
    "handle_dynamic_sampling)",
    f"{TRAINER_UTILS}.handle_replace_sampling": "no catalog op yet: dynamic sampling by replacing zero-variance "
    "groups with good ones (see handle_dynamic_sampling)",
    f"{TRAINER_UTILS}.get_bad_sample_replacements": "not numerics: picks replacement uids for dynamic sampling",
    f"{TRAINER_UTILS}.filter_generator_output": "not numerics: keeps the given rows of a generator output",
    f"{TRAINER_UTILS}.validate_generator_output": "not numerics: shape / field checks of a generator output",
    f"{TRAINER_UTILS}.DynamicSamplingState": "not numerics: a TypedDict of dynamic-sampling state",
    f"{TRAINER_UTILS}.ResumeMode": "not numerics: checkpoint resume enum",
    f"{TRAINER_UTILS}.build_dataloader": "not numerics: builds the StatefulDataLoader",
    f"{TRAINER_UTILS}.cleanup_old_checkpoints": "not numerics: checkpoint housekeeping",
    f"{TRAINER_UTILS}.list_checkpoint_dirs": "not numerics: checkpoint housekeeping",
    f"{TRAINER_UTILS}.extract_step_from_path": "not numerics: checkpoint housekeeping",
    f"{TRAINER_UTILS}.validate_consistency_for_latest_checkpoint": "not numerics: checkpoint housekeeping",
    f"{TRAINER_UTILS}.dump_per_dataset_eval_results": "not numerics: writes evaluation results to disk",
    f"{TRAINER_UTILS}.sanitize_data_source": "not numerics: metric-key sanitising",
    f"{TRAINER_UTILS}.get_node_ids": "not numerics: Ray node discovery",
    f"{TRAINER_UTILS}.run_on_each_node": "not numerics: Ray task fan-out",
}

_MCORE_LOGPROB = ("not yet bound: SkyRL's Megatron TP / CP log-prob and entropy path (vocab-parallel log-softmax, "
                  "entropy, chunked and fused-linear variants, all_reduce over the TP group); needs megatron "
                  "parallel_state and a Megatron model wrapper; the catalog ops vocab_parallel_token_logprobs / "
                  "vocab_parallel_entropy would check it once bound")
_MTP = ("not yet bound: multi-token-prediction draft-head soft cross-entropy (a speculative-decoding head's loss, "
        "not the policy objective)")
_ISSUE25 = ("checked by op rollout_rejection_mask: called by compute_off_policy_correction (bound) for every "
            "rollout_rejection_mask finding")
_WRAPPER_FWD = "model forward: a model wrapper's forward returning log-probs / entropy of the model's logits"
NOT_BOUND.update({
    # ---- found by whole-package discovery, outside NUMERICS_MODULES
    f"{OPC}.compute_sequence_mask": _ISSUE25,
    f"{OPC}.compute_outlier_token_mask": _ISSUE25,
    f"{OPC}.compute_token_mask": _ISSUE25,
    "skyrl.train.trainer.RayPPOTrainer.apply_reward_kl_penalty": "not yet bound: the KL penalty in the reward "
    "(compute_approx_kl, bound as kl_estimator, × the KL coefficient, subtracted from the token rewards; a "
    "masked mean of it as a metric); no catalog op for the reward transform",
    "skyrl.train.trainer.RayPPOTrainer.train": "not numerics on its own: the trainer loop",
    "skyrl.train.generators.skyrl_gym_generator.SkyRLGymGenerator.agent_loop": "not numerics: the rollout agent "
    "loop (collects the sampler's log-probs)",
    "skyrl.train.utils.utils.configure_ray_worker_logging": "not numerics: logging set-up (a false positive of "
    "the exp/log signal)",
    "skyrl.utils.log.WandbTracker.log": "not numerics: experiment-tracker logging (a false positive of the exp/log "
    "signal)",
    "skyrl.tinker.proto_serialization.serialize_sample_output": "not numerics: serialises sampled tokens and their "
    "log-probs",
    "skyrl.backends.skyrl_train.workers.model_wrapper.HFModelWrapper.forward": _WRAPPER_FWD + " (calls "
    "logprobs_from_logits / entropy, bound as token_logprobs / entropy)",
    "skyrl.backends.skyrl_train.workers.megatron.megatron_model_wrapper.MegatronModelWrapper.forward": _WRAPPER_FWD,
    "skyrl.backends.skyrl_train.workers.megatron.megatron_model_wrapper.MegatronModelWrapper."
    "forward_backward_mini_batch": "model forward: Megatron forward-backward over micro-batches (calls the bound "
    "policy losses per micro-batch)",
    "skyrl.backends.skyrl_train.workers.megatron.megatron_worker.MegatronPolicyWorkerBase.forward": _WRAPPER_FWD,
    "skyrl.backends.skyrl_train.workers.megatron.megatron_worker.MegatronRefWorkerBase.forward": _WRAPPER_FWD,
    "skyrl.backends.skyrl_train.mtp.grad_clip.install_mtp_separate_grad_clip": "optimizer schedule: gradient "
    "clipping of the MTP head's parameters",
    "skyrl.backends.skyrl_train.utils.sample_support_replay.sample_support_scores": "not yet bound: support "
    "scores for sampled-token replay (a rollout-side selection statistic, not the policy objective)",
})
#: whole subpackages discovery reads that are not the RL objective; a name above takes precedence
NOT_BOUND_UNDER: dict[str, str] = {
    "skyrl.backends.skyrl_train.distributed.megatron.model_utils": _MCORE_LOGPROB,
    "skyrl.backends.skyrl_train.distributed.megatron.fused_linear_logprob_triton": "kernel: needs CUDA: Triton "
    "fused linear log-prob / entropy kernels (the Megatron path's fused head)",
    "skyrl.backends.skyrl_train.mtp.": _MTP,
    "skyrl.backends.skyrl_train.patches.": "model forward: patched Megatron attention layers (KDA, DSA)",
    "skyrl.backends.skyrl_train.weight_sync.": "not numerics of the objective: FP8 casting of weights for sync "
    "to the inference engine",
    "skyrl.backends.skyrl_train.inference_servers.": "not in the RL objective: inference-server sampling",
    "skyrl.tinker.": "not yet bound: the Tinker API's JAX loss functions (jax.Array, not torch: the catalog's "
    "policy_loss contract takes torch tensors)",
    "skyrl.tx.": "model forward: the JAX (tx) model stack and its sampler (not the torch trainer the catalog binds)",
}
COVERAGE = Coverage(
    modules=NUMERICS_MODULES,
    registries={f"{PPO_UTILS}.PolicyLossRegistry": _registry("PolicyLossRegistry"),
                f"{PPO_UTILS}.AdvantageEstimatorRegistry": _registry("AdvantageEstimatorRegistry"),
                f"{PPO_UTILS}.compute_approx_kl modes": _kl_modes},
    registry_ops={f"{PPO_UTILS}.PolicyLossRegistry": "policy_loss",
                  f"{PPO_UTILS}.AdvantageEstimatorRegistry": ("outcome_advantage", "gae"),
                  f"{PPO_UTILS}.compute_approx_kl modes": "kl_estimator"},
    not_bound=NOT_BOUND,
    importer=import_skyrl,
    not_bound_under=NOT_BOUND_UNDER,
)
binding.coverage = COVERAGE
