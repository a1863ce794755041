"""rlconform.reference — exact NumPy float64 references for the op catalog.

Flat, plain functions with the catalog's names (lax_reference style). NumPy (or torch) in, NumPy float64
arrays or Python numbers out; compensated / exactly rounded sums; no torch import. mpmath appears only
in the self-tests (tests/test_reference_mpmath.py), which check every function and gradient at 50 digits.

Modules: ``softmax_stats`` (logsumexp, token_logprobs, entropy, Σπ² and closed-form gradients),
``fused_stats`` (``token_stats``: the four of them and their gradients from one fused float64 pass),
``fused_linear`` (log-probs and entropy from hidden states and the LM-head weight, logits formed in float64,
and the gradients w.r.t. both),
``reductions`` (masked sum/count/mean/var/std/min/max, mergeable moments), ``loss_agg`` (agg_loss),
``label_smoothing`` (smoothed_token_logprobs and its gradient), ``metrics`` (token_metrics, metric_statistics, batch_metrics),
``advantage`` (optimal_token_baseline), ``advantage_estimators``
(outcome_advantage for every estimator variant, gae), ``whitening`` (masked_whiten with exact,
mergeable global statistics), ``kl`` (kl_estimator), ``importance`` (importance_ratio),
``policy_loss`` (policy_loss and its variants), ``value_loss`` (the clipped critic loss); the last four
with closed-form gradients w.r.t. the log-probs / values; ``rejection`` (rollout_rejection_mask and the
rollout-correction diagnostics); ``policy_step`` (one policy-gradient step of a tiny embedding + LM-head model:
loss, parameter gradients and metrics, composed from the above).
"""

from .advantage import optimal_token_baseline
from .advantage_estimators import ESTIMATOR_DOCS, ESTIMATORS, NAN_SCOPE, gae, outcome_advantage
from .fused_linear import fused_linear_token_stats, fused_linear_token_stats_grad
from .fused_stats import token_stats
from .importance import IMPORTANCE_LEVELS, importance_ratio, importance_ratio_grad
from .kl import KL_ESTIMATORS, kl_estimator, kl_estimator_grad
from .label_smoothing import smoothed_token_logprobs, smoothed_token_logprobs_grad
from .loss_agg import LOSS_AGG_MODES, agg_loss, agg_loss_grad
from .metrics import (
    BATCH_STATISTICS,
    CRITIC_STATISTICS,
    INTEGER_STATISTICS,
    batch_metrics,
    metric_statistics,
    token_metrics,
)
from .policy_loss import POLICY_LOSS_VARIANTS, SumCount, policy_loss, policy_loss_grad
from .policy_step import policy_step, step_log_probs
from .reductions import (
    ChanMoments,
    Moments,
    chan_merge,
    chan_moments,
    masked_count,
    masked_max,
    masked_mean,
    masked_min,
    masked_std,
    masked_sum,
    masked_var,
    merge_moments,
    moments,
    moments_to_mean_var,
)
from .rejection import (
    RS_ESTIMATORS,
    RS_LEVELS,
    rejection_statistics,
    rollout_correction_metrics,
    rollout_rejection_mask,
)
from .softmax_stats import (
    entropy,
    entropy_grad,
    logsumexp,
    logsumexp_grad,
    sum_pi_squared,
    sum_pi_squared_grad,
    token_logprobs,
    token_logprobs_grad,
)
from .value_loss import value_loss, value_loss_grad
from .whitening import WHITEN_EPS, ExactMoments, exact_moments, masked_whiten, merge_exact_moments

__all__ = [
    # softmax statistics and their gradients
    "logsumexp",
    "token_logprobs",
    "entropy",
    "sum_pi_squared",
    "logsumexp_grad",
    "token_logprobs_grad",
    "entropy_grad",
    "sum_pi_squared_grad",
    "smoothed_token_logprobs",
    "smoothed_token_logprobs_grad",
    "token_stats",
    "fused_linear_token_stats",
    "fused_linear_token_stats_grad",
    # masked reductions and moments
    "masked_sum",
    "masked_count",
    "masked_mean",
    "masked_var",
    "masked_std",
    "masked_min",
    "masked_max",
    "Moments",
    "moments",
    "merge_moments",
    "moments_to_mean_var",
    "ChanMoments",
    "chan_moments",
    "chan_merge",
    # loss aggregation, metrics, advantages
    "LOSS_AGG_MODES",
    "agg_loss",
    "agg_loss_grad",
    "token_metrics",
    "batch_metrics",
    "BATCH_STATISTICS",
    "CRITIC_STATISTICS",
    "metric_statistics",
    "INTEGER_STATISTICS",
    "optimal_token_baseline",
    # KL estimators, importance ratios, policy and value losses (with gradients)
    "KL_ESTIMATORS",
    "kl_estimator",
    "kl_estimator_grad",
    "IMPORTANCE_LEVELS",
    "importance_ratio",
    "importance_ratio_grad",
    "POLICY_LOSS_VARIANTS",
    "SumCount",
    "policy_loss",
    "policy_loss_grad",
    "policy_step",
    "step_log_probs",
    "value_loss",
    "value_loss_grad",
    # rollout-correction rejection masks and diagnostics
    "RS_LEVELS",
    "RS_ESTIMATORS",
    "rollout_rejection_mask",
    "rejection_statistics",
    "rollout_correction_metrics",
    # outcome-reward advantage estimators, GAE, whitening
    "ESTIMATORS",
    "ESTIMATOR_DOCS",
    "NAN_SCOPE",
    "outcome_advantage",
    "gae",
    "masked_whiten",
    "WHITEN_EPS",
    "ExactMoments",
    "exact_moments",
    "merge_exact_moments",
]
