"""What the log-ratio families (importance_ratio, rejection_mask) share in ``evaluate``: the case's
engine function for its variant, its mask, the undefined case (no valid token), the guarded call of
``non_destructive`` and the garbage of ``mask_invariant``. The comparisons differ (a ratio and its gradient,
a kept mask and its metrics) and stay with each family.
"""

from __future__ import annotations

import numpy as np
import torch

from rlconform.harness.core.evaluation import Evaluation, call_engine
from rlconform.harness.core.guards import InputGuard
from rlconform.harness.core.opinfo import MASK_INVARIANT
from rlconform.harness.core.tensors import to_tensor


def prepare(binding, case, op: str, nothing_valid: str):
    """``(fn, mask, log_prob, old_log_prob, ev)`` of a log-ratio case: the binding's function for the case's
    variant, the mask as bool (under ``mask_invariant`` a fully valid one gets one masked position: garbage
    needs somewhere to go), the float64 inputs, and an :class:`Evaluation` that is already ``undefined``
    (``nothing_valid`` says why) when no token is valid."""
    fn = binding.resolve(op).get(op, case.inputs["variant"], binding.name)
    mask = case.inputs["mask"].astype(bool)
    if case.property == MASK_INVARIANT and mask.all():
        mask = mask.copy()
        mask[-1, -1] = False
    ev = Evaluation()
    if not mask.any():
        ev.undefined = nothing_valid
    return fn, mask, case.inputs["log_prob"], case.inputs["old_log_prob"], ev


def guarded_call(op: str, fn, lp64, old64, mask, dtype: str, ev: Evaluation, differentiable: bool) -> Evaluation:
    """``non_destructive``: one engine call on fresh inputs, guarded bitwise after the forward and, for a
    ``differentiable`` op whose output has a graph, after the backward of the mask."""
    lp, old = to_tensor(lp64, dtype), to_tensor(old64, dtype)
    if differentiable:
        lp.requires_grad_(True)
    m = torch.from_numpy(mask.copy())
    guard = InputGuard(log_prob=lp, old_log_prob=old, mask=m)
    out = call_engine(op, fn, lp, old, m)
    ev.mutations += [x.clause() for x in guard.check("forward")]
    if differentiable and isinstance(out, torch.Tensor) and out.requires_grad:
        call_engine(f"{op} backward", out.backward, m.to(out.dtype))
        ev.mutations += [x.clause() for x in guard.check("backward")]
    return ev


def with_garbage(case, mask, lp64, old64):
    """``mask_invariant``: ``(label prefix, alternative's label, log_prob, old_log_prob)`` with the case's
    garbage at the masked positions."""
    garbage = float(case.inputs.get("garbage", np.nan))
    return (f"masked = {garbage!r}: ", f"masked positions set to {garbage!r}",
            np.where(mask, lp64, garbage), np.where(mask, old64, garbage))
