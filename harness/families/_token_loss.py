"""The evaluation shared by the per-token loss families (policy_loss, value_loss): one engine call on the
whole mini-batch against the float64 reference, then the property's second look — the same tokens split
into micro-batches (partition_invariant), garbage at masked positions (mask_invariant) — or, for
non_destructive, one guarded forward and backward. A family supplies how to call its engine and compare
one output; the control flow, labels and undefined cases are the same for both, so they live here once.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np
import torch

from rlconform.harness.core.evaluation import Evaluation, call_engine, shape_problem
from rlconform.harness.core.failure import problem as problem_clause
from rlconform.harness.core.guards import InputGuard
from rlconform.harness.core.opinfo import MASK_INVARIANT, PARTITION_INVARIANT
from rlconform.harness.core.tensors import as_numpy, out_dtype, to_tensor
from rlconform.reference.exact_sum import exact_sum


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
    ev.mutations += [x.clause() for x in guard.check("forward")]
    if isinstance(loss, torch.Tensor) and loss.requires_grad:
        call_engine(f"{op} backward", loss.backward)
        ev.mutations += [x.clause() for x in guard.check("backward")]
    return ev


def second_looks(case, arrays: dict[str, np.ndarray], mask: np.ndarray, ev: Evaluation,
                 run: Callable[[dict, list], Any], compare: Callable[[str, Any], tuple[list, list]]) -> None:
    """The property's alternatives: every micro-batch split of ``case.inputs["partitions"]``
    (partition_invariant) or garbage at masked positions (mask_invariant). ``run(arrays, partition)`` ->
    an engine output or None (crash recorded); ``compare(label, out)`` -> (values, gradients)."""
    if case.property == PARTITION_INVARIANT:
        for p in case.inputs["partitions"]:
            nnz = [int(mask[a:c].sum()) for a, c in p]
            label = f"micro-batches (nnz) {nnz}"
            alt = run(arrays, p)
            if alt is not None:
                vals, grads = compare(f"{label}: ", alt)
                layout = {"parts": "micro-batches", "nnz": nnz}
                ev.alternatives.append((label, [dataclasses.replace(c, layout=layout) for c in vals + grads]))
    elif case.property == MASK_INVARIANT:
        garbage = float(case.inputs.get("garbage", np.nan))
        dirty = {k: np.where(mask, v, garbage) for k, v in arrays.items()}
        alt = run(dirty, [(0, mask.shape[0])])
        if alt is not None:
            vals, grads = compare(f"masked = {garbage!r}: ", alt)
            ev.alternatives.append((f"masked positions set to {garbage!r}", vals + grads))


def drive_micro_batches(op: str, call: Callable[[dict, torch.Tensor], Any], arrays: dict[str, np.ndarray],
                        grad_key: str, combine_metrics: Callable | None, mask: np.ndarray, dtype: str,
                        partition, ev: Evaluation):
    """Call the engine once per micro-batch ``(a, b)`` of ``partition`` (rows a:b of every array, as
    ``dtype`` tensors; ``arrays[grad_key]`` requires grad) with ``call(tensors, mask_tensor)`` -> (loss,
    metrics), backpropagate each loss and fold the micro-batch metrics with the binding's
    ``combine_metrics([(metrics, nnz), ...])``.

    Returns (Σ losses as a float, gradient w.r.t. ``grad_key`` [B, T] float64 or None, metrics dict, output
    dtype), or None after a non-scalar loss. A loss without autograd graph, a backward that reaches no
    gradient and a binding without ``combine_metrics`` are problems in ``ev`` (silence is not conformance).
    """
    total, grad, parts, odt = [], np.zeros(mask.shape), [], dtype
    for a, b in partition:
        t = {k: to_tensor(v[a:b], dtype) for k, v in arrays.items()}
        t[grad_key].requires_grad_(True)
        loss, metrics = call_engine(op, call, t, torch.from_numpy(mask[a:b].copy()))
        odt = out_dtype(loss, dtype)
        if as_numpy(loss).size != 1:
            ev.problems.append(shape_problem("loss", as_numpy(loss), (), "expected a scalar") or
                               problem_clause("missing output", "loss: not a scalar"))
            return None
        total.append(float(as_numpy(loss).reshape(())))
        parts.append((dict(metrics or {}), int(mask[a:b].sum())))
        if not isinstance(loss, torch.Tensor) or not loss.requires_grad:
            ev.problems.append(problem_clause("missing gradient", f"gradient: the loss has no autograd graph (requires_grad=False): no gradient "
                               f"reaches {grad_key}"))
            grad = None
            continue
        call_engine(f"{op} backward", loss.backward)
        if t[grad_key].grad is None:
            ev.problems.append(problem_clause("missing gradient", f"gradient: backward ran but no gradient reached {grad_key}"))
            grad = None
        elif grad is not None:
            grad[a:b] = as_numpy(t[grad_key].grad)
    if combine_metrics is None:
        ev.problems.append(problem_clause("missing output", "metrics: the binding declares no combine_metrics (how "
                                                            "micro-batch metrics are folded)"))
        metrics = {}
    else:
        metrics = dict(call_engine(f"{op} combine_metrics", combine_metrics, parts))
    return exact_sum(total), grad, metrics, odt
