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
            "micro-batches each rank runs",
            "aggregate the per-sequence losses over the mini-batch as agg_loss's seq-mean modes do (through agg_loss "
            "with config.global_batch_info, so that the fix of agg_loss's seq-mean normaliser reaches GMPO too) "
            "instead of taking the micro-batch's mean",
            "with loss_mode=geo_mean the gradient is scaled by the micro-batches per rank (ppo_mini_batch_size · "
            "rollout.n / (DP · ppo_micro_batch_size_per_gpu), and with use_dynamic_bsz by the packing): the "
            "effective learning rate changes with the batch layout")},
    f"{CA}.agg_loss": {
        "wrong value": (
            "`masked_sum(seq_losses, seq_mask) / global_batch_size` divides the seq-mean modes by "
            "global_batch_size (ppo_mini_batch_size · rollout.n), which still counts the rows without a valid token: "
            "those sequence-level rollout rejection (rollout_rs) leaves, an aborted request's empty response",
            "normalise by the mini-batch's rows that hold a valid token, counted over the whole mini-batch and "
            "all-reduced over DP as forward_backward_batch does for batch_num_tokens (not agg_loss's own "
            "per-micro-batch count, which would be a per-part normaliser)",
            "with loss_agg_mode=seq-mean-* and rollout_rs (or any row left without a valid token), the gradient "
            "shrinks by kept rows / rows: the effective learning rate falls as the rejection rate rises")},
    f"{CA}.compute_grpo_vectorized_outcome_advantage": {
        ("wrong value", "norm_adv_by_std_in_grpo"): (
            "`if norm_adv_by_std_in_grpo:` reads the function's own keyword (default True) and never "
            "config.norm_adv_by_std_in_grpo, which is how the trainer passes Dr. GRPO's setting",
            "read config.norm_adv_by_std_in_grpo when a config is given, as compute_grpo_passk_outcome_advantage "
            "does",
            "with algorithm.adv_estimator=grpo_vectorized and norm_adv_by_std_in_grpo=False the advantages are "
            "still divided by the group's σ: Dr. GRPO's unbiased objective silently becomes GRPO's"),
        ("wrong value", "equal scores"): (
            "group_mean_std casts the scores to float32 (groupwise.py: scores.to(dtype=torch.float32)): float64 "
            "scores of one value get a μ and σ of float32 rounding size, and (r − μ) / (σ + ε) turns that rounding "
            "into an advantage of 0.01 where the exact one is 0",
            "compute the group statistics in the scores' own dtype")},
    CA: {
        "rounding": (
            "several core_algos estimators and losses run float64 inputs through float32 steps (group_mean_std's "
            "cast of the scores among them), so their float64 results carry float32 rounding",
            "keep the inputs' dtype through the group statistics and the other float32 casts")},
    TF: {
        "rounding": (
            "torch_functional's entropy, log-prob, Σπ² and masked variance helpers subtract or reduce float32 "
            "numbers of the logits' size (logsumexp − Σ p · logits and the like), losing a small result's digits",
            "reduce the max-shifted logits (−Σ p · log p, log_softmax) and upcast before the reductions")},
    TP: {
        "rounding": (
            "the vocab-parallel entropy and log-probs combine per-shard float32 sums of unshifted logits and add "
            "logits_max back, losing a small result's digits",
            "reduce the max-shifted logits on each shard")},
    f"{TF}.entropy_from_logits": {
        ("wrong value", "bf16"): (
            "`entropy = logsumexp(logits) − Σ softmax · logits` reduces the bf16 logits over the vocabulary in "
            "bf16, and the two terms, each of the logits' size, cancel to an entropy with few correct digits",
            "upcast the logits to float32 and compute −Σ p · log p from the max-shifted logits",
            "the entropy bonus's gradient (and the logged actor/entropy) is wrong by up to several times its "
            "value on peaked bf16 logits")},
    f"{TP}.vocab_parallel_entropy": {
        ("wrong value", "bf16"): (
            "_VocabParallelEntropy.forward multiplies the softmax with the unshifted bf16 logits "
            "(`mul_reduce(softmax_logits, vocab_parallel_logits)`) and adds logits_max back: the entropy is a small "
            "difference of bf16 numbers of the logits' size",
            "reduce softmax · (logits − logits_max) in float32 and leave logits_max out",
            "under Megatron (at any TP size, TP = 1 included), the entropy bonus's gradient and the logged entropy "
            "are wrong by up to its own size on bf16 logits")},
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
            "with adv_estimator=rloo_vectorized, a group of one sample gets no gradient, where the loop "
            "implementation of the same estimator keeps its score: the two implementations disagree")},
    f"{RC}.compute_rollout_rejection_mask": {
        "wrong value": (
            "`token_k1 = -log_ratio_safe` (the statistic of every k1 level) is −log r, and the lower_upper "
            "thresholds the config documents as ratio thresholds are compared with exp(−log r) = 1/r: asymmetric "
            "bounds (lower ≠ 1/upper) select the inverted interval",
            "compare log r with log(lower) and log(upper), or document that k1 thresholds bound 1/r (and invert "
            "and swap them when parsing)",
            "with a k1 rollout_rs and asymmetric thresholds (e.g. \"0.5_1.5\"), the ratios kept are [1/upper, "
            "1/lower] = [0.667, 2], not [0.5, 1.5]: tokens with r in (1.5, 2] are kept and those in [0.5, 0.667) "
            "rejected, against the documented ratio thresholds")},
    f"{RC}.compute_offpolicy_metrics": {
        "wrong value": (
            "`torch.exp(-mean_log_prob_training).mean()` (and the rollout perplexity and χ² beside it) averages "
            "the per-sequence values over every row, a row with no valid token (log-prob mean 0, perplexity 1) "
            "included",
            "average over the rows that hold a valid token (response_mask.any(-1))")},
    f"{RC}.compute_is_metrics[sequence_level]": {
        "wrong value": (
            "at the sequence level `exceeds_upper.float().mean()`, `log_ratio_for_metrics.min()` and `.max()` run "
            "over every row's log-ratio sum: a row with no valid token (an empty response: masked_sum 0, ratio 1) "
            "is in the denominator of the fractions above and below the cap and can be the minimum or the maximum",
            "take them over the rows that hold a valid token (response_mask.any(-1))")},
    f"{RC}.compute_is_metrics": {
        "crash:ZeroDivisionError": (
            "the effective sample size `1.0 / masked_mean(is_weights_normalized.square(), …).item()` divides by a "
            "Python float that is 0 when every applied weight is 0 — IcePop rejecting every valid token (or, in fp16 "
            "only, weights below its range; a TIS cap alone keeps weights ≥ e^-20) — and Python raises instead of "
            "returning inf",
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
            "`if not isinstance(value, NumericType): raise ValueError` accepts int, float, torch.Tensor and "
            "np.ndarray, and a NumPy scalar (np.float32, which is none of them) that a custom metric computation "
            "returns raises",
            "accept numbers.Real (NumPy scalars included) and store float(value)")},
    "verl.workers.utils.losses.ppo_loss": {
        "NaN|inf": (
            "ppo_loss hands the advantages to the policy loss with their masked positions as they are: −A · ratio "
            "is NaN there, and masked_sum's torch.where gives a finite loss but a NaN gradient through the product",
            "zero the advantages (and the log-ratios) at masked positions before policy_loss_fn"),
        "partition dependence": (
            "ppo_loss marks the policy loss's metrics AggregationType.MEAN, and pg_clipfrac, pg_clipfrac_lower and "
            "ppo_kl are means over one micro-batch's tokens (the comment above it: 'normalizes by "
            "local_bsz/local_tokens'): Metric.aggregate_dp then averages the micro-batches' and DP ranks' means "
            "unweighted",
            "for actor/pg_clipfrac, pg_clipfrac_lower and ppo_kl, scale each by the micro-batch's "
            "response_mask.sum() · dp_size / batch_num_tokens and aggregate them with SUM, as pg_loss is (not the "
            "other pg_metrics: bypass mode merges rollout_corr/ metrics, a min and a max among them, into them)")},
    "verl.workers.utils.losses.value_loss": {
        "partition dependence": (
            "value_loss logs vf_clipfrac, the clipped fraction of one micro-batch's tokens, as a plain float, and "
            "the micro-batches' fractions are averaged: a mean of micro-batch means (critic/vpred_mean beside it "
            "has the same form; it is not checked)",
            "log it as a Metric scaled by the micro-batch's tokens · dp_size / batch_num_tokens with "
            "AggregationType.SUM, as value_loss already does for vf_loss")},
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
    "verl.utils.experimental.torch_functional": {
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
