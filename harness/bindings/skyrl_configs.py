"""Which SkyRL 0.4.0 configuration reaches each op and variant (``Binding.configs``,
:mod:`rlconform.harness.report.config_reach`): the ``trainer.*`` keys of SkyRL's config (``skyrl.train.config``)
and the values under which the trainer runs it. An op not listed runs under any configuration."""

from __future__ import annotations

from rlconform.harness.catalog.binding import twins

from .skyrl_step import MODES as STEPS  # the step's variants this binding drives

ALGO = "trainer.algorithm"
OPC = f"{ALGO}.off_policy_correction"

#: the keys the conditions read and their defaults where the installed SkyRL's AlgorithmConfig cannot be read
DEFAULTS = {
    f"{ALGO}.advantage_estimator": "grpo", f"{ALGO}.policy_loss_type": "regular",
    f"{ALGO}.loss_reduction": "token_mean", f"{ALGO}.use_kl_loss": True, f"{ALGO}.kl_estimator_type": "k3",
    f"{ALGO}.use_kl_in_reward": False, f"{ALGO}.use_entropy_loss": False, f"{ALGO}.grpo_norm_by_std": True,
    f"{OPC}.tis_ratio_type": None, f"{OPC}.sequence_mask_metric": None,
    f"{OPC}.token_mask_is_threshold_low": None, f"{OPC}.token_mask_is_threshold_high": None,
    f"{OPC}.outlier_token_is_threshold_low": None, f"{OPC}.outlier_token_is_threshold_high": None,
    f"{ALGO}.temperature": None, "generator.sampling_params.temperature": 1.0, "trainer.strategy": "fsdp",
}
#: the masks of the off-policy correction, each as SkyRL enables it: a sequence mask by its metric, the token mask
#: with both thresholds, the outlier mask with either
MASKS = (((f"{OPC}.sequence_mask_metric", "!=", None),),
         ((f"{OPC}.token_mask_is_threshold_low", "!=", None), (f"{OPC}.token_mask_is_threshold_high", "!=", None)),
         ((f"{OPC}.outlier_token_is_threshold_low", "!=", None),),
         ((f"{OPC}.outlier_token_is_threshold_high", "!=", None),))
#: any correction at all (compute_off_policy_correction then runs and logs its is_ratio_* metrics)
CORRECTIONS = (((f"{OPC}.tis_ratio_type", "!=", None),), *MASKS)
#: the sampling temperature the policy's log-probs use (algorithm.temperature is copied from it)
TEMPERED = ("generator.sampling_params.temperature", "!=", 1.0)
#: SkyRL 0.4.0's built-in policy losses (``PolicyLossRegistry.repopulate_registry``, utils/ppo_utils.py)
BUILT_IN_POLICY_LOSSES = ("regular", "dual_clip", "gspo", "cispo", "clip_cov", "kl_cov", "sapo", "cross_entropy",
                          "importance_sampling", "dppo", "rollout_is")
#: engine functions that run only under some configuration, whichever op found their row: row class -> alternatives
SITES = {
    "skyrl.backends.skyrl_train.workers.worker.RefWorkerBase._forward_micro_batch": {
        # the KL loss or the KL in the reward, never both (train/utils/utils.py validate_cfg asserts it)
        "": tuple((*kl, TEMPERED, ("trainer.strategy", "!=", "megatron"))
                  for kl in (((f"{ALGO}.use_kl_loss", "==", True),),
                             ((f"{ALGO}.use_kl_in_reward", "==", True), (f"{ALGO}.use_kl_loss", "==", False))))},
    "skyrl.backends.skyrl_train.workers.worker.PolicyWorkerBase._forward_backward_micro": {
        "partition": (((f"{ALGO}.use_entropy_loss", "==", True),),),
        "wrong value": tuple((*m, on) for m in MASKS for on in ((f"{ALGO}.use_entropy_loss", "==", True),
                                                             (f"{ALGO}.use_kl_loss", "==", True)))},
    "skyrl.backends.skyrl_train.utils.off_policy_correction_utils.compute_off_policy_correction[is_ratio_min]": {
        "": CORRECTIONS},
    "skyrl.backends.skyrl_train.utils.ppo_utils.ppo_policy_loss": {"wrong value": MASKS},
    # every built-in policy loss but importance_sampling ends in it
    "skyrl.backends.skyrl_train.utils.ppo_utils.reduce_loss": {"": ((),)},
    # a metric value that is not a Python number: every built-in policy loss and correction logs .item() floats, so
    # only a loss registered by the user (register_policy_loss) hands reduce_metrics NumPy scalars or tensors
    "skyrl.backends.skyrl_train.workers.worker_utils.reduce_metrics": {
        "missing output": (((f"{ALGO}.policy_loss_type", "~", rf"^(?!(?:{'|'.join(BUILT_IN_POLICY_LOSSES)})$)",
                             "a policy loss of your own (register_policy_loss) that logs NumPy scalars or tensors"),),)},
}


def _reduction(mode: str) -> tuple:
    return ((f"{ALGO}.loss_reduction", "==", mode),)




