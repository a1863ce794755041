"""Which verl 0.9.1 configuration reaches each op and variant (``Binding.configs``,
:mod:`rlconform.harness.report.config_reach`): the ``ppo_trainer.yaml`` keys and values under which the trainer
runs it. An op not listed runs under any configuration. Conditions are ``(key, op, value)`` with op ``==``,
``!=``, ``in`` (value a tuple) or ``~`` (a regular expression over the value as text, then its words)."""

from __future__ import annotations

from rlconform.harness.catalog.binding import twins

from .verl_step import MODES as STEPS  # the step's variants this binding drives

A = "actor_rollout_ref.actor"
ALGO = "algorithm"
RC = "algorithm.rollout_correction"
MEGATRON = ((f"{A}.strategy", "==", "megatron"),)
HELPER = "verl.trainer.ppo.rollout_corr_helper"

#: the keys the conditions read, and where a value is missing from the installed verl's config: its default
#: there (``_generated_ppo_trainer.yaml``; read at run time by :func:`defaults`, these are the fallbacks)
DEFAULTS = {
    f"{A}.strategy": "fsdp", f"{A}.loss_agg_mode": "token-mean", f"{A}.policy_loss.loss_mode": "vanilla",
    f"{A}.entropy_coeff": 0, f"{A}.calculate_sum_pi_squared": False, f"{A}.use_kl_loss": False,
    f"{A}.kl_loss_type": "low_var_kl", f"{A}.entropy_from_logits_with_chunking": False,
    "actor_rollout_ref.model.use_fused_kernels": False, "critic.loss_agg_mode": "token-mean",
    f"{ALGO}.adv_estimator": "gae", f"{ALGO}.norm_adv_by_std_in_grpo": True, f"{ALGO}.use_kl_in_reward": False,
    f"{ALGO}.kl_penalty": "kl", f"{RC}.rollout_is": None, f"{RC}.rollout_is_threshold": 2.0,
    f"{RC}.rollout_rs": None, f"{RC}.rollout_rs_threshold": None, f"{RC}.rollout_is_batch_normalize": False,
    f"{A}.calculate_entropy": False, "critic.enable": None,
}
#: a key a configuration sets through another: ``model_engine=megatron`` (Hydra's defaults override,
#: ppo_megatron_trainer.yaml) selects the Megatron engine
DERIVED = {f"{A}.strategy": ("model_engine", {"megatron": "megatron", "fsdp": "fsdp", "dp": "fsdp"})}
FSDP = (f"{A}.strategy", "!=", "megatron")
#: a default that follows another key unless set (``critic.loss_agg_mode: ${oc.select:…actor.loss_agg_mode,…}``)
FOLLOWS = {"critic.loss_agg_mode": f"{A}.loss_agg_mode"}




def _estimator(name: str, **extra) -> tuple:
    return ((f"{ALGO}.adv_estimator", "==", name), *((f"{ALGO}.{k}", "==", v) for k, v in extra.items()))


def _kl(estimator: str) -> tuple:
    """A KL estimator reaches the step two ways: the KL loss or the KL penalty in the reward."""
    return (((f"{A}.use_kl_loss", "==", True), (f"{A}.kl_loss_type", "==", estimator)),
            ((f"{ALGO}.use_kl_in_reward", "==", True), (f"{ALGO}.kl_penalty", "==", estimator)))


def _step(variant: str) -> tuple:
    mode, _, correction = variant.partition("-with-")
    extra = {"tis": ((f"{RC}.rollout_is", "==", "token"),),
             "seq-tis": ((f"{RC}.rollout_is", "==", "sequence"),),
             "rejection": ((f"{RC}.rollout_rs", "==", "seq_mean_k1"),),
             # the token mask, alone or chained with other options (each option's mask is ANDed)
             "token-mask": ((f"{RC}.rollout_rs", "~", r"(^|,)\s*token_k1\s*(,|$)", "token_k1 among its options"),),
             "kl": ((f"{A}.use_kl_loss", "==", True),),
             # the estimator variants: k1 / k2 as verl spells them (the k3 variant's wiring holds for any estimator;
             # the straight-through "+" forms, k2's gradient under another value, are not drawn)
             "kl-k1": ((f"{A}.use_kl_loss", "==", True), (f"{A}.kl_loss_type", "in", ("kl", "k1"))),
             "kl-k2": ((f"{A}.use_kl_loss", "==", True), (f"{A}.kl_loss_type", "in", ("mse", "k2"))),
             # GSPO's wiring (its row mean in the micro-batch loop) holds whatever its clip ratios and loss_agg_mode
             "gspo": ((f"{A}.policy_loss.loss_mode", "==", "gspo"),),
             }.get(correction, ())
    # a correction drawn on one loss_agg_mode only is not a check of the mode: its row holds under any mode (a
    # filter must not hide a defect from a configuration that reaches it); one drawn on two modes keeps its mode,
    # so a row only one of the pair reaches is not said to hold under the other
    return (*(() if correction and variant not in _STEP_TWINS else ((f"{A}.loss_agg_mode", "==", mode),)), *extra)


