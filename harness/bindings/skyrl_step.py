"""SkyRL's policy-gradient step (op ``policy_step``), driven through SkyRL's own trainer and worker code.

The path, as ``RayPPOTrainer`` runs one training step (SkyRL 0.4.0, FSDP workers):

1. the old log-probs: ``PolicyWorkerBase.forward`` (inference micro-batches of
   ``micro_forward_batch_size_per_gpu``) → ``_forward_micro_batch`` → ``HFModelWrapper.forward`` (the temperature
   ``logits.div_(temperature)``, ``logprobs_from_logits``) on the proximal model, and the trainer's
   ``loss_fn_outputs_to_tensor`` (what ``_execute_forward_pass`` does with the dispatch's output);
2. ``RayPPOTrainer._execute_training_step("policy", …)`` (compiled from ``train/trainer.py``, which does not
   import here): ``_normalize_advantages`` (the same compiled method: ``apply_loss_reduction_to_advantages_minibatch``
   pre-scales each mini-batch's advantages so that summing gives its loss reduction), the mini-batch loop over the
   boundaries ``compute_prompt_mini_batch_boundaries`` gives (``policy_mini_batch_size`` prompts of one row each;
   ``update_epochs_per_batch`` 1), one ``optim_step`` per mini-batch, ``reduce_metrics`` (a mean over the
   mini-batches: declared, ``metrics_mean_over_mini_batches``);
3. each mini-batch: ``PolicyWorkerBase.forward_backward`` (the micro-batch loop of
   ``micro_train_batch_size_per_gpu`` rows) → ``_forward_backward_micro`` → ``HFModelWrapper.forward`` →
   the ``dual_clip`` (or ``gspo``) policy loss of ``PolicyLossRegistry`` → the entropy bonus
   (``masked_mean(entropy, loss_mask) · entropy_loss_coef``, weighted by the micro-batch's share of rows) →
   ``strategy.backward`` → ``reduce_metrics`` / ``all_reduce_metrics``.

Stand-ins (:data:`TRANSCRIBED`): ``torch.cuda.current_device`` answers the CPU; ``strategy.backward`` is
``loss.backward()`` (what ``FSDPStrategy.backward`` does); ``optim_step`` records the accumulated gradient (before
clipping), clears it as the optimizer's ``zero_grad`` does and moves no parameter (each mini-batch's gradient is
taken at the same parameters); the dispatch hands each mini-batch to the worker in-process; DP size 1 (the
metrics' all-reduce is the identity), or DP size 2: SkyRL's own ``MeshDispatch.stage_chunks`` cuts each mini-batch
into the ranks' chunks (``ray.put`` the identity), each rank's ``forward_backward`` runs in a thread with the
ranks' ``ThreadedGroup`` as its DP group (:mod:`rlconform.harness.core.threaded_group`: SkyRL's own
``DistributedStrategy.all_reduce`` of the metrics exchanged in-process), rank 0's output is the dispatch's, and
FSDP's gradient reduction is the mean of the ranks' gradients (the old log-probs on one rank); no autocast
(float32). ``remove_microbatch_padding`` is off: SkyRL packs
micro-batches with flash-attn's ``unpad_input`` only with ``flash_attention_2``, which this CPU build lacks.
It uses the ``dual_clip`` loss instead of SkyRL's default ``regular`` (PPO without the dual clip), the
reference's vanilla PPO with ``clip_ratio_c``; the GSPO variant uses ``policy_loss_type="gspo"`` (``gspo_policy_loss``,
GSPO-token with the configured ``eps_clip_low`` / ``eps_clip_high``) under ``loss_reduction="sequence_mean"``, which it
recommends. Logged and checked: ``policy_loss`` (``pg_loss``) and
``loss_metrics/clip_ratio`` (``pg_clipfrac``); SkyRL logs no ``ppo_kl`` / ``pg_clipfrac_lower`` and no entropy of
the old path; its ``policy_entropy`` is the current path's token mean whatever the loss reduction (not the
catalog's ``entropy_loss``): unchecked here (the ``metric_pipeline`` op checks it).

Rollout correction (``algorithm.off_policy_correction``, applied inside the policy loss of each micro-batch by
``apply_off_policy_correction``): token TIS is ``tis_ratio_type="token"`` with ``token_tis_ratio_clip_high`` = the
cap, sequence TIS ``tis_ratio_type="sequence"`` with ``sequence_tis_ratio_clip_high`` = the cap (its clipped fraction
is logged as ``tis_seq_clip_high_ratio``, not ``tis_token_clip_high_ratio``); a row rejected by its mean ratio is
``sequence_mask_metric="geometric"`` with ``geo_mask_low`` /
``geo_mask_high`` = the bounds (the geometric mean of the token ratios is exp of their mean log-ratio); a token
outside a band of its ratio π_old/π_rollout is ``token_mask_is_threshold_low`` / ``token_mask_is_threshold_high`` =
the bounds (``compute_token_mask``, which multiplies the loss mask, no TIS weight). The
batch's ``rollout_log_probs`` are SkyRL's ``rollout_logprobs``.

KL loss (``use_kl_loss``; ``kl_estimator_type`` ``"k3"``, verl's ``low_var_kl``, or ``"k1"`` or ``"k2"``): the
reference log-probs (``base_action_log_probs``) come from SkyRL's own ``RefWorkerBase.forward`` →
``_forward_micro_batch`` → ``HFModelWrapper.forward`` on the reference model, as ``fwd_logprobs_values_reward`` gets them; the KL term is
``masked_mean(kl, loss_mask, dim=-1).mean()`` per micro-batch, weighted by its share of rows (a sequence mean,
declared: ``kl_loss_sequence_mean``), logged as ``policy_kl``.
"""