#: the step's variants drawn on two loss reductions (config_reach's ``twins``)
_STEP_TWINS = twins(STEPS, f"{ALGO}.loss_reduction")
TWINS = {"policy_step": _STEP_TWINS, "policy_step_metrics": _STEP_TWINS}


def ops(policy_losses: dict, modes: dict, estimators: dict) -> dict:
    """op -> {catalog variant -> alternatives} from the binding's own tables: ``policy_losses`` (SkyRL's
    policy_loss_type -> [(catalog variant, overrides)]), ``modes`` (catalog loss_agg_mode -> loss_reduction),
    ``estimators`` (advantage_estimator -> catalog variants)."""
    losses = {variant: (((f"{ALGO}.policy_loss_type", "==", name),),)
              for name, pairs in policy_losses.items() for variant, _ in pairs}
    advantage = {}
    for name, variants in estimators.items():
        for variant in variants:
            conds = [(f"{ALGO}.advantage_estimator", "==", name)]
            if variant == "drgrpo":
                conds.append((f"{ALGO}.grpo_norm_by_std", "==", False))
            advantage[variant] = (tuple(conds),)
    kl = {e: (((f"{ALGO}.use_kl_loss", "==", True), (f"{ALGO}.kl_estimator_type", "==", e)),
              ((f"{ALGO}.use_kl_in_reward", "==", True), (f"{ALGO}.kl_estimator_type", "==", e)))
          for e in ("k1", "k2", "k3", "abs")}
    steps = {}
    for variant in STEPS:
        mode, _, correction = variant.partition("-with-")
        # a rejected row: any of the correction's masks drops it the same way inside the policy loss
        extras = {"tis": (((f"{OPC}.tis_ratio_type", "==", "token"),),),
                  "seq-tis": (((f"{OPC}.tis_ratio_type", "==", "sequence"),),),
                  "rejection": MASKS,
                  "token-mask": (MASKS[1],),  # the token mask, both thresholds set
                  "kl": (((f"{ALGO}.use_kl_loss", "==", True),),),
                  "kl-k1": (((f"{ALGO}.use_kl_loss", "==", True), (f"{ALGO}.kl_estimator_type", "==", "k1")),),
                  "kl-k2": (((f"{ALGO}.use_kl_loss", "==", True), (f"{ALGO}.kl_estimator_type", "==", "k2")),),
                  # GSPO's wiring holds whatever its clip ratios and loss reduction
                  "gspo": (((f"{ALGO}.policy_loss_type", "==", "gspo"),),),
                  }.get(correction, ((),))
        # a correction drawn on one loss reduction only is not a check of the reduction: its row holds under any
        # reduction (a filter must not hide a defect from a configuration that reaches it); one drawn on two
        # reductions keeps its reduction, so a row only one of the pair reaches is not said to hold under the other
        base = () if correction and variant not in _STEP_TWINS else _reduction(modes[mode])
        steps[variant] = tuple((*base, *extra) for extra in extras)
    return {
        "agg_loss": {m: (_reduction(r),) for m, r in modes.items()},
        "value_loss": {"*": (((f"{ALGO}.advantage_estimator", "==", "gae"),),)},
        "gae": {"": (((f"{ALGO}.advantage_estimator", "==", "gae"),),)},
        "policy_loss": losses,
        "outcome_advantage": advantage,
        "importance_ratio": {"token_tis": (((f"{OPC}.tis_ratio_type", "==", "token"),),),
                             "sequence_tis": (((f"{OPC}.tis_ratio_type", "==", "sequence"),),)},
        "rollout_rejection_mask": {
            "token_k1": (MASKS[1],), "token_k1_asym": (MASKS[1],),
            "seq_sum_k1": (((f"{OPC}.sequence_mask_metric", "==", "product"),),),
            "seq_mean_k1": (((f"{OPC}.sequence_mask_metric", "==", "geometric"),),),
            "seq_all_k1": MASKS[2:]},
        "kl_estimator": kl,
        "policy_step": steps,
        "policy_step_metrics": steps,
    }


#: a row's trigger that is itself a configuration: its conditions join every alternative of its members
TRIGGERS = (
    (r"^use_kl_loss=True", ((f"{ALGO}.use_kl_loss", "==", True),)),
)


def defaults() -> dict:
    """The installed SkyRL's defaults of :data:`DEFAULTS`' keys, read from its ``AlgorithmConfig``; a key it lacks,
    or a SkyRL that cannot be imported, keeps the fallback."""
    out = dict(DEFAULTS)
    try:
        from ._compat import import_skyrl

        algorithm = import_skyrl("skyrl.train.config").AlgorithmConfig()
    except Exception:  # noqa: BLE001 - no SkyRL here: the fallbacks
        return out
    for key in DEFAULTS:
        if not key.startswith(f"{ALGO}."):  # a key outside AlgorithmConfig keeps its fallback
            continue
        node = algorithm
        for part in key.split(".")[2:]:
            node = getattr(node, part, KeyError)
        if node is not KeyError:
            out[key] = node
    return out
