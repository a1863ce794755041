"""Why verl 0.9.1's defects happen and how to fix them (``Binding.remedies``, :mod:`rlconform.harness.report.remedies`):
engine function -> {kinds of failure, or (kinds, trigger): (cause, fix[, impact on training])}. A row these do
not cover gets its idiom's sentences on its own cited line (a masked NaN, a per-part normaliser, 0 · (−inf))."""

CA = "verl.trainer.ppo.core_algos"
TF = "verl.utils.torch_functional"
RC = "verl.trainer.ppo.rollout_corr_helper"
TP = "verl.utils.megatron.tensor_parallel"
METRIC = "verl.utils.metric.utils"

REMEDIES = {
    f"{CA}.compute_policy_loss_geo_mean": {
        "partition dependence": (
            "`pg_loss = torch.mean(pg_losses)` averages GMPO's per-sequence losses over the micro-batch's rows, and "
            "the trainer adds the micro-batches' losses up, so the loss is the mini-batch's times the number of "
            "micro-batches",
            "divide the sum of the per-sequence losses by the mini-batch's row count (global_batch_size, as "
            "agg_loss's seq-mean modes do) instead of taking the micro-batch's mean",
            "with loss_mode=geo_mean the gradient is scaled by ppo_mini_batch_size / ppo_micro_batch_size: the "
            "effective learning rate changes with the micro-batch size")},
    f"{CA}.agg_loss": {
        "wrong value": (
            "`masked_sum(seq_losses, seq_mask) / global_batch_size` divides the seq-mean modes by "
            "ppo_mini_batch_size, which still counts the rows that sequence-level rollout rejection (rollout_rs) "
            "left without a valid token",
            "normalise by the number of rows with a valid token (seq_mask.sum(), all-reduced over DP), as agg_loss "
            "itself does when no global_batch_size is passed",
            "with loss_agg_mode=seq-mean-* and rollout_rs, the gradient shrinks by kept rows / rows: the effective "
            "learning rate falls as the rejection rate rises")},
    f"{CA}.compute_grpo_vectorized_outcome_advantage": {
        ("wrong value", "norm_adv_by_std_in_grpo"): (
            "`if norm_adv_by_std_in_grpo:` reads the function's own keyword (default True) and never "
            "config.norm_adv_by_std_in_grpo, which is how the trainer passes Dr. GRPO's setting",
            "read norm_adv_by_std_in_grpo from config when a config is given, as compute_grpo_outcome_advantage "
            "does",
            "with algorithm.adv_estimator=grpo_vectorized and norm_adv_by_std_in_grpo=False the advantages are "
            "still divided by the group's σ: Dr. GRPO's unbiased objective silently becomes GRPO's"),
        ("wrong value", "equal scores"): (
            "group_mean_std takes σ as sqrt((Σx² − (Σx)²/n) / (n − 1)) in float32: for a group of equal scores the "
            "cancellation leaves a σ of rounding size instead of 0, and (r − μ) / (σ + ε) turns μ's rounding into "
            "an advantage",
            "compute σ from the centred scores (two passes: μ, then Σ(x − μ)²) in the scores' dtype"),
        "rounding": (
            "group_mean_std casts the scores to float32 whatever their dtype, so float64 advantages carry float32 "
            "rounding",
            "compute the group statistics in the scores' dtype")},
    f"{TF}.entropy_from_logits": {
        ("wrong value", "bf16"): (
            "`entropy = logsumexp(logits) − Σ softmax · logits` reduces the bf16 logits over the vocabulary in "
            "bf16, and the two terms, each of the logits' size, cancel to an entropy with few correct digits",
            "upcast the logits to float32 and compute −Σ p · log p from the max-shifted logits",
            "the entropy bonus's gradient (and the logged actor/entropy) is wrong by up to several times its "
            "value on peaked bf16 logits"),
        "rounding": (
            "`logsumexp(logits) − Σ softmax · logits` subtracts two float32 numbers of the logits' size: a small "
            "entropy loses its digits to the cancellation",
            "compute −Σ p · (logits − logsumexp) on the max-shifted logits, which never cancels")},
    f"{TP}.vocab_parallel_entropy": {
        ("wrong value", "bf16"): (
            "_VocabParallelEntropy.forward multiplies the softmax with the unshifted bf16 logits "
            "(`mul_reduce(softmax_logits, vocab_parallel_logits)`) and adds logits_max back: the entropy is a small "
            "difference of bf16 numbers of the logits' size",
            "reduce softmax · (logits − logits_max) in float32 and leave logits_max out",
            "under Megatron with TP, the entropy bonus's gradient and the logged entropy are wrong by up to its own "
            "size on bf16 logits"),
        "rounding": (
            "_VocabParallelEntropy.forward's Σ softmax · logits uses the unshifted logits and adds logits_max back: "
            "float32 loses a small entropy's digits to that cancellation",
            "multiply the softmax with the max-shifted logits")},
    f"{TF}.calculate_sum_pi_squared_from_logits": {
        ("wrong value", "bf16"): (
            "`exp(logsumexp(2·logits) − 2·logsumexp(logits))` evaluates both log-sum-exps of bf16 logits in bf16: "
            "Σπ² is the exponential of a difference of two rounded numbers of the logits' size",
            "upcast the logits to float32 before the two logsumexps",
            "with calculate_sum_pi_squared on (the optimal-token-baseline estimator's path-variance proxy), the "
            "advantages' weights are wrong on bf16 logits"),
        "NaN|inf": (
            "`2.0 * logits` doubles fp16 logits in fp16, which overflows to inf past 32752, and the logsumexp of an "
            "inf is NaN",
            "upcast the logits to float32 before doubling them")},
    f"{CA}.compute_rloo_vectorized_outcome_advantage": {
        "wrong value": (
            "`… / (c - 1).clamp_min(1)) * (c > 1)` gives a group of one sample the advantage 0, while "
            "compute_rloo_outcome_advantage (the loop implementation) keeps its score",
            "keep the score where c == 1 (torch.where(c > 1, adv, scores)), as the loop implementation does",
            "with adv_estimator=rloo_vectorized, a prompt left with one sample (n=1, or a group the filter "
            "shrank) gets no gradient instead of its score's")},
    f"{RC}.compute_rollout_rejection_mask": {
        "wrong value": (
            "`token_k1 = -log_ratio_safe` is the log of the inverse ratio π_rollout/π_old, while the thresholds "
            "are compared as bounds of the ratio itself: asymmetric bounds (lower ≠ 1/upper) keep and reject the "
            "wrong tokens",
            "compare log_ratio (not its negative) with log(lower) and log(upper), or invert and swap the bounds",
            "with rollout_rs=token_k1 and asymmetric thresholds (e.g. \"0.5_1.5\"), tokens whose ratio lies in "
            "(1.5, 2] are kept and tokens in [0.5, 0.667) rejected: the correction removes the wrong tokens")},
    f"{RC}.compute_offpolicy_metrics": {
        "wrong value": (
            "`torch.exp(-mean_log_prob_training).mean()` (and the rollout perplexity and χ² beside it) averages "
            "the per-sequence values over every row, a row with no valid token (log-prob mean 0, perplexity 1) "
            "included",
            "average over the rows that hold a valid token (response_mask.any(-1))")},
    f"{RC}.compute_is_metrics": {
        "crash:ZeroDivisionError": (
            "the effective sample size `1.0 / masked_mean(is_weights_normalized.square(), …).item()` divides by a "
            "Python float that is 0 when every applied weight is 0 (IcePop rejecting every token, or weights that "
            "underflow), and Python raises instead of returning inf",
            "return an effective sample size of 0 when the weights' mean is 0, before the division"),
        "wrong value": (
            "`weights_for_ess / (mean_for_ess + 1e-8)`: when the weights' mean is within a few orders of 1e-8 "
            "(every ratio far below 1), the + 1e-8 dominates the mean and the normalised weights are too small",
            "divide by mean_for_ess itself where it is positive (clamp_min with a tiny of the dtype, not + 1e-8)")},
    f"{TP}.vocab_parallel_entropy_with_chunking": {
        "crash:RuntimeError": (
            "each chunk's _VocabParallelEntropy saves a view of the logits and its backward rewrites that view in "
            "place; with more than one chunk, another chunk's backward then finds a saved tensor at a newer version "
            "('modified by an inplace operation')",
            "clone the chunk before _VocabParallelEntropy.apply (logits_chunk = …[:, i : i + chunk_size].clone()), "
            "or make the backward write into a fresh tensor")},
    f"{METRIC}.Metric.append": {
        "crash:ValueError": (
            "`if not isinstance(value, NumericType): raise ValueError` accepts int, float and scalar tensors only, "
            "so a NumPy scalar (np.float32) a metric computation returns raises",
            "accept numbers.Real (NumPy scalars included) and store float(value)")},
    f"{CA}.compute_policy_loss_clip_cov": {
        "NaN|inf": (
            "Clip-Cov's `ratio = torch.exp(negative_approx_kl)` exponentiates the unclamped log-ratio: past 88.7 "
            "it is inf in float32, and −A · inf or 0 · inf is NaN",
            "clamp negative_approx_kl to ±20 before exp, as compute_policy_loss_vanilla does")},
    f"{CA}.compute_policy_loss_kl_cov": {
        "NaN|inf": (
            "KL-Cov's `ratio = torch.exp(negative_approx_kl)` has no clamp either: a log-ratio past 88.7 makes the "
            "float32 ratio inf and the loss NaN",
            "clamp negative_approx_kl to ±20 before exp, as compute_policy_loss_vanilla does")},
    "verl.utils.experimental.torch_functional.FusedLinearForPPO.forward": {
        "rounding": (
            "the fused linear forward computes the entropy as logsumexp(logits) − Σ probs · logits in float32: for "
            "a small entropy the two terms of the logits' size cancel",
            "compute −Σ probs · log_probs from the log-probs it already holds")},
    f"{TF}.masked_mean": {
        "NaN|inf": (
            "`s = masked_sum(values, mask, axis)` sums in the values' dtype: an fp16 sum overflows to inf past "
            "65504",
            "sum in float32 (values.float()) and cast the mean back"),
        "wrong value": (
            "`s / (mask.sum(axis=axis) + 1e-8)` shrinks every mean by a relative 1e-8 / count: a row's mean ratio "
            "exactly at a rejection bound falls just below it",
            "divide by mask.sum(axis=axis).clamp_min(1)")},
    f"{TF}.masked_var": {
        "wrong value": (
            "masked_var takes the mean, the centred squares and their mean in the values' dtype: in bf16 or fp16 "
            "each step keeps 8 or 11 bits, and a small variance loses all of them",
            "upcast the values to float32 before the mean")},
}
