"""Why SkyRL 0.4.0's defects happen and how to fix them (``Binding.remedies``,
:mod:`rlconform.harness.report.remedies`): engine function -> {kinds of failure, or (kinds, trigger): (cause, fix[,
impact on training])}. A row these do not cover gets its idiom's sentences on its own cited line."""

WORKER = "skyrl.backends.skyrl_train.workers.worker"
WORKER_UTILS = "skyrl.backends.skyrl_train.workers.worker_utils"
PPO = "skyrl.backends.skyrl_train.utils.ppo_utils"
OPC = "skyrl.backends.skyrl_train.utils.off_policy_correction_utils"
TORCH_UTILS = "skyrl.backends.skyrl_train.utils.torch_utils"

REMEDIES = {
    f"{WORKER}.RefWorkerBase._forward_micro_batch": {
        "wrong value": (
            "`temperature=self.cfg.algorithm.temperature if sample_support_replay else 1.0` computes the reference "
            "model's log-probs at temperature 1 while the policy's use algorithm.temperature, so the KL loss "
            "compares two differently tempered policies",
            "pass self.cfg.algorithm.temperature unconditionally, as SkyRL's Megatron reference worker does",
            "on the FSDP backend with a sampling temperature ≠ 1 and use_kl_loss (the default) or use_kl_in_reward, "
            "the KL is nonzero even when the policy equals the reference, and it pulls the tempered policy toward "
            "the reference at temperature 1")},
    f"{WORKER}.PolicyWorkerBase._forward_backward_micro": {
        "wrong value": (
            "`entropy = masked_mean(entropy_BS, loss_mask)` (and the KL term) read loss_mask from before the "
            "off-policy correction, which rewrites its own copy inside the policy loss: a row the correction masks "
            "still gets the entropy bonus's and the KL's gradient",
            "apply the correction's mask to loss_mask before the policy loss (or have the policy loss return it) "
            "and use that mask for the entropy and KL terms",
            "with an off-policy correction mask (sequence_mask_metric, outlier or token masks) and use_entropy_loss "
            "or use_kl_loss, rejected rows still push the policy's entropy and KL"),
        "partition dependence": (
            "`entropy_loss_term = entropy * self.cfg.algorithm.entropy_loss_coef` is a token mean over one "
            "micro-batch, weighted by the micro-batch's share of rows (len(microbatch) / len(data)): a token's "
            "weight depends on how many tokens its micro-batch holds",
            "weight each micro-batch's entropy by its share of the mini-batch's tokens (or sum entropy · mask and "
            "divide by the mini-batch's token count once)",
            "with use_entropy_loss=true the entropy bonus's gradient changes with micro_train_batch_size_per_gpu "
            "whenever rows differ in length (with it off, only the logged policy_entropy does)")},
    f"{PPO}.compute_policy_loss_kl_cov": {
        "wrong value": (
            "`pg_losses_kl = -advantages * ratio + ppo_kl_coef * abs_kl` adds the KL penalty unscaled to "
            "advantages the trainer pre-scaled by the loss reduction (A / token count): the penalty weighs as many "
            "times more as the mini-batch has tokens",
            "scale ppo_kl_coef · abs_kl by the same loss-reduction factor as the advantages",
            "with policy_loss_type=kl_cov the KL penalty on the selected tokens outweighs the policy gradient more "
            "the larger the mini-batch")},
    f"{PPO}.compute_policy_loss_clip_cov": {
        "wrong value": (
            "`cov_all = (advantages - masked_mean(advantages, loss_mask)) * (…)` takes the covariance of the "
            "pre-scaled advantages (A / token count), so the bounds clip_cov_lb < cov < clip_cov_ub (1, 5), set "
            "for unscaled advantages, select no token",
            "compute the covariance from the unscaled advantages, or scale the bounds by the same factor",
            "with policy_loss_type=clip_cov no token is ever detached: Clip-Cov trains as plain PPO"),
        "NaN|inf": (
            "Clip-Cov's `ratio = torch.exp(negative_approx_kl)` exponentiates the log-ratio without a clamp: past "
            "88.7 the float32 ratio is inf and −A · inf is NaN",
            "clamp negative_approx_kl to ±20 before exp, as ppo_policy_loss does")},
    f"{OPC}.compute_tis_ratio": {
        "masked-value|NaN|inf": (
            "sequence TIS sums the row's log-ratios as `(token_tis_log_ratio * loss_mask).sum(dim=-1)`: a NaN "
            "rollout log-prob at a masked position gives NaN · 0 = NaN, so the row's weight is NaN and so is the "
            "loss at every valid token of the row",
            "zero the masked log-ratios before the row sum (torch.where(loss_mask.bool(), token_tis_log_ratio, 0))",
            "with tis_ratio_type=sequence, one non-finite rollout log-prob at a loss-masked position makes the step's "
            "loss and gradient NaN: SkyRL pads with zeros, so it takes a loss-masked generated token whose log-prob "
            "the inference engine returned as NaN or −inf (an overlong-filtered response keeps its log-probs)"),
        "wrong value": (
            "`num_sequences = seq_tis_ratio.shape[0]` counts every row in tis_seq_clip_high_ratio, rows with no "
            "valid token included",
            "count the rows that hold a valid token (loss_mask.any(-1).sum())")},
    f"{OPC}.compute_off_policy_correction[is_ratio_min]": {
        "wrong value": (
            "`metrics[\"is_ratio_min\"] = (is_ratio * loss_mask).min()` takes the minimum over every position, the "
            "masked ones' zeros included, so the logged minimum is 0 on any batch with padding or an observation "
            "token (is_ratio_std beside it reads the same zeros)",
            "take the minimum over the valid tokens with torch.where(loss_mask.bool(), is_ratio, inf).min() (safe "
            "on a micro-batch with no valid token), and the std over the valid tokens too")},
    f"{OPC}.compute_off_policy_correction": {
        "masked-value|NaN|inf": (
            "compute_sequence_mask sums the row's log-ratios times the mask, so a NaN at a masked position makes "
            "the row's mean NaN, and `geo_sequence_mask = ~seq_over_high & ~seq_under_low` keeps it (NaN is neither "
            "over nor under a bound)",
            "zero the masked log-ratios before the row sum (torch.where(loss_mask.bool(), log_ratio, 0))",
            "with sequence_mask_metric on, a row whose padding holds NaN log-probs is never masked, whatever its "
            "ratio"),
        r"wrong value \(only": (
            "compute_token_mask decides on `safe_exp_delta(...)`, which exponentiates the log-ratio in float32 "
            "whatever its dtype: a float64 ratio within float32's rounding of a threshold falls on the wrong side",
            "promote, never demote: exponentiate in float32 or the log-probs' dtype, whichever is wider"),
        "wrong value": (
            "`num_sequences = float(geo_mean_ratio.shape[0])` counts every row in the masked-sequence fractions, "
            "rows with no valid token included",
            "count the rows that hold a valid token (loss_mask.any(-1).sum())")},
    f"{PPO}.ppo_critic_loss": {
        "wrong value": (
            "`loss = masked_mean(loss, loss_mask, dim=-1).mean()` averages the per-row value losses over every row, "
            "a row with no valid token (mean 0) included",
            "average over the rows that hold a valid token, or normalise by the token count",
            "the value loss and its gradient shrink by rows with a valid token / rows (multi-turn rows of "
            "observation tokens only, rows the filters emptied)")},
    f"{PPO}.apply_loss_reduction_to_advantages_minibatch": {
        "wrong value": (
            "`advantages / (batch_size * loss_mask.sum(dim=-1).clamp(min=1))` divides sequence_mean by batch_size, "
            "which counts the rows with no valid token",
            "divide by the number of rows that hold a valid token",
            "with loss_reduction=sequence_mean, every row left without a valid token (an observation-only "
            "multi-turn row, a masked row) shrinks the other rows' gradient")},
    f"{WORKER_UTILS}.reduce_metrics": {
        "partition dependence": (
            "`reduced_metrics[k] = sum(v) / len(v)` averages the per-micro-batch means equally, whatever each "
            "micro-batch's token count",
            "log each micro-batch's sum and token count and divide once over the mini-batch"),
        "missing output": (
            "`if not all(isinstance(x, (int, float)) for x in v): print(…); continue` drops a metric whose values "
            "are NumPy scalars (np.float32) instead of logging it",
            "accept numbers.Real (NumPy scalars included) and log float(x)")},
    f"{PPO}.ppo_policy_loss": {
        "wrong value": (
            "`clip_ratio = masked_mean((-surr2 > -surr1).float(), loss_mask)` is taken before "
            "apply_off_policy_correction rewrites loss_mask: the logged clip fraction counts the tokens of rows the "
            "correction masks",
            "compute clip_ratio after apply_off_policy_correction, over the mask it returns")},
    f"{WORKER_UTILS}.compute_minibatch_rollout_logprob_diff_metrics": {
        "wrong value": (
            "`abs_diff * loss_mask` zeroes the masked positions, and `masked_abs_diff.min()` then takes one of "
            "those zeros as the minimum log-prob difference",
            "take torch.where(loss_mask.bool(), abs_diff, inf).min() (safe on a micro-batch with no valid token)")},
    f"{WORKER_UTILS}.all_reduce_metrics": {
        "partition dependence": (
            "`strategy.all_reduce(mean_metrics, op=\"mean\")` averages the DP ranks' means equally, a rank with "
            "no valid token (mean 0) included",
            "all-reduce each metric's sum and token count and divide once")},
    f"{PPO}.importance_sampling_loss": {
        "NaN|inf": (
            "importance_sampling_loss's `mean_ratio = (prob_ratio * loss_mask).sum() / loss_mask.sum()` is 0 / 0 on "
            "a micro-batch with no valid token; its `(elementwise_loss * loss_mask).sum()` keeps a masked NaN, and "
            "its exp of the log-ratio has no clamp",
            "divide by loss_mask.sum().clamp(min=1), select the valid positions with torch.where before the sum, and "
            "clamp the log-ratio to ±20 before exp")},
    f"{PPO}.reduce_loss": {
        "NaN|inf": (
            "`(loss * loss_mask).sum()` keeps a masked position's NaN (NaN · 0 = NaN): a NaN advantage or rollout "
            "log-prob at padding reaches the loss, and through the product the gradient",
            "zero the masked advantages and log-ratios before the policy loss: a torch.where in reduce_loss alone "
            "makes the loss finite but leaves the gradient at the masked position NaN")},
    f"{PPO}.masked_var": {
        "NaN|inf": (
            "`centered_values**2` squares every position in the values' dtype, masked ones included: an fp16 "
            "square past 65504 is inf, and masked_mean's inf · 0 is NaN",
            "zero the masked positions before squaring (torch.where(mask.bool(), centered_values, 0)) and square "
            "in float32"),
        "wrong value": (
            "SkyRL's masked_var keeps bf16 or fp16 values in their dtype through the mean, the centred squares and "
            "their mean: a small variance loses all of its 8 or 11 bits",
            "upcast the values to float32 before the mean")},
    PPO: {
        "rounding": (
            "several ppo_utils functions mix float32 constants into float64 inputs — a group of one sample's "
            "`id2std = torch.tensor(1.0)` (float32) before the + epsilon, masked_var's Bessel factor "
            "mask_sum / (mask_sum − 1) in the mask's float32 or bool dtype — so float64 results carry float32 "
            "rounding",
            "build those constants and the Bessel factor in the values' dtype")},
    TORCH_UTILS: {
        "rounding": (
            "logprobs_from_logits's float32 path takes `logits_labels - logsumexp_values`: at large logits (1e4) "
            "the two terms of the logits' size cancel to a log-prob with few correct digits",
            "take the log-probs from log_softmax (or subtract the row max before both terms)")},
    OPC: {
        "rounding": (
            "`safe_exp_delta` casts the TIS log-ratio to float32 before exp (`delta.to(torch.float32)`), so "
            "float64 importance weights carry float32 rounding",
            "promote rather than cast: exponentiate in float32 or the log-ratio's dtype, whichever is wider")},
}
