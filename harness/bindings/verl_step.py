"""verl's policy-gradient step (op ``policy_step``), driven through verl's own trainer and worker code.

The path, as ``RayPPOTrainer.fit`` runs it for one batch (verl 0.9.1, the engine-worker path, FSDP engine),
every function compiled from the installed source by :func:`.source.engine_function` (a fork's edit is what
runs; the modules do not import on this CPU machine: ``peft``, ``uvicorn``, ray):

1. ``batch.meta_info["temperature"]`` and ``["global_token_num"]`` set as ``fit`` sets them after generation;
2. ``RayPPOTrainer._compute_old_log_prob`` → ``ActorRolloutRefWorker.compute_log_prob`` →
   ``TrainingWorker.infer_batch`` → ``BaseEngine.infer_batch`` → ``FSDPEngine.forward_backward_batch``
   (forward only) → ``FSDPEngineWithLMHead.forward_step`` / ``prepare_model_inputs`` /
   ``prepare_model_outputs`` (temperature, remove-padding, log-probs, entropy) on the proximal model;
   ``fit``'s ``actor/entropy`` (``core_algos.agg_loss`` of the old path's entropy) and the union into the batch;
   with a rollout correction (the batch holds ``rollout_log_probs``), ``fit``'s decoupled mode:
   ``rollout_corr_helper.compute_rollout_correction_and_add_to_batch`` (rejection rewrites ``response_mask``: a row
   by ``rollout_rs="seq_mean_k1"``, a token by the token mask ``rollout_rs="token_k1"``, ``"0.5_2"``;
   token or sequence TIS (``rollout_is="token"`` / ``"sequence"``) adds ``rollout_is_weights``, which ``ppo_loss``
   hands the policy loss); with a KL loss,
   ``RayPPOTrainer._compute_ref_log_prob`` → ``ActorRolloutRefWorker.compute_ref_log_prob`` → the same engine path
   (forward only, the batch's temperature) on the reference model, and the union of ``ref_log_prob``;
3. ``RayPPOTrainer._update_actor`` (``left_right_2_no_padding``: the loss mask; the mini-batch's sizes,
   ``ppo_mini_batch_size`` × ``rollout.n``, as ``global_batch_size``) → ``ActorRolloutRefWorker.update_actor`` →
   ``TrainingWorker.train_mini_batch`` (the batch cut into mini-batches in order: ``shuffle`` off, ``ppo_epochs``
   1; one ``train_batch`` and one optimizer step each, the metrics appended per mini-batch) / ``train_batch`` /
   ``_postprocess_output`` → ``BaseEngine.train_batch`` → ``FSDPEngine.forward_backward_batch`` (the token
   count, ``prepare_micro_batches``, one backward per micro-batch) → ``forward_step`` → ``losses.ppo_loss``
   (``partial(ppo_loss, config=ActorConfig)`` as ``ActorRolloutRefWorker.init_model`` builds it);
4. ``reduce_metrics`` of the actor's metrics, as ``fit`` logs them (a mean over the mini-batches: declared,
   ``actor_metrics_mean_over_mini_batches``).

Stand-ins (:data:`TRANSCRIBED`, shown on every finding): the device (``get_device_id`` / ``get_device_name`` →
"cpu", also in ``seqlen_balancing`` while a step runs), FSDP (a plain module; gradient-sync deferral off), the engine's optimizer (``optimizer_zero_grad`` clears
the gradients; ``optimizer_step`` records them and returns their norm, and moves no parameter: the gradient compared
is the one before clipping and the update, one per mini-batch, each at the same parameters), the LR scheduler, the FLOPs counter (MFU 0), the DP group (DP size 1: the default group of
one rank; DP size 2: the update's ranks are threads of this process, each on its contiguous half of the batch as the
single controller dispatches it, the collectives exchanged in-process by :mod:`rlconform.harness.core.threaded_group`,
FSDP's gradient reduction the mean of the ranks' gradients, the old log-probs on one rank), no
autocast (float32 parameters: CUDA autocast does nothing on CPU). Knobs left at verl's defaults and not drawn:
``use_remove_padding`` True, policy losses other than vanilla and GSPO (``policy_loss.loss_mode="gspo"``,
``core_algos.compute_policy_loss_gspo``, with the configured clip ratios and ``loss_agg_mode``), KL losses other than
``low_var_kl``, ``k1`` and ``k2`` (``abs``, the straight-through ``+`` forms), rollout correction
other than token TIS, sequence TIS, ``seq_mean_k1`` rejection and the ``token_k1`` token mask (bypass mode,
batch-normalised weights, IcePop bands of the IS weights, the other rejection options, a token mask beside TIS), one
PPO epoch without shuffle, several mini-batches on one DP rank only (verl's DP ranks each cut their own chunk of the
batch into mini-batches, so its mini-batch j is not rows ``[j·size, (j + 1)·size)``). The Megatron engine's step
(``MegatronEngineWithLMHead``) is not driven: unchecked.
"""

