"""The evaluation shared by the per-token loss families (policy_loss, value_loss): one engine call on the
whole mini-batch against the float64 reference, then the property's second look — the same tokens split
into micro-batches (partition_invariant), garbage at masked positions (mask_invariant) — or, for
non_destructive, one guarded forward and backward. A family supplies how to call its engine and compare
one output; the control flow, labels and undefined cases are the same for both, so they live here once.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch

from rlconform.harness.evaluation import Evaluation, call_engine
from rlconform.harness.guards import InputGuard
from rlconform.harness.opinfo import MASK_INVARIANT, NON_DESTRUCTIVE, PARTITION_INVARIANT
from rlconform.harness.tensors import to_tensor


def loss_mask(case) -> np.ndarray:
    """The case's loss mask [B, T] as bool; under mask_invariant a fully valid mask gets one masked
    position (garbage needs somewhere to go)."""
    mask = case.inputs["mask"].astype(bool)
    if case.property == MASK_INVARIANT and mask.all():
        mask = mask.copy()
        mask[-1, -1] = False
    return mask


def guarded_call(op: str, fn: Callable, arrays: dict[str, np.ndarray], grad_key: str, mask: np.ndarray,
                 dtype: str, call: Callable[[Callable, dict, torch.Tensor], Any], ev: Evaluation) -> Evaluation:
    """non_destructive: one forward (and backward when the loss has a graph) under a bitwise guard of every
    input; what changed goes to ``ev.mutations``. ``call(fn, tensors, mask_tensor)`` -> (loss, metrics)."""
    t = {k: to_tensor(v, dtype) for k, v in arrays.items()}
    t[grad_key].requires_grad_(True)
    m = torch.from_numpy(mask.copy())
    guard = InputGuard(response_mask=m, **t)
    loss, _ = call_engine(op, call, fn, t, m)
    ev.mutations += [x.describe() for x in guard.check("forward")]
    if isinstance(loss, torch.Tensor) and loss.requires_grad:
        call_engine(f"{op} backward", loss.backward)
        ev.mutations += [x.describe() for x in guard.check("backward")]
    return ev


def second_looks(case, arrays: dict[str, np.ndarray], mask: np.ndarray, ev: Evaluation,
                 run: Callable[[dict, list], Any], compare: Callable[[str, Any], tuple[list, list]]) -> None:
    """The property's alternatives: every micro-batch split of ``case.inputs["partitions"]``
    (partition_invariant) or garbage at masked positions (mask_invariant). ``run(arrays, partition)`` ->
    an engine output or None (crash recorded); ``compare(label, out)`` -> (values, gradients)."""
    if case.property == PARTITION_INVARIANT:
        for p in case.inputs["partitions"]:
            label = f"micro-batches (nnz) {[int(mask[a:c].sum()) for a, c in p]}"
            alt = run(arrays, p)
            if alt is not None:
                vals, grads = compare(f"{label}: ", alt)
                ev.alternatives.append((label, vals + grads))
    elif case.property == MASK_INVARIANT:
        garbage = float(case.inputs.get("garbage", np.nan))
        dirty = {k: np.where(mask, v, garbage) for k, v in arrays.items()}
        alt = run(dirty, [(0, mask.shape[0])])
        if alt is not None:
            vals, grads = compare(f"masked = {garbage!r}: ", alt)
            ev.alternatives.append((f"masked positions set to {garbage!r}", vals + grads))