from __future__ import annotations

import types

WORKER = "skyrl.backends.skyrl_train.workers.worker"
WRAPPER = "skyrl.backends.skyrl_train.workers.model_wrapper"
BATCH = "skyrl.backends.skyrl_train.training_batch"
TRAINER = "skyrl.train.trainer"
DISPATCH = "skyrl.backends.skyrl_train.distributed.dispatch"
STRATEGY = "skyrl.backends.skyrl_train.distributed.strategy"
TORCH_UTILS = "skyrl.backends.skyrl_train.utils.torch_utils"
PREPROCESS = "skyrl.train.dataset.preprocess"

#: the catalog's loss_agg_modes and SkyRL's loss reductions that compute them
REDUCTIONS = {"token-mean": "token_mean", "seq-mean-token-mean": "sequence_mean"}
#: the catalog's step variants this binding drives: a loss reduction, alone or with a rollout correction
MODES = ("token-mean", "seq-mean-token-mean", "token-mean-with-tis", "token-mean-with-seq-tis",
         "token-mean-with-rejection", "seq-mean-token-mean-with-rejection", "token-mean-with-kl",
         "token-mean-with-kl-k1", "token-mean-with-kl-k2", "seq-mean-token-mean-with-gspo",
         "token-mean-with-token-mask")
#: the step's policy losses by SkyRL's names (vanilla PPO with dual clip: ``dual_clip``)
POLICY_LOSSES = {"vanilla": "dual_clip", "gspo": "gspo"}
#: the catalog's KL estimators by SkyRL's names
KL_ESTIMATORS = {"low_var_kl": "k3", "k3": "k3", "k1": "k1", "k2": "k2", "abs": "abs"}
#: the step's metrics as SkyRL logs them (``policy/`` is added by ``train_critic_and_policy``)
METRIC_KEYS = {"pg_loss": "policy_loss", "pg_clipfrac": "loss_metrics/clip_ratio", "kl_loss": "policy_kl",
               # the off-policy correction's metrics, which the policy loss returns beside its own
               "rollout_is_mean": "loss_metrics/is_ratio_mean", "rollout_is_min": "loss_metrics/is_ratio_min",
               "rollout_is_max": "loss_metrics/is_ratio_max",
               "rollout_is_fraction_high": "loss_metrics/tis_token_clip_high_ratio"}
#: the keys of :data:`METRIC_KEYS` that sequence TIS logs under other names (``compute_tis_ratio``)
SEQUENCE_METRIC_KEYS = {"rollout_is_fraction_high": "loss_metrics/tis_seq_clip_high_ratio"}