#: the step's variants drawn on two loss_agg_modes (config_reach's ``twins``)
_STEP_TWINS = twins(STEPS, f"{A}.loss_agg_mode")
TWINS = {"policy_step": _STEP_TWINS, "policy_step_metrics": _STEP_TWINS}


def ops(rollout_rs: dict) -> dict:
    """op -> {catalog variant ("" for the op's own, "*" for any) -> alternatives (tuples of conditions, any one
    of which reaches it)}; ``rollout_rs``: the binding's variant -> (rollout_rs, rollout_rs_threshold)."""
    agg = ("token-mean", "token-sum", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
    losses = ("vanilla", "geo_mean", "gspo", "clip_cov", "kl_cov", "gpg", "cispo", "dppo_kl", "dppo_tv", "dro",
              "sapo")
    estimators = {"grpo": _estimator("grpo"), "drgrpo": _estimator("grpo", norm_adv_by_std_in_grpo=False),
                  "grpo+vectorized": _estimator("grpo_vectorized"),
                  "drgrpo+vectorized": _estimator("grpo_vectorized", norm_adv_by_std_in_grpo=False),
                  "rloo": _estimator("rloo"), "rloo+vectorized": _estimator("rloo_vectorized"),
                  **{e: _estimator(e) for e in ("gdpo", "gpg", "grpo_passk", "opo", "reinforce_plus_plus",
                                                "reinforce_plus_plus_baseline", "remax")}}
    kl = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
    rejection = {}
    for variant, (option, threshold) in rollout_rs.items():
        conds = [(f"{RC}.rollout_rs", "==", option)]
        if variant.endswith("_asym"):  # an asymmetric lower_upper pair
            conds.append((f"{RC}.rollout_rs_threshold", "~", r"^[0-9.eE+-]+_[0-9.eE+-]+$",
                          "a lower_upper pair (lower ≠ 1/upper)"))
        rejection[variant] = (tuple(conds),)
    return {
        "agg_loss": {m: (((f"{A}.loss_agg_mode", "==", m),),) for m in agg},
        "value_loss": {m: (((f"{ALGO}.adv_estimator", "==", "gae"), ("critic.loss_agg_mode", "==", m)),)
                       for m in agg},
        "gae": {"": (_estimator("gae"),)},
        "policy_loss": {m: (((f"{A}.policy_loss.loss_mode", "==", m),),) for m in losses},
        "outcome_advantage": {k: (v,) for k, v in estimators.items()},
        "optimal_token_baseline": {"": (_estimator("optimal_token_baseline"),
                                        _estimator("tir_optimal_token_baseline"))},
        "importance_ratio": {"token_tis": (((f"{RC}.rollout_is", "==", "token"),),),
                             "sequence_tis": (((f"{RC}.rollout_is", "==", "sequence"),),),
                             "token_icepop": (((f"{RC}.rollout_is", "==", "token"),
                                               (f"{RC}.rollout_is_threshold", "~", r"_",
                                                "a lower_upper band (IcePop)")),)},
        "rollout_rejection_mask": rejection,
        "kl_estimator": {k: _kl(k) for k in kl},
        "entropy": {"chunked": (((f"{A}.entropy_from_logits_with_chunking", "==", True),),)},
        "vocab_parallel_entropy": {"": (MEGATRON,),
                                   "chunked": ((*MEGATRON, (f"{A}.entropy_from_logits_with_chunking", "==", True)),)},
        "vocab_parallel_token_logprobs": {"*": (MEGATRON,)},
        "vocab_parallel_sum_pi_squared": {"*": ((*MEGATRON, (f"{A}.calculate_sum_pi_squared", "==", True)),)},
        "sum_pi_squared": {"*": (((f"{A}.calculate_sum_pi_squared", "==", True),),)},
        "fused_linear_token_stats": {"*": ((("actor_rollout_ref.model.use_fused_kernels", "==", True),),)},
        "policy_step": {v: (_step(v),) for v in STEPS},
        "policy_step_metrics": {v: (_step(v),) for v in STEPS},
    }


#: engine functions that run only under some configuration, whichever op found their row: row class -> alternatives
_ENTROPY_ON = (((f"{A}.entropy_coeff", "!=", 0),), ((f"{A}.calculate_entropy", "==", True),))
_PLAIN_ENTROPY = (FSDP, ("actor_rollout_ref.model.use_fused_kernels", "==", False),
                  (f"{A}.entropy_from_logits_with_chunking", "==", False))
SITES = {
    f"{HELPER}.compute_is_metrics": {
        # the ESS division: every applied weight 0, which a truncation cap never gives (weights ≥ e^-20 > 0)
        "crash": (((f"{RC}.rollout_is", "in", ("token", "sequence")),
                   (f"{RC}.rollout_is_threshold", "~", r"_", "a lower_upper band (IcePop)")),),
        "": (((f"{RC}.rollout_is", "in", ("token", "sequence")),),)},
    # the sequence level's row statistics (the fraction above the cap, the min and max over every row)
    f"{HELPER}.compute_is_metrics[sequence_level]": {"": (((f"{RC}.rollout_is", "==", "sequence"),),)},
    # called for every batch that carries rollout log-probs (rollout.calculate_log_probs, default true)
    f"{HELPER}.compute_offpolicy_metrics": {"": ((),)},
    # k1 estimators of every level share token_k1 = −log r
    f"{HELPER}.compute_rollout_rejection_mask": {
        "wrong value": (((f"{RC}.rollout_rs", "~", r"k1"), (f"{RC}.rollout_rs_threshold", "asym", None)),)},
    "verl.utils.torch_functional.distributed_masked_mean": {"": (((f"{RC}.rollout_is_batch_normalize", "==", True),),)},
    "verl.utils.megatron.tensor_parallel.vocab_parallel_entropy_with_chunking": {
        "": tuple((*MEGATRON, (f"{A}.entropy_from_logits_with_chunking", "==", True), *on) for on in _ENTROPY_ON)},
    "verl.utils.torch_functional.entropy_from_logits": {"": (_PLAIN_ENTROPY,)},
    "verl.utils.torch_functional.entropy_from_logits_with_chunking": {
        "": ((FSDP, (f"{A}.entropy_from_logits_with_chunking", "==", True)),)},
    "verl.utils.torch_functional.calculate_sum_pi_squared_from_logits": {
        "": ((FSDP, (f"{A}.calculate_sum_pi_squared", "==", True)),)},
    # every actor update runs it
    "verl.workers.utils.losses.ppo_loss": {"": ((),)},
    # the critic's loss: a critic is trained when critic.enable is true, or left unset with GAE
    # (trainer/ppo/utils.py need_critic)
    "verl.workers.utils.losses.value_loss": {"": ((("critic.enable", "==", True),),
                                                  (*_estimator("gae"), ("critic.enable", "!=", False)))},
    # the seq-mean modes (and SAPO's row mean) divide by global_batch_size; the trigger adds the rejection
    "verl.trainer.ppo.core_algos.agg_loss": {
        "wrong value": (((f"{A}.loss_agg_mode", "in", ("seq-mean-token-mean", "seq-mean-token-sum",
                                                      "seq-mean-token-sum-norm")),),
                        ((f"{A}.policy_loss.loss_mode", "==", "sapo"),))},
}


#: a row's trigger that is itself a configuration: its conditions join every alternative of its members
TRIGGERS = (
    (r"rollout rejection \(rollout_rs\)", ((f"{RC}.rollout_rs", "!=", None),)),
)


def defaults() -> dict:
    """The installed verl's defaults of :data:`DEFAULTS`' keys, read from its ``_generated_ppo_trainer.yaml``
    (unresolved: a value that follows another key is recorded in :data:`FOLLOWS`); a key the file lacks, or a
    file that cannot be read, keeps the fallback."""
    out = dict(DEFAULTS)
    try:
        import importlib.resources

        import yaml

        text = (importlib.resources.files("verl") / "trainer" / "config" / "_generated_ppo_trainer.yaml").read_text()
        doc = yaml.safe_load(text)
    except Exception:  # noqa: BLE001 - no readable config: the fallbacks
        return out
    for key in DEFAULTS:
        node = doc
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node is not None and not (isinstance(node, str) and node.startswith("${")) or (
                node is None and _present(doc, key)):
            out[key] = node
    return out


def _present(doc: dict, key: str) -> bool:
    node = doc
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True