from __future__ import annotations

import contextlib
import types

TRAINER = "verl.trainer.ppo.ray_trainer"
ENGINE_WORKERS = "verl.workers.engine_workers"
FSDP_IMPL = "verl.workers.engine.fsdp.transformer_impl"
BASE_ENGINE = "verl.workers.engine.base"

TRANSCRIBED = ("stand-ins: device 'cpu'; no FSDP; optimizer_step records the gradient (before clipping) and moves no "
               "parameter (each mini-batch's gradient at the same parameters); no LR "
               "scheduler; MFU 0; DP 1, and DP 2 as threads of one process with in-process collectives (the single "
               "controller's dispatch a contiguous DataProto.chunk; old log-probs on one rank; the gradient the mean of "
               "the ranks'); float32. Transcribed from fit: the order of its calls, actor/entropy (agg_loss of the old "
               "path's entropy), the unions into the batch; _balance_batch not applied. Not drawn: KL losses other than "
               "low_var_kl, k1 and k2 (abs, the straight-through '+' forms), rollout correction other than token "
               "TIS, sequence TIS, seq_mean_k1 rejection and the token_k1 token mask, policy losses other than "
               "vanilla and gspo, several mini-batches on DP 2, ppo_epochs > 1, shuffle, DP > 2, "
               "use_remove_padding=False; Megatron's step not driven")
#: the catalog's step variants this binding drives (every one the catalog has)
MODES = ("token-mean", "seq-mean-token-mean", "token-mean-with-tis", "token-mean-with-seq-tis",
         "token-mean-with-rejection", "seq-mean-token-mean-with-rejection", "token-mean-with-kl",
         "token-mean-with-kl-k1", "token-mean-with-kl-k2", "seq-mean-token-mean-with-gspo",
         "token-mean-with-token-mask")

#: the step's metrics as verl logs them (after ``reduce_metrics``), by the catalog's names
METRIC_KEYS = {"pg_loss": "actor/pg_loss", "entropy_loss": "actor/entropy_loss", "pg_clipfrac": "actor/pg_clipfrac",
               "pg_clipfrac_lower": "actor/pg_clipfrac_lower", "ppo_kl": "actor/ppo_kl", "entropy": "actor/entropy",
               "kl_loss": "actor/kl_loss",
               # fit logs the rollout correction's metrics beside the actor's
               "rollout_is_mean": "rollout_corr/rollout_is_mean", "rollout_is_min": "rollout_corr/rollout_is_min",
               "rollout_is_max": "rollout_corr/rollout_is_max",
               "rollout_is_fraction_high": "rollout_corr/rollout_is_ratio_fraction_high"}

_ENGINE_METHODS = ("FSDPEngine.forward_backward_batch", "FSDPEngine._get_packed_pad_size",
                   "FSDPEngine._gather_and_unpad_packed", "FSDPEngineWithLMHead.prepare_model_inputs",
                   "FSDPEngineWithLMHead.prepare_model_outputs", "FSDPEngineWithLMHead.forward_step")