TRANSCRIBED = ("stand-ins: CPU device; strategy.backward = loss.backward(); optim_step records the gradient "
               "(before clipping), clears it and moves no parameter (each mini-batch's gradient at the same "
               "parameters); dispatch in-process; DP 1, and DP 2 as threads of one process with in-process collectives "
               "(SkyRL's own staging and metric all-reduce; old log-probs on one rank; the gradient the mean of the "
               "ranks'); float32; no micro-batch packing (flash-attn); dual_clip "
               "loss, or gspo for the GSPO variant. Not drawn: policy losses other than dual_clip and gspo, the KL estimator abs, off-policy correction other than token TIS, sequence TIS, "
               "the geometric row mask and the token mask, each alone, "
               "several mini-batches on DP 2, update_epochs_per_batch > 1, DP > 2; "
               "policy_entropy left to metric_pipeline; Megatron's step not driven")


def off_policy_correction(kn: dict) -> dict:
    """SkyRL's ``OffPolicyCorrectionConfig`` fields for the step's rollout-correction knobs (empty: none): a row's
    mean k1 ratio is the geometric sequence mask, a token's k1 ratio the token mask (``token_mask_is_threshold_low``
    / ``_high``: ``compute_token_mask`` keeps low ≤ π_old/π_rollout ≤ high). Raises ValueError for a correction SkyRL
    has no option for (an importance level other than token and the sequence product, another rejection, two of one
    kind)."""
    fields = {}
    if kn.get("rollout_is") == "token":
        fields.update(tis_ratio_type="token", token_tis_ratio_clip_high=float(kn["rollout_is_cap"]))
    elif kn.get("rollout_is") == "sequence_product":
        fields.update(tis_ratio_type="sequence", sequence_tis_ratio_clip_high=float(kn["rollout_is_cap"]))
    elif kn.get("rollout_is"):
        raise ValueError(f"importance level {kn['rollout_is']!r}: SkyRL's TIS is per token or the sequence product")
    for level, estimator, lower, upper in kn.get("rollout_rejection") or ():
        if (level, estimator) == ("token", "k1") and "token_mask_is_threshold_low" not in fields:
            fields.update(token_mask_is_threshold_low=float(lower), token_mask_is_threshold_high=float(upper))
            continue
        if (level, estimator) != ("seq_mean", "k1") or "sequence_mask_metric" in fields:
            raise ValueError(f"rejection {level} {estimator}: SkyRL's step masks a row by one geometric-mean bound "
                             "pair or a token by one ratio band")
        fields.update(sequence_mask_metric="geometric", geo_mask_low=float(lower), geo_mask_high=float(upper))
    return fields


