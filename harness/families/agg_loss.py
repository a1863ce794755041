"""Loss aggregation ``agg_loss`` over micro-batches and DP ranks: value *and* gradient.

Canonical form: an :class:`~rlconform.harness.catalog.binding.AggLoss` whose ``loss(loss_mat [b, T], mask
[b, T], mode, info: BatchInfo) -> 0-d`` is one micro-batch's contribution; contributions combine by
the binding's ``micro_combine`` over a DP rank's micro-batches and ``dp_combine`` over DP ranks. For
every partition of the global batch the combination must equal :func:`rlconform.reference.agg_loss`
of the whole batch (verl ``core_algos.agg_loss``; HF transformers PR #34191), and the gradient each
token receives must equal :func:`rlconform.reference.agg_loss_grad` (masked tokens exactly 0:
“masked tokens in the loss numerator”).

Each ``loss_agg_mode`` is a variant, so a regime is ``<mode>@imbalanced_partitions`` and a fault in one
mode is its own finding. Gradients: each micro-batch's contribution is differentiated w.r.t. its rows;
a contribution's weight in the combined loss is ``rule(e_m) − rule(0)`` (combination rules are linear
in the contributions: sums, means, means over non-NaN contributions).
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import torch
from hypothesis import strategies as st

import rlconform.reference as R
from rlconform.harness.core import faithful as F
from rlconform.harness.core import strategies as S
from rlconform.harness.core.contracts import AggLoss, BatchInfo, VariantNotProvided
from rlconform.harness.core.evaluation import Compared, Evaluation, call_engine
from rlconform.harness.core.failure import problem as problem_clause
from rlconform.harness.core.guards import InputGuard
from rlconform.harness.core.opinfo import (
    MASK_INVARIANT,
    MATCHES_REFERENCE,
    NON_DESTRUCTIVE,
    PARTITION_INVARIANT,
    OpInfo,
    reference_function,
    split_regime,
    variant_regime,
)
from rlconform.harness.core.tensors import as_numpy, to_tensor
from rlconform.harness.families import OpFamily
from rlconform.reference.exact_sum import exact_sum

PARTITION_DTYPES = ("float32", "float64", "bfloat16")
GARBAGE = (np.nan, np.inf, -np.inf, 1e30)

OPS = (
    OpInfo("agg_loss", "agg_loss", None,
           (MATCHES_REFERENCE, PARTITION_INVARIANT, NON_DESTRUCTIVE, MASK_INVARIANT),
           {variant_regime(mode, "imbalanced_partitions"): PARTITION_DTYPES for mode in R.LOSS_AGG_MODES},
           reference_function("agg_loss"), reference_function("agg_loss_grad"), differentiable=True,
           source="value and per-token gradient over the global mini-batch (verl core_algos.agg_loss; "
                  "HF transformers PR #34191)",
           family="agg_loss", variants=tuple(R.LOSS_AGG_MODES)),
)


@st.composite
def inputs(draw, dtype: str, mode: str):
    """``{"loss_mat", "mask", "mode", "loss_scale_factor", "partitions", "garbage"}``: one mini-batch of
    imbalanced rows (0 to 10⁴ tokens, fully masked rows) and 3 partitions into DP ranks × micro-batches."""
    data = draw(S.row_lengths_data(dtype))
    b, t = data["mask"].shape
    data["mode"] = mode
    data["loss_scale_factor"] = draw(st.sampled_from([None, float(t), 4096.0]))
    data["loss_mat"] = data.pop("values")
    data["partitions"] = draw(S.nested_partitions(b, mini_batches=False))
    data["garbage"] = draw(st.sampled_from(GARBAGE))
    return data


def strategy(op: OpInfo, dtype: str, regime: str):
    mode, _ = split_regime(regime)
    return inputs(dtype, mode)


def equalize_micro_batches(ranks: list) -> list:
    """Regroup each DP rank's micro-batches (contiguous row ranges) so that every rank has the same
    number, the smallest count among them: for engines that require equal counts (verl's
    ``same_micro_num_in_dp``). The rows and their order are unchanged."""
    k = min(len(r) for r in ranks)
    out = []
    for rank in ranks:
        n = len(rank)
        bounds = [round(i * n / k) for i in range(k + 1)]
        out.append([(rank[bounds[i]][0], rank[bounds[i + 1] - 1][1]) for i in range(k)])
    return out


def partition_rows(partition) -> list:
    """Flatten a nested partition to its list of [start, stop) row ranges, in order."""
    if isinstance(partition, (list, tuple)) and len(partition) == 2 and all(isinstance(x, int) for x in partition):
        return [tuple(partition)]
    out = []
    for p in partition:
        out.extend(partition_rows(p))
    return out


def describe_partition(partition, mask: np.ndarray) -> str:
    """Token counts (nnz) per shard, nested like the partition, e.g. ``[[1, 100]]``."""
    if isinstance(partition, (list, tuple)) and len(partition) == 2 and all(isinstance(x, int) for x in partition):
        return str(int(mask[partition[0]:partition[1]].sum()))
    return "[" + ", ".join(describe_partition(p, mask) for p in partition) + "]"


def _backward64(v: torch.Tensor) -> None:
    """Backpropagate a micro-batch's loss (upcast to float64) through the engine's graph: one engine call,
    made where the graph is (the engine's worker, under a referee)."""
    v.to(torch.float64).backward()


def _combine(rule, values: list) -> float:
    """:meth:`AggLoss.combine`; a callable rule is the engine's code, hence an engine call."""
    if callable(rule):
        return call_engine("agg_loss combine", AggLoss.combine, rule, list(values))
    return AggLoss.combine(rule, values)


def _weights(rule, values: list) -> list:
    """d rule(values) / d values_m for a linear combination rule, exactly: rule(e_m) − rule(0), with the
    NaN contributions (e.g. an empty micro-batch's 0/0) kept NaN so a rule that skips them skips them."""
    def at(basis):
        return _combine(rule, basis)

    zero = [math.nan if math.isnan(v) else 0.0 for v in values]
    base = at(zero) if values else 0.0
    out = []
    for i, v in enumerate(values):
        if math.isnan(v):
            out.append(0.0)
            continue
        e = list(zero)
        e[i] = 1.0
        out.append(at(e) - base)
    return out


def _batch_info(mask_np: np.ndarray, partition, lsf) -> dict:
    return dict(dp_size=len(partition), global_nnz=int(mask_np.sum()), global_batch_size=int(mask_np.shape[0]),
                global_nonempty_seqs=int((mask_np.sum(-1) > 0).sum()), loss_scale_factor=lsf)


def run_agg_loss(agg: AggLoss, loss: torch.Tensor, mask: torch.Tensor, mode: str, partition, lsf, *,
                 grad: bool = False, problems: list | None = None):
    """Drive ``agg`` over ``partition`` (DP ranks of micro-batch row ranges). Returns (combined value,
    gradient [B, T] float64 or None). With ``grad``, a contribution without an autograd graph, or whose
    gradient does not reach its rows, is added to ``problems``."""
    mask_np = mask.numpy().astype(bool)
    common = _batch_info(mask_np, partition, lsf)
    if agg.equal_micro_batches_per_rank:
        partition = equalize_micro_batches(partition)
    per_rank, grads = [], []
    for rank in partition:
        info = BatchInfo(num_micro_batches=len(rank), **common)
        contribs, rank_grads = [], []
        for (a, b) in rank:
            rows = loss[a:b].detach().clone().requires_grad_(grad)
            v = call_engine("agg_loss", agg.loss, rows, mask[a:b], mode, info)
            contribs.append(float(as_numpy(v)))
            g = None
            if grad:
                if not isinstance(v, torch.Tensor) or not v.requires_grad:
                    problems.append(problem_clause("missing gradient", "gradient: a micro-batch's loss has no autograd graph (requires_grad=False): "
                                    "no gradient reaches the per-token loss"))
                else:
                    call_engine("agg_loss backward", _backward64, v)
                    if rows.grad is None:
                        problems.append(problem_clause("missing gradient", "gradient: backward ran but no gradient reached the per-token loss"))
                    else:
                        g = rows.grad.detach().to(torch.float64).numpy()
            rank_grads.append(g)
        per_rank.append(_combine(agg.micro_combine, contribs))
        grads.append((_weights(agg.micro_combine, contribs), rank_grads))
    total = _combine(agg.dp_combine, per_rank)
    if not grad or any(g is None for _, gs in grads for g in gs):
        return total, None
    out = np.zeros(tuple(loss.shape))
    dp_w = _weights(agg.dp_combine, per_rank)
    for r, (rank, (micro_w, rank_grads)) in enumerate(zip(partition, grads)):
        for (a, b), w, g in zip(rank, micro_w, rank_grads):
            out[a:b] += dp_w[r] * w * g
    return total, out


def faithful(loss: torch.Tensor, mask: torch.Tensor, mode: str, partition, lsf):
    """The fp32 path: each micro-batch's contribution normalised by global counts
    (:func:`rlconform.harness.core.faithful.agg_loss_micro`), rounded to the loss dtype, summed over
    micro-batches and averaged over DP ranks in float64; and its gradient rounded to the loss dtype."""
    mask_np = mask.numpy().astype(bool)
    common = _batch_info(mask_np, partition, lsf)
    ranks = []
    grad = np.zeros(tuple(loss.shape))
    for rank in partition:
        info = BatchInfo(num_micro_batches=len(rank), **common)
        parts = []
        for a, b in rank:
            rows = loss[a:b].detach().clone().requires_grad_(True)
            v = F.agg_loss_micro(rows, mask[a:b], mode, info)
            parts.append(float(v.detach().to(loss.dtype)))
            v.backward()
            grad[a:b] = rows.grad.to(loss.dtype).double().numpy() / len(partition)
        ranks.append(exact_sum(parts))
    return exact_sum(ranks) / len(ranks), grad


def _evaluate_partition(agg, loss64, mask_np, dtype, mode, partition, lsf, ref, ref_grad, ev, label):
    loss, mask = to_tensor(loss64, dtype), torch.from_numpy(mask_np)
    value, grad = run_agg_loss(agg, loss, mask, mode, partition, lsf, grad=True, problems=ev.problems)
    clean = to_tensor(np.where(mask_np, loss64, 0.0), dtype)
    f_value, f_grad = faithful(clean, mask, mode, partition, lsf)
    out = [Compared(f"{label} value", np.float64(value), np.float64(ref), np.float64(f_value), dtype, "pipeline")]
    if grad is not None:
        out.append(Compared(f"{label} gradient", grad, ref_grad, f_grad, dtype, "pipeline"))
    return out


def evaluate(binding, case) -> Evaluation:
    agg = binding.resolve("agg_loss")
    mode = case.inputs["mode"]
    if mode not in agg.modes:
        raise VariantNotProvided("agg_loss", mode, binding.name)
    loss64, mask_np = case.inputs["loss_mat"], case.inputs["mask"].astype(bool)
    if case.property == MASK_INVARIANT and mask_np.all():  # garbage needs a masked position
        mask_np = mask_np.copy()
        mask_np[-1, -1] = False
    lsf = case.inputs.get("loss_scale_factor")
    partitions = case.inputs["partitions"]
    ev = Evaluation()
    if case.property == NON_DESTRUCTIVE:
        loss, mask = to_tensor(loss64, case.dtype), torch.from_numpy(mask_np)
        guard = InputGuard(loss_mat=loss, mask=mask)
        run_agg_loss(agg, loss, mask, mode, partitions[0], lsf)
        ev.mutations += [m.clause() for m in guard.check("forward")]
        return ev
    ref = np.float64(R.agg_loss(loss64, mask_np, mode, loss_scale_factor=lsf))
    if np.isnan(ref):
        ev.undefined = f"{mode} of a mini-batch with no unmasked token is undefined"
        return ev
    ref_grad = R.agg_loss_grad(loss64, mask_np, mode, loss_scale_factor=lsf)
    label = lambda p: f"mode {mode}, shards (nnz) {describe_partition(p, mask_np)}"  # noqa: E731
    first = _evaluate_partition(agg, loss64, mask_np, case.dtype, mode, partitions[0], lsf, ref, ref_grad, ev,
                                label(partitions[0]))
    ev.values, ev.gradients = first[:1], first[1:]
    ev.base_label = label(partitions[0])
    if case.property == PARTITION_INVARIANT:
        for p in partitions[1:]:
            layout = {"parts": "shards", "nnz": json.loads(describe_partition(p, mask_np))}
            ev.alternatives.append((label(p), [dataclasses.replace(c, layout=layout) for c in _evaluate_partition(
                agg, loss64, mask_np, case.dtype, mode, p, lsf, ref, ref_grad, ev, label(p))]))
    elif case.property == MASK_INVARIANT:
        garbage = float(case.inputs.get("garbage", np.nan))
        dirty = np.where(mask_np, loss64, garbage)
        ev.alternatives.append((f"masked positions set to {garbage!r}", _evaluate_partition(
            agg, dirty, mask_np, case.dtype, mode, partitions[0], lsf, ref, ref_grad, ev,
            f"masked = {garbage!r}")))
    return ev


FAMILY = OpFamily("agg_loss", OPS, strategy, evaluate, order=30,
                  doc="loss aggregation over micro-batches and DP ranks, every loss_agg_mode a variant")