_WORKER_METHODS = ("TrainingWorker.train_mini_batch", "TrainingWorker.train_batch", "TrainingWorker.infer_batch",
                   "TrainingWorker._postprocess_output")


def _on_cpu(fn):
    """``fn`` with verl's device lookups answering "cpu" (the device plumbing; nothing else of its globals)."""
    cpu = {"get_device_id": lambda: "cpu", "get_device_name": lambda: "cpu"}
    scope = dict(fn.__globals__)
    scope.update({k: v for k, v in cpu.items() if k in fn.__code__.co_names})
    out = types.FunctionType(fn.__code__, scope, fn.__name__, fn.__defaults__, fn.__closure__)
    out.__qualname__, out.__module__ = fn.__qualname__, fn.__module__
    return out


@contextlib.contextmanager
def _balancing_on_cpu():
    """verl's sequence balancing (dynamic batch size: ``seqlen_balancing.rearrange_micro_batches``) with its device
    lookup answering "cpu" while the step runs (the device plumbing, restored after)."""
    from unittest import mock

    import verl.utils.seqlen_balancing as balancing

    with mock.patch.object(balancing, "get_device_name", lambda: "cpu"):
        yield


def _world():
    import torch.distributed

    return torch.distributed.group.WORLD


def _engine_class():
    """A class whose step methods are verl's own (FSDP engine and its LM-head subclass, BaseEngine's
    train_batch / infer_batch) and whose optimizer, modes and parallel groups are stand-ins."""
    from .source import engine_function

    methods = {q.split(".")[1]: _on_cpu(engine_function(FSDP_IMPL, q)) for q in _ENGINE_METHODS}
    methods["_gradient_sync_context"] = contextlib.contextmanager(
        engine_function(FSDP_IMPL, "FSDPEngine._gradient_sync_context"))
    methods["train_batch"] = engine_function(BASE_ENGINE, "BaseEngine.train_batch")
    methods["infer_batch"] = engine_function(BASE_ENGINE, "BaseEngine.infer_batch")

    def optimizer_zero_grad(self):
        self.module.zero_grad(set_to_none=True)

    def optimizer_step(self):
        import torch

        grads = {name: p.grad.detach().clone() for name, p in self.module.named_parameters() if p.grad is not None}
        self.captured.append(grads)
        return torch.sqrt(sum((g.double() ** 2).sum() for g in grads.values())) if grads else torch.tensor(0.0)

    methods.update(
        optimizer_zero_grad=optimizer_zero_grad, optimizer_step=optimizer_step, lr_scheduler_step=lambda self: None,
        # one rank: the default process group of one rank (the binding's one_rank_group), as a one-GPU FSDP run
        # has: not None, which sends _postprocess_output's metrics down a path no real run takes; several: the
        # engine's ThreadedGroup (its ranks are threads of this process)
        get_data_parallel_group=lambda self: self.dp_group or _world(), get_data_parallel_size=lambda self: self.dp_size,
        get_data_parallel_rank=lambda self: self.dp_group.rank() if self.dp_group else 0,
        is_mp_src_rank_with_outputs=lambda self: True,
        train_mode=lambda self, **kw: contextlib.nullcontext(), eval_mode=lambda self, **kw: contextlib.nullcontext())
    return type("FSDPEngineWithLMHeadOnCPU", (), methods)


def _engine_config(micro_batch_size: int, max_token_len: int | None = None):
    """The engine config: micro-batches of ``micro_batch_size`` rows, or by token count (``use_dynamic_bsz``) with
    ``max_token_len`` tokens per micro-batch on both the update and the log-prob paths."""
    budget = max_token_len or 16384
    return types.SimpleNamespace(
        entropy_checkpointing=False, entropy_from_logits_with_chunking=False, entropy_from_logits_chunk_size=2048,
        use_no_sync_for_gradient_accumulation=False, use_dynamic_bsz=max_token_len is not None,
        max_token_len_per_gpu=budget, infer_max_token_len_per_gpu=budget, micro_batch_size_per_gpu=micro_batch_size,
        infer_micro_batch_size_per_gpu=micro_batch_size, use_fused_kernels=False, forward_only=False)