def policy_step():
    """The :class:`~rlconform.harness.catalog.binding.PolicyStep` of SkyRL (module doc). Raises
    ``ModuleNotFoundError`` / ``AttributeError`` when the installed SkyRL lacks a piece of the path."""
    import functools
    from unittest import mock

    import torch

    from rlconform.harness.catalog.binding import PolicyStep
    from rlconform.harness.catalog.engine_site import calls
    from rlconform.harness.core.threaded_group import ThreadedGroup, collectives
    from rlconform.harness.core.tiny_lm import TinyLM

    from ._compat import accepted_keywords, import_skyrl, skyrl_cuda_device_on_cpu
    from .source import engine_function

    worker_mod = import_skyrl(WORKER)
    policy_worker = worker_mod.PolicyWorkerBase
    ref_worker_cls = worker_mod.RefWorkerBase
    wrapper_forward = engine_function(WRAPPER, "HFModelWrapper.forward", import_skyrl)
    # what HFModelWrapper.__init__ sets (use_torch_compile off): the function model_wrapper.py imports
    entropy_fn = import_skyrl(TORCH_UTILS).chunked_entropy_from_logits
    batch_cls = import_skyrl(BATCH).TrainingInputBatch
    config = import_skyrl("skyrl.train.config")
    execute_training_step = engine_function(TRAINER, "RayPPOTrainer._execute_training_step", import_skyrl)
    mini_batch_boundaries = engine_function(PREPROCESS, "compute_prompt_mini_batch_boundaries", import_skyrl)
    normalize_advantages = engine_function(TRAINER, "RayPPOTrainer._normalize_advantages", import_skyrl)
    to_tensor = engine_function(DISPATCH, "loss_fn_outputs_to_tensor", import_skyrl)
    dispatch_mod = import_skyrl(DISPATCH)
    strategy_all_reduce = import_skyrl(STRATEGY).DistributedStrategy.all_reduce
    wrapper_cls = _wrapper_class(wrapper_forward)

    def algorithm(kn):
        fields = dict(policy_loss_type=POLICY_LOSSES[kn.get("policy_loss") or "vanilla"], eps_clip_low=kn["clip_ratio_low"],
                      eps_clip_high=kn["clip_ratio_high"], clip_ratio_c=kn["clip_ratio_c"],
                      loss_reduction=REDUCTIONS[kn["loss_agg_mode"]], temperature=kn["temperature"],
                      use_entropy_loss=bool(kn["entropy_coeff"]), entropy_loss_coef=kn["entropy_coeff"],
                      use_kl_loss=bool(kn.get("kl_loss_coef")), kl_loss_coef=float(kn.get("kl_loss_coef") or 0.0),
                      kl_estimator_type=KL_ESTIMATORS.get(kn.get("kl_loss_type") or "k3", "k3"),
                      advantage_batch_normalize=False)
        correction = off_policy_correction(kn)
        if correction:
            fields["off_policy_correction"] = config.OffPolicyCorrectionConfig(**correction)
        return config.AlgorithmConfig(**accepted_keywords(config.AlgorithmConfig, fields))

    def worker(params, alg, micro, max_tokens=None, group=None):
        w = object.__new__(policy_worker)
        w.model = wrapper_cls(TinyLM(params), entropy_fn)
        w.cfg = types.SimpleNamespace(algorithm=alg, micro_train_batch_size_per_gpu=micro,
                                      micro_forward_batch_size_per_gpu=micro, max_tokens_per_microbatch=max_tokens or 0)
        w.policy_loss_fn = worker_mod.PolicyLossRegistry.get(alg.policy_loss_type)
        w.mesh_rank = types.SimpleNamespace(dp_size=group.size if group else 1)
        w.optimizer = None
        w.strategy = types.SimpleNamespace(backward=lambda loss, model, optimizer: loss.backward(),
                                           all_reduce=lambda data, op="mean", group=None: data)
        if group is not None:  # SkyRL's own all-reduce over the ranks' group (exchanged in-process)
            w.strategy.world_size = group.size
            w.strategy.all_reduce = types.MethodType(strategy_all_reduce, w.strategy)
        w.device_mesh = types.SimpleNamespace(get_group=lambda name: group)
        w.scheduler = types.SimpleNamespace(get_last_lr=lambda: [0.0])
        w.record_memory = False
        return w

    @calls(policy_worker._forward_backward_micro, policy_worker.forward_backward, policy_worker.forward,
           policy_worker._forward_micro_batch, wrapper_forward, execute_training_step, normalize_advantages,
           ref_worker_cls.forward, ref_worker_cls._forward_micro_batch, mini_batch_boundaries)
    def run(batch, params, old_params, kn):
        rows, width = batch["responses"].shape
        mini = int(kn.get("mini_batch_size") or rows)
        alg = algorithm(kn)
        data = batch_cls({
            "sequences": batch["input_ids"].clone(), "attention_mask": batch["attention_mask"].clone(),
            "loss_mask": batch["response_mask"].clone(), "response_mask": batch["response_mask"].clone(),
            "advantages": batch["advantages"].clone(), "base_action_log_probs": None,
            "rollout_logprobs": batch["rollout_log_probs"].clone() if "rollout_log_probs" in batch else None,
        })
        # the trainer's mini-batch boundaries (convert_to_training_input): one prompt per row, policy_mini_batch_size
        # prompts per mini-batch
        data.metadata = {"response_length": width, "policy_mini_batch_boundaries": mini_batch_boundaries(
            [f"prompt{i}" for i in range(rows)], mini, rows, False, 1)}
        with skyrl_cuda_device_on_cpu():
            old_worker = worker(old_params, alg, kn["micro_batch_size"], kn.get("max_token_len"))
            out = policy_worker.forward(old_worker, data.select(["sequences", "attention_mask"], ["response_length"]))
            old = to_tensor(out.loss_fn_outputs, key="logprobs")[:rows]
            data["action_log_probs"] = old.to(torch.float32)
            if kn.get("kl_loss_coef"):  # the reference model's log-probs, from SkyRL's ref worker
                ref_worker = object.__new__(ref_worker_cls)
                ref_worker.model = wrapper_cls(TinyLM(kn["ref_params"]), entropy_fn)
                ref_worker.cfg = types.SimpleNamespace(algorithm=alg, max_tokens_per_microbatch=kn.get("max_token_len") or 0,
                                                       micro_forward_batch_size_per_gpu=kn["micro_batch_size"])
                out = ref_worker_cls.forward(ref_worker, data.select(["sequences", "attention_mask"],
                                                                     ["response_length"]))
                data["base_action_log_probs"] = to_tensor(out.loss_fn_outputs, key="logprobs")[:rows].to(torch.float32)
            dp = int(kn.get("dp_size") or 1)
            group = ThreadedGroup(dp) if dp > 1 else None
            actors = [worker({k: v.clone() for k, v in params.items()}, alg, kn["micro_batch_size"],
                             kn.get("max_token_len"), group) for _ in range(dp)]
            captured = []

            def optim_step(model):  # FSDP's gradient reduction: the mean of the ranks' gradients
                ranks = [{n: p.grad.detach().clone() for n, p in a.model.model.named_parameters()
                          if p.grad is not None} for a in actors]
                captured.append({n: sum(r[n] for r in ranks) / dp for n in ranks[0]})
                for a in actors:  # FSDPStrategy.optimizer_step ends with optimizer.zero_grad(); no parameter moves
                    a.model.model.zero_grad(set_to_none=True)
                return None

            def stage_data(model, d, boundaries):
                if group is None:
                    return [d[a:b] for a, b in boundaries]
                with mock.patch.object(dispatch_mod.ray, "put", lambda chunk: chunk):
                    return dispatch_mod.MeshDispatch.stage_chunks(dp, d, boundaries)

            def forward_backward_from_staged(model, chunk):
                if group is None:
                    return policy_worker.forward_backward(actors[0], chunk)
                with collectives():
                    return group.run([functools.partial(policy_worker.forward_backward, actors[k], chunk[k])
                                      for k in range(dp)])[0]

            trainer = types.SimpleNamespace(
                cfg=types.SimpleNamespace(trainer=types.SimpleNamespace(
                    update_epochs_per_batch=1, micro_train_batch_size_per_gpu=kn["micro_batch_size"],
                    algorithm=types.SimpleNamespace(advantage_batch_normalize=False,
                                                    loss_reduction=REDUCTIONS[kn["loss_agg_mode"]],
                                                    max_seq_len=width))),
                dispatch=types.SimpleNamespace(stage_data=stage_data,
                                               forward_backward_from_staged=forward_backward_from_staged,
                                               optim_step=optim_step))
            trainer._normalize_advantages = types.MethodType(normalize_advantages, trainer)
            metrics = execute_training_step(trainer, "policy", data)
        if len(captured) != rows // mini:
            raise RuntimeError(f"the step made {len(captured)} optimizer steps, expected {rows // mini} (one per "
                               f"mini-batch of {mini} rows)")
        keys = dict(METRIC_KEYS, **(SEQUENCE_METRIC_KEYS if kn.get("rollout_is") == "sequence_product" else {}))
        return {"old_log_probs": old, "grads": captured[0] if len(captured) == 1 else captured,
                "metrics": {name: metrics[key] for name, key in keys.items() if key in metrics}, "metric_keys": keys}

    return PolicyStep(run=run, modes=MODES, transcribed=TRANSCRIBED, metrics=tuple(METRIC_KEYS), token_budgets=True,
                      dp_sizes=(1, 2), mini_batches=True)


def _wrapper_class(forward):
    """A stand-in ``HFModelWrapper`` (its module imports flash-attn at load time, which this CPU build lacks)
    whose ``forward`` is SkyRL's own, compiled from the installed source, around a given model; the attributes
    ``HFModelWrapper.__init__`` sets for a model passed in (no sequence parallelism, no packing, not a VLM)."""

    class HFModelWrapperOnCPU:
        def __init__(self, model, entropy_fn):
            self.model, self.temperature, self.sequence_parallel_size = model, 1.0, 1
            self.attn_implementation, self.remove_microbatch_padding, self.is_vlm = "sdpa", False, False
            self.logprobs_chunk_size, self.chunked_entropy_from_logits_fn = 1024, entropy_fn

        def train(self, mode: bool = True):
            self.model.train(mode)
            return self

        def eval(self):
            return self.train(False)

        def __call__(self, *args, **kwargs):
            return self.forward(*args, **kwargs)

    HFModelWrapperOnCPU.forward = forward
    return HFModelWrapperOnCPU
