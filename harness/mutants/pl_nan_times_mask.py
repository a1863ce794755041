"""NaN·0 at masked positions: the policy loss multiplies by the mask
instead of selecting with it (``(loss_mat * mask).sum()``), so NaN or ±inf in the log-probs or
advantages at padded positions turns the whole loss into NaN, although those positions are masked."""

from rlconform.harness.catalog.binding import LossVariants
from rlconform.harness.families import policy_loss as PL
from rlconform.harness.mutants._base import mutant

_faithful = PL.faithful_loss("vanilla")


def _vanilla(old_log_prob, log_prob, advantages, response_mask, info):
    loss, metrics = _faithful(old_log_prob, log_prob, advantages, response_mask, info)
    pad = (~response_mask.bool()).to(log_prob.dtype)
    leak = ((old_log_prob.detach() + advantages) * pad).sum() * 0.0  # NaN·0 = NaN, inf·0 = NaN
    return loss + leak.to(loss.dtype), metrics


_impls = {v: PL.faithful_loss(v) for v in PL.VARIANTS}
_impls["vanilla"] = _vanilla
EXPECTED = [("policy_loss", "mask_invariant")]
CAUGHT_BY = [  # findings that fail under the CI profile; tests/test_mutants.py checks only these
    "policy_loss.mask_invariant.float32.vanilla@moderate",
    "policy_loss.mask_invariant.float64.vanilla@moderate",
]
binding = mutant("pl_nan_times_mask", __doc__,
                 policy_loss=LossVariants(_impls, combine_metrics=PL.token_weighted))