def _actor_config(kn: dict, rows: int, actor_fields: dict, loss_fields: dict):
    """verl's ``ActorConfig`` for the knobs (the fields this verl has), as ``ActorRolloutRefWorker.init_model``
    hands it to ``ppo_loss``; ``rows``: the mini-batch's (``ppo_mini_batch_size``); ``actor_fields`` /
    ``loss_fields``: the binding's defaults of the actor config and of its ``policy_loss`` section."""
    from verl.workers.config.actor import ActorConfig, PolicyLossConfig

    from ._compat import accepted_keywords

    fields = {k: v for k, v in actor_fields.items() if k != "clip_ratio"}
    fields.update(entropy_coeff=kn["entropy_coeff"], loss_agg_mode=kn["loss_agg_mode"],
                  clip_ratio_low=kn["clip_ratio_low"], clip_ratio_high=kn["clip_ratio_high"],
                  clip_ratio_c=kn["clip_ratio_c"], ppo_mini_batch_size=rows,
                  ppo_micro_batch_size_per_gpu=kn["micro_batch_size"], use_dynamic_bsz=kn.get("max_token_len") is not None,
                  ppo_max_token_len_per_gpu=kn.get("max_token_len") or 16384,
                  use_kl_loss=bool(kn.get("kl_loss_coef")), kl_loss_coef=float(kn.get("kl_loss_coef") or 0.0),
                  kl_loss_type=kn.get("kl_loss_type") or "low_var_kl")
    loss = PolicyLossConfig(**accepted_keywords(PolicyLossConfig, dict(
        {k: v for k, v in loss_fields.items() if k != "loss_mode"}, loss_mode=kn.get("policy_loss") or "vanilla")))
    return ActorConfig(**accepted_keywords(ActorConfig, dict(fields, policy_loss=loss)))


def rollout_correction_config(kn: dict) -> dict | None:
    """verl's ``algorithm.rollout_correction`` for the step's knobs (None: no correction): ``rollout_is`` /
    ``rollout_is_threshold``, and each rejection option ``(level, estimator, lower, upper)`` as verl spells it
    (``rollout_rs="seq_mean_k1"``, ``rollout_rs_threshold="0.8_1.25"``; the token mask ``"token_k1"``, ``"0.5_2"``;
    options joined by ",")."""
    options = tuple(kn.get("rollout_rejection") or ())
    if not kn.get("rollout_is") and not options:
        return None
    names = [f"{level}_{est}" for level, est, _, _ in options]
    thresholds = [f"{lower:g}_{upper:g}" if lower is not None else f"{upper:g}" for _, _, lower, upper in options]
    level = {"token": "token", "sequence_product": "sequence"}.get(kn.get("rollout_is"))
    return {"rollout_is": level, "rollout_is_threshold": kn.get("rollout_is_cap") or 2.0,
            "rollout_is_batch_normalize": False, "rollout_rs": ",".join(names) or None,
            "rollout_rs_threshold": ",".join(thresholds) or None, "bypass_mode": False}


def policy_step(one_rank_group, actor_fields: dict, loss_fields: dict):
    """The :class:`~rlconform.harness.catalog.binding.PolicyStep` of verl (module doc). ``one_rank_group(needed)``:
    the binding's context manager that provides a default process group of one rank; ``actor_fields`` /
    ``loss_fields``: its actor-config defaults. Raises ``ModuleNotFoundError`` / ``AttributeError`` when the
    installed verl lacks a piece of the path (a binding error of this op)."""
    import functools

    import torch
    import verl.utils.torch_functional as verl_F
    from omegaconf import OmegaConf
    from verl import DataProto
    from verl.trainer.ppo.core_algos import agg_loss
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch
    from verl.utils.metric import reduce_metrics
    from verl.workers.utils.losses import ppo_loss

    from rlconform.harness.catalog.binding import PolicyStep
    from rlconform.harness.catalog.engine_site import calls
    from rlconform.harness.core.threaded_group import ThreadedGroup, collectives
    from rlconform.harness.core.tiny_lm import TinyLM

    from .source import engine_function

    compute_old_log_prob = engine_function(TRAINER, "RayPPOTrainer._compute_old_log_prob")
    update_actor = engine_function(TRAINER, "RayPPOTrainer._update_actor")
    compute_ref_log_prob = engine_function(TRAINER, "RayPPOTrainer._compute_ref_log_prob")
    worker_methods = {q.split(".")[1]: engine_function(ENGINE_WORKERS, q) for q in _WORKER_METHODS}
    rollout_worker = {q: engine_function(ENGINE_WORKERS, f"ActorRolloutRefWorker.{q}")
                      for q in ("compute_log_prob", "update_actor", "compute_ref_log_prob")}
    engine_class = _engine_class()
    worker_class = type("TrainingWorkerOnCPU", (), worker_methods)

    def training_worker(params, kn, loss_fn, dp_group=None):
        engine = engine_class()
        engine.module, engine.captured = TinyLM(params), []
        engine.dp_group, engine.dp_size = dp_group, dp_group.size if dp_group else 1
        engine.engine_config = _engine_config(kn["micro_batch_size"], kn.get("max_token_len"))
        engine.ulysses_sequence_parallel_size, engine.use_ulysses_sp = 1, False
        engine.pad_to_length, engine.pad_to_length_bucket = False, 1
        engine.scaler, engine._autocast_dtype = None, torch.float32
        engine.compute_entropy_from_logits = verl_F.entropy_from_logits
        worker = worker_class()
        worker.engine, worker.engine_config, worker.loss_fn = engine, engine.engine_config, loss_fn
        worker.model_config = {"use_remove_padding": True}
        worker.profiler = types.SimpleNamespace(step=lambda: None)
        worker.device_name = "cpu"
        worker.flops_counter = types.SimpleNamespace(estimate_flops=lambda *a, **k: (0.0, 1.0))
        return worker

    @calls(ppo_loss, compute_old_log_prob, update_actor, compute_rollout_correction_and_add_to_batch, compute_ref_log_prob, *rollout_worker.values(), *worker_methods.values(),
           *(getattr(engine_class, q.split(".")[1]) for q in _ENGINE_METHODS))
    def run(batch, params, old_params, kn):
        rows = int(batch["input_ids"].shape[0])
        # ppo_mini_batch_size: prompts per mini-batch, × rollout.n (1 here) in _update_actor; every row by default
        mini = int(kn.get("mini_batch_size") or rows)
        if rows % mini:
            raise ValueError(f"{rows} rows do not split into mini-batches of {mini}")
        loss_fn = functools.partial(ppo_loss, config=_actor_config(kn, mini, actor_fields, loss_fields))
        old_actor = training_worker(old_params, kn, loss_fn)
        dp = int(kn.get("dp_size") or 1)
        group = ThreadedGroup(dp) if dp > 1 else None
        # each DP rank's model starts from the same parameters, as FSDP's shards of one model do
        actors = [training_worker({k: v.clone() for k, v in params.items()}, kn, loss_fn, group) for _ in range(dp)]

        def update_on_ranks(data):
            # the single controller's DP dispatch: contiguous equal chunks, one per rank; every rank's output holds
            # the same metrics after _postprocess_output's all-gather: rank 0's is returned
            if group is None:
                return rollout_worker["update_actor"](types.SimpleNamespace(actor=actors[0]), data)
            chunks = data.chunk(dp)
            with collectives():
                return group.run([functools.partial(rollout_worker["update_actor"],
                                                    types.SimpleNamespace(actor=actors[k]), chunks[k])
                                  for k in range(dp)])[0]

        wg = types.SimpleNamespace(
            compute_log_prob=functools.partial(rollout_worker["compute_log_prob"],
                                               types.SimpleNamespace(actor=old_actor)),
            update_actor=update_on_ranks)
        ref_wg = None
        if kn.get("kl_loss_coef"):  # a separate reference worker (ref_in_actor: LoRA only)
            ref = training_worker(kn["ref_params"], kn, loss_fn)
            ref_wg = types.SimpleNamespace(compute_ref_log_prob=functools.partial(
                rollout_worker["compute_ref_log_prob"], types.SimpleNamespace(ref=ref)))
        trainer = types.SimpleNamespace(actor_rollout_wg=wg, ref_policy_wg=ref_wg, ref_in_actor=False,
                                        distillation_config=None, config=OmegaConf.create({
            "actor_rollout_ref": {
                "actor": {"calculate_entropy": False, "entropy_coeff": kn["entropy_coeff"], "ppo_mini_batch_size": mini,
                          "ppo_epochs": 1, "data_loader_seed": 42, "shuffle": False,
                          "loss_agg_mode": kn["loss_agg_mode"], "loss_scale_factor": None},
                "rollout": {"n": 1, "temperature": kn["temperature"], "multi_turn": {"enable": False}}}}))
        data = DataProto.from_dict(tensors={k: v.clone() for k, v in batch.items()},
                                   meta_info={"temperature": kn["temperature"],  # fit, after generation
                                              "global_token_num": batch["attention_mask"].sum(-1).tolist()})
        with one_rank_group(True), _balancing_on_cpu():
            # fit: old log-probs, actor/entropy of the old path, the union into the batch
            old_log_prob, _ = compute_old_log_prob(trainer, data)
            entropy = agg_loss(loss_mat=old_log_prob.batch["entropys"], loss_mask=data.batch["response_mask"],
                               loss_agg_mode=kn["loss_agg_mode"], loss_scale_factor=None)
            old_log_probs = old_log_prob.batch["old_log_probs"].clone()
            old_log_prob.batch.pop("entropys")
            data = data.union(old_log_prob)
            if ref_wg is not None:  # fit: use_reference_policy, after the old log-probs
                data = data.union(compute_ref_log_prob(trainer, data))
            correction, correction_metrics = rollout_correction_config(kn), {}
            if correction is not None:  # fit, decoupled mode: after the old log-probs, before the update
                data, correction_metrics = compute_rollout_correction_and_add_to_batch(data, correction)
            actor_output = update_actor(trainer, data)
        metrics = reduce_metrics(dict(actor_output.meta_info["metrics"]))
        metrics["actor/entropy"] = entropy.detach().item()
        metrics.update(correction_metrics)  # fit: metrics.update(is_metrics)
        steps = rows // mini
        for actor in actors:
            if len(actor.engine.captured) != steps:
                raise RuntimeError(f"the step made {len(actor.engine.captured)} optimizer steps, expected {steps} "
                                   f"(one per mini-batch of {mini} rows)")
        # FSDP's gradient reduction: the mean of the ranks' gradients, at each optimizer step
        grads = [{name: sum(a.engine.captured[j][name] for a in actors) / dp for name in actors[0].engine.captured[j]}
                 for j in range(steps)]
        return {"old_log_probs": old_log_probs, "grads": grads[0] if steps == 1 else grads,
                "metrics": {name: metrics[key] for name, key in METRIC_KEYS.items() if key in metrics},
                "metric_keys": dict(METRIC_KEYS)}

    return PolicyStep(run=run, modes=MODES, transcribed=TRANSCRIBED, token_budgets=True, dp_sizes=(1, 2),
                      mini_batches=True)
