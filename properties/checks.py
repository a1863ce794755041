"""The generic property checks, on one concrete :class:`~rlconform.properties.case.Case`.

``run_check(binding, case)`` dispatches on the op's kind and the property, calls the engine through
its binding, compares with the float64 reference under the tolerance policy and returns a
:class:`Outcome`. It raises :class:`EngineCrash` when the engine itself raises. The hypothesis tests
in this package draw cases and call it; ``rlconform replay`` calls it on a saved case.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import traceback
from typing import Any, Callable

import numpy as np
import torch

import rlconform.reference as R
from rlconform.harness import faithful as F
from rlconform.harness import torch_state  # [robust] see _call
from rlconform.harness.binding import BatchInfo, Binding
from rlconform.harness.catalog import (
    DISTRIBUTED_KINDS, FINITE, MATCHES_REFERENCE, METRIC_INTEGRITY, NON_DESTRUCTIVE, PARTITION_INVARIANT, get_op,
)
from rlconform.harness.guards import InputGuard, produce
from rlconform.harness.tolerance import MAX, Comparison, compare
from rlconform.properties.case import Case

TORCH_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
                "float64": torch.float64}


class PropertyFailure(AssertionError):
    """A property does not hold for the engine (a discrepancy)."""


class EngineCrash(Exception):
    """The engine raised while computing a case. ``engine_traceback`` holds its traceback text."""

    def __init__(self, where: str, exc: BaseException):
        self.engine_traceback = "".join(traceback.format_exception(exc))
        super().__init__(f"engine raised in {where}: {type(exc).__name__}: {exc}")


@dataclasses.dataclass
class Outcome:
    """Result of one check: ``ok``; ``message`` (what failed, uniform wording); error measures of the
    worst compared element (``max_abs_err``, ``max_rel_err``, ``tolerance``) and ``ratio`` (error over
    tolerance; > 1 is a discrepancy; the quantity hypothesis ``target()`` climbs)."""

    ok: bool
    message: str = ""
    max_abs_err: float = 0.0
    max_rel_err: float = 0.0
    tolerance: float = 0.0
    ratio: float = 0.0

    def absorb(self, label: str, c: Comparison) -> None:
        if c.max_abs_err >= self.max_abs_err or not c.ok:
            self.max_abs_err = max(self.max_abs_err, c.max_abs_err)
            self.max_rel_err = max(self.max_rel_err, c.max_rel_err)
        if c.worst_ratio >= self.ratio:
            self.ratio, self.tolerance = c.worst_ratio, c.tolerance
        if not c.ok:
            self.ok = False
            self.message += (("\n" if self.message else "") + f"{label}: {c.describe()}")

    def fail(self, message: str) -> None:
        self.ok = False
        self.ratio = max(self.ratio, math.inf)
        self.message += ("\n" if self.message else "") + message


def _call(where: str, fn: Callable, *args, **kwargs):
    try:
        with torch_state.guard():  # [robust] restores torch's global state; raises TorchStateChanged (issue 14)
            return fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - any engine error is a crash finding
        raise EngineCrash(where, exc) from exc


def to_tensor(a: np.ndarray, dtype: str) -> torch.Tensor:
    """Exact conversion of a float64 array whose values are representable in ``dtype``."""
    return torch.from_numpy(np.array(a, dtype=np.float64)).to(TORCH_DTYPES[dtype])


def as_numpy(x: Any) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().to(torch.float64).cpu().numpy()
    return np.asarray(x, dtype=np.float64)


def _out_dtype(x: Any, fallback: str) -> str:
    if isinstance(x, torch.Tensor) and x.is_floating_point():
        return str(x.dtype).replace("torch.", "")
    return fallback


def representable(ref, dtype: str) -> np.ndarray:
    """Where the float64 reference is finite and within the finite range of ``dtype``."""
    r = np.asarray(ref, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        return np.isfinite(r) & (np.abs(r) <= MAX[dtype])


def _round_to(x: torch.Tensor, dtype: str) -> torch.Tensor:
    return x.detach().to(TORCH_DTYPES[dtype])


# ----------------------------------------------------------------------------------------------
# token statistics: logsumexp, token_logprobs, entropy, sum_pi_squared


def _token_args(case: Case, logits: torch.Tensor) -> tuple:
    if case.op == "token_logprobs":
        return (logits, torch.from_numpy(case.inputs["labels"]).long())
    return (logits,)


def _ref_token(case: Case, logits64: np.ndarray):
    ref = get_op(case.op).reference
    if case.op == "token_logprobs":
        return ref(logits64, case.inputs["labels"])
    return ref(logits64)


def _ref_token_grad(case: Case, logits64: np.ndarray, grad_out: np.ndarray):
    ref = get_op(case.op).reference_grad
    if case.op == "token_logprobs":
        return ref(logits64, case.inputs["labels"], grad_output=grad_out)
    return ref(logits64, grad_output=grad_out)


def _faithful_token(case: Case, x: torch.Tensor, grad_out: torch.Tensor):
    leaf = x.detach().clone().requires_grad_(True)
    out = getattr(F, case.op)(*_token_args(case, leaf))
    (out.to(torch.float64) * grad_out).sum().backward()
    return out.detach(), leaf.grad.detach()


def check_token_stat(binding: Binding, case: Case) -> Outcome:
    fn = binding.resolve(case.op)
    logits64 = case.inputs["logits"]
    x = to_tensor(logits64, case.dtype)
    grad_out64 = case.inputs.get("grad_output")
    if grad_out64 is None:
        grad_out64 = np.ones(logits64.shape[:-1])
    grad_out = torch.from_numpy(grad_out64)
    outcome = Outcome(True)
    prop = case.property

    if prop == NON_DESTRUCTIVE:
        leaf = x.clone().requires_grad_(True)
        logits = produce(leaf)
        args = _token_args(case, logits)
        guard = InputGuard(logits=logits, **({"labels": args[1]} if len(args) > 1 else {}))
        out = _call(f"{case.op} forward", fn, *args)
        for m in guard.check("forward"):
            outcome.fail(m.describe())
        if isinstance(out, torch.Tensor) and out.requires_grad:
            try:
                (out.to(torch.float64) * grad_out).sum().backward()
            except RuntimeError as exc:
                if "inplace" in str(exc) or "modified" in str(exc):
                    outcome.fail(f"a producer that saved the logits for backward could not backprop: {exc}")
                else:
                    raise EngineCrash(f"{case.op} backward", exc) from exc
            for m in guard.check("backward"):
                outcome.fail(m.describe())
        return outcome

    ref = _ref_token(case, logits64)
    leaf = x.clone().requires_grad_(True)
    out = _call(f"{case.op} forward", fn, *_token_args(case, leaf))
    if tuple(np.shape(as_numpy(out))) != tuple(np.shape(ref)):
        outcome.fail(f"value: the engine returned shape {tuple(np.shape(as_numpy(out)))}, expected "
                     f"{tuple(np.shape(ref))} (logits {tuple(logits64.shape)} -> one value per token)")
        return outcome
    grad = None
    if isinstance(out, torch.Tensor) and out.requires_grad and get_op(case.op).differentiable \
            and case.op not in binding.forward_only:
        try:
            (out.to(torch.float64) * grad_out).sum().backward()
        except Exception as exc:  # noqa: BLE001
            raise EngineCrash(f"{case.op} backward", exc) from exc
        grad = leaf.grad
    faithful_out, faithful_grad = _faithful_token(case, x, grad_out)
    out_np = as_numpy(out).reshape(np.shape(ref))
    out_dtype = _out_dtype(out, case.dtype)
    ref_grad = _ref_token_grad(case, logits64, grad_out64) if grad is not None else None

    if prop == MATCHES_REFERENCE:
        outcome.absorb("value", compare(out_np, ref, as_numpy(_round_to(faithful_out, out_dtype)),
                                        dtype=out_dtype, kind="token_stat"))
        if grad is not None:
            gdt = _out_dtype(grad, case.dtype)
            outcome.absorb("gradient", compare(as_numpy(grad), ref_grad, as_numpy(_round_to(faithful_grad, gdt)),
                                               dtype=gdt, kind="token_stat"))
        return outcome

    if prop == FINITE:
        fin = representable(ref, out_dtype)
        bad = fin & ~np.isfinite(out_np)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            outcome.fail(f"value: engine {float(out_np.reshape(-1)[i])!r} where the reference is finite "
                         f"({float(np.asarray(ref).reshape(-1)[i])!r}) at flat index {i}")
        if grad is not None:
            g = as_numpy(grad)
            gbad = representable(ref_grad, _out_dtype(grad, case.dtype)) & ~np.isfinite(g)
            if gbad.any():
                i = int(np.flatnonzero(gbad)[0])
                outcome.fail(f"gradient: engine {float(g.reshape(-1)[i])!r} where the reference gradient is finite "
                             f"({float(ref_grad.reshape(-1)[i])!r}) at flat index {i}")
        return outcome
    raise ValueError(f"property {prop!r} does not apply to {case.op}")


# ----------------------------------------------------------------------------------------------
# masked reductions


def _reduction_args(case: Case, values: torch.Tensor, mask: torch.Tensor) -> tuple:
    if case.op == "masked_count":
        return (mask,)
    if case.op in ("masked_var", "masked_std"):
        return (values, mask, bool(case.inputs.get("unbiased", True)))
    return (values, mask)


def check_reduction(binding: Binding, case: Case) -> Outcome:
    fn = binding.resolve(case.op)
    values64, mask_np = case.inputs["values"], case.inputs["mask"].astype(bool)
    values = to_tensor(values64, case.dtype)
    mask = torch.from_numpy(mask_np)
    outcome = Outcome(True)
    args = _reduction_args(case, values, mask)
    ref_args = (mask_np,) if case.op == "masked_count" else (values64, mask_np, *args[2:])
    ref = np.float64(get_op(case.op).reference(*ref_args))
    undefined = bool(np.isnan(ref))  # e.g. the mean of no tokens: any result, or a loud error, is fine
    guard = InputGuard(values=values, mask=mask)
    try:
        out = _call(case.op, fn, *args)
    except EngineCrash:
        if undefined:
            return outcome
        raise
    if case.property == NON_DESTRUCTIVE:
        for m in guard.check("forward"):
            outcome.fail(m.describe())
        return outcome
    faithful = getattr(F, case.op)(*args)
    if as_numpy(out).size != 1:
        outcome.fail(f"value: the engine returned shape {tuple(np.shape(as_numpy(out)))}, expected a scalar")
        return outcome
    out_np = as_numpy(out).reshape(())
    out_dtype = _out_dtype(out, case.dtype)
    if case.property == MATCHES_REFERENCE:
        defined = ~np.isnan(ref)
        outcome.absorb("value", compare(out_np, ref, as_numpy(_round_to(faithful, out_dtype)), dtype=out_dtype,
                                        kind="reduction", only_where=defined))
        return outcome
    if case.property == FINITE:
        if representable(ref, out_dtype) and not np.isfinite(out_np):
            outcome.fail(f"value: engine {float(out_np)!r} where the reference is finite ({float(ref)!r})")
        return outcome
    raise ValueError(f"property {case.property!r} does not apply to {case.op}")


# ----------------------------------------------------------------------------------------------
# partitions


def partition_rows(partition) -> list:
    """Flatten a nested partition to its list of [start, stop) row ranges, in order."""
    if isinstance(partition, (list, tuple)) and len(partition) == 2 and all(isinstance(x, int) for x in partition):
        return [tuple(partition)]
    out = []
    for p in partition:
        out.extend(partition_rows(p))
    return out


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


def describe_partition(partition, mask: np.ndarray) -> str:
    """Token counts (nnz) per shard, nested like the partition, e.g. ``[[1, 100]]``."""
    if isinstance(partition, (list, tuple)) and len(partition) == 2 and all(isinstance(x, int) for x in partition):
        return str(int(mask[partition[0]:partition[1]].sum()))
    return "[" + ", ".join(describe_partition(p, mask) for p in partition) + "]"


# ----------------------------------------------------------------------------------------------
# agg_loss


def run_agg_loss(binding: Binding, loss_mat: torch.Tensor, mask: torch.Tensor, mode: str, partition,
                 loss_scale_factor=None) -> float:
    """Drive the engine's AggLoss over ``partition`` (list over DP ranks of lists of micro-batch row
    ranges) and return the combined scalar."""
    agg = binding.resolve("agg_loss")
    mask_np = mask.numpy().astype(bool)
    info_common = dict(
        dp_size=len(partition), global_nnz=int(mask_np.sum()), global_batch_size=int(mask_np.shape[0]),
        global_nonempty_seqs=int((mask_np.sum(-1) > 0).sum()), loss_scale_factor=loss_scale_factor)
    if agg.equal_micro_batches_per_rank:
        partition = equalize_micro_batches(partition)
    per_rank = []
    for rank in partition:
        info = BatchInfo(num_micro_batches=len(rank), **info_common)
        contribs = []
        for (a, b) in rank:
            v = _call("agg_loss", agg.loss, loss_mat[a:b], mask[a:b], mode, info)
            contribs.append(float(as_numpy(v)))
        per_rank.append(agg.combine(agg.micro_combine, contribs))
    return agg.combine(agg.dp_combine, per_rank)


def _faithful_agg_loss(loss: torch.Tensor, mask: torch.Tensor, mode: str, partition, lsf) -> float:
    """The dtype-faithful value of a partitioned loss: each micro-batch's contribution (normalised by
    global counts) computed in fp32 and rounded to the loss dtype, then summed over micro-batches and
    averaged over DP ranks in float64. Rounding each partial is what any engine returning per-micro
    losses in the input dtype must do, so it belongs in the yardstick."""
    mask_np = mask.numpy().astype(bool)
    common = dict(dp_size=len(partition), global_nnz=int(mask_np.sum()), global_batch_size=int(mask_np.shape[0]),
                  global_nonempty_seqs=int((mask_np.sum(-1) > 0).sum()), loss_scale_factor=lsf)
    ranks = []
    for rank in partition:
        info = BatchInfo(num_micro_batches=len(rank), **common)
        ranks.append(math.fsum(float(F.agg_loss_micro(loss[a:b], mask[a:b], mode, info).to(loss.dtype))
                               for a, b in rank))
    return math.fsum(ranks) / len(ranks)


def check_agg_loss(binding: Binding, case: Case) -> Outcome:
    agg = binding.resolve("agg_loss")
    mode = case.inputs["mode"]
    outcome = Outcome(True)
    if mode not in agg.modes:
        return outcome
    loss64, mask_np = case.inputs["loss_mat"], case.inputs["mask"].astype(bool)
    loss, mask = to_tensor(loss64, case.dtype), torch.from_numpy(mask_np)
    lsf = case.inputs.get("loss_scale_factor")
    partitions = case.inputs["partitions"]
    if case.property == NON_DESTRUCTIVE:
        guard = InputGuard(loss_mat=loss, mask=mask)
        run_agg_loss(binding, loss, mask, mode, partitions[0], lsf)
        for m in guard.check("forward"):
            outcome.fail(m.describe())
        return outcome
    ref = np.float64(R.agg_loss(loss64, mask_np, mode, loss_scale_factor=lsf))
    if np.isnan(ref):
        return outcome
    results = [run_agg_loss(binding, loss, mask, mode, p, lsf) for p in partitions]
    comps = [compare(r, ref, _faithful_agg_loss(loss, mask, mode, p, lsf), dtype=case.dtype, kind="pipeline")
             for r, p in zip(results, partitions)]
    if case.property == MATCHES_REFERENCE:
        outcome.absorb(f"mode {mode}, shards (nnz) {describe_partition(partitions[0], mask_np)}", comps[0])
        return outcome
    if case.property == PARTITION_INVARIANT:
        for p, r, c in zip(partitions[1:], results[1:], comps[1:]):
            # each result may be off the reference by its own tolerance
            slack = comps[0].tolerance + c.tolerance
            diff = abs(r - results[0])
            if not diff <= slack:
                outcome.fail(f"mode {mode}: {r!r} with shards (nnz) {describe_partition(p, mask_np)} vs "
                             f"{results[0]!r} with shards {describe_partition(partitions[0], mask_np)} "
                             f"(reference {float(ref)!r}, allowed difference {slack:.3g})")
                outcome.max_abs_err = max(outcome.max_abs_err, diff if np.isfinite(diff) else math.inf)
        return outcome
    raise ValueError(f"property {case.property!r} does not apply to agg_loss")


# ----------------------------------------------------------------------------------------------
# metric pipeline


def _accepts_info(fn: Callable) -> bool:
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return False
    return len([p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]) >= 3 or any(
        p.kind == p.VAR_POSITIONAL for p in params)


def run_metric_pipeline(binding: Binding, values: torch.Tensor, mask: torch.Tensor, partition):
    """Drive the engine's MetricPipeline over a nested partition (mini-batches -> DP ranks ->
    micro-batches of row ranges). Returns (emitted keys, final dict)."""
    mp = binding.resolve("metric_pipeline")
    with_info = _accepts_info(mp.emit)
    emitted: set[str] = set()
    minis = []
    for mini_i, mini in enumerate(partition):
        if mp.equal_micro_batches_per_rank:
            mini = equalize_micro_batches(mini)
        ranks = []
        for rank_i, rank in enumerate(mini):
            outs = []
            for micro_i, (a, b) in enumerate(rank):
                info = {"mini_batch": mini_i, "dp_rank": rank_i, "dp_size": len(mini), "micro_batch": micro_i,
                        "num_micro_batches": len(rank)}
                args = (values[a:b], mask[a:b]) + ((info,) if with_info else ())
                d = _call("metric_pipeline.emit", mp.emit, *args)
                emitted.update(d)
                outs.append(d)
            ranks.append(_call("metric_pipeline.reduce_micro", mp.reduce_micro, outs))
        minis.append(_call("metric_pipeline.reduce_dp", mp.reduce_dp, ranks))
    reduce_mini = mp.reduce_mini or mp.reduce_micro
    final = _call("metric_pipeline.finalize", mp.finalize, _call("metric_pipeline.reduce_mini", reduce_mini, minis))
    return emitted, final


def _is_number(x: Any) -> bool:
    """A Python or NumPy real scalar (loggers accept both); not a tensor, not a bool, not an array."""
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, (bool, np.bool_))


def check_metric_pipeline(binding: Binding, case: Case) -> Outcome:
    mp = binding.resolve("metric_pipeline")
    values64, mask_np = case.inputs["values"], case.inputs["mask"].astype(bool)
    values, mask = to_tensor(values64, case.dtype), torch.from_numpy(mask_np)
    partitions = case.inputs["partitions"]
    outcome = Outcome(True)
    if case.property == METRIC_INTEGRITY:
        emitted, final = run_metric_pipeline(binding, values, mask, partitions[0])
        mapping = mp.emitted_to_final or {}
        for key in sorted(emitted):
            target = mapping.get(key, key)
            if target not in final:
                outcome.fail(f"emitted key {key!r} never reached the final dict as {target!r} "
                             f"(final keys: {sorted(final)})")
            elif not _is_number(final[target]):
                outcome.fail(f"final {target!r} is a {type(final[target]).__module__}.{type(final[target]).__name__}, "
                             f"not a number: {final[target]!r}")
        return outcome
    ref = R.token_metrics(values64, mask_np)
    if not ref["nnz"]:
        return outcome
    faithful = {
        "mean": F.masked_mean(values, mask), "std": F.masked_std(values, mask, False),
        "min": F.masked_min(values, mask), "max": F.masked_max(values, mask),
    }
    runs = [run_metric_pipeline(binding, values, mask, p)[1] for p in partitions]
    for stat, key in mp.stats.items():
        got = [final.get(key) for final in runs]
        label = lambda i: f"{key} ({stat}), shards (nnz) {describe_partition(partitions[i], mask_np)}"  # noqa: E731
        if got[0] is None:
            outcome.fail(f"{key} ({stat}) missing from the final dict {sorted(runs[0])}")
            continue
        fa = as_numpy(faithful[stat])
        if case.property == MATCHES_REFERENCE:
            outcome.absorb(label(0), compare(as_numpy(got[0]), ref[stat], fa, dtype=case.dtype, kind="pipeline"))
        elif case.property == PARTITION_INVARIANT:
            base = compare(as_numpy(got[0]), ref[stat], fa, dtype=case.dtype, kind="pipeline")
            for i in range(1, len(runs)):
                if got[i] is None:
                    outcome.fail(f"{key} missing with shards {describe_partition(partitions[i], mask_np)}")
                    continue
                d = abs(float(as_numpy(got[i])) - float(as_numpy(got[0])))
                slack = 2 * base.tolerance
                if not d <= slack:
                    outcome.fail(f"{label(i)} = {float(as_numpy(got[i]))!r} vs {label(0)} = "
                                 f"{float(as_numpy(got[0]))!r} (reference {ref[stat]!r}, allowed difference "
                                 f"{slack:.3g})")
                    outcome.max_abs_err = max(outcome.max_abs_err, d)
        else:
            raise ValueError(f"property {case.property!r} does not apply to metric_pipeline")
    return outcome


# ----------------------------------------------------------------------------------------------
# optimal token baseline


def check_advantage(binding: Binding, case: Case) -> Outcome:
    fn = binding.resolve(case.op)
    names = ("rewards", "mask", "old_log_probs", "sum_pi_squared")
    arrs = {k: case.inputs[k] for k in names}
    index = np.asarray(case.inputs["index"])
    tensors = {k: to_tensor(arrs[k], case.dtype) for k in names}
    tensors["mask"] = torch.from_numpy(arrs["mask"].astype(bool)).to(TORCH_DTYPES[case.dtype])
    args = (tensors["rewards"], tensors["mask"], index, tensors["old_log_probs"], tensors["sum_pi_squared"])
    outcome = Outcome(True)
    if case.property == NON_DESTRUCTIVE:
        guard = InputGuard(**tensors)
        _call(case.op, fn, *args)
        for m in guard.check("forward"):
            outcome.fail(m.describe())
        return outcome
    adv, ret = _call(case.op, fn, *args)
    ref_adv, ref_ret = R.optimal_token_baseline(arrs["rewards"], arrs["mask"], index, arrs["old_log_probs"],
                                                arrs["sum_pi_squared"])
    f_adv, f_ret = F.optimal_token_baseline(*args)
    if case.property == MATCHES_REFERENCE:
        outcome.absorb("advantages", compare(as_numpy(adv), ref_adv, as_numpy(f_adv), dtype=case.dtype, kind="advantage"))
        outcome.absorb("returns", compare(as_numpy(ret), ref_ret, as_numpy(f_ret), dtype=case.dtype, kind="advantage"))
        return outcome
    if case.property == FINITE:
        for label, got, ref in (("advantages", adv, ref_adv), ("returns", ret, ref_ret)):
            g = as_numpy(got)
            bad = representable(ref, case.dtype) & ~np.isfinite(g)
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                outcome.fail(f"{label}: engine {float(g.reshape(-1)[i])!r} where the reference is finite at flat index {i}")
        return outcome
    raise ValueError(f"property {case.property!r} does not apply to {case.op}")


_CHECKS = {
    "token_stat": check_token_stat,
    "reduction": check_reduction,
    "agg_loss": check_agg_loss,
    "metric_pipeline": check_metric_pipeline,
    "advantage": check_advantage,
}


def run_check(binding: Binding, case: Case) -> Outcome:
    """Check ``case`` against ``binding``; raises EngineCrash, OpUnavailable or BindingError."""
    info = get_op(case.op)
    if case.property not in info.properties:
        raise ValueError(f"property {case.property!r} does not apply to op {case.op!r}")
    check = _CHECKS.get(info.kind)
    if check is None and info.kind in DISTRIBUTED_KINDS:  # multi-process checks, imported on first use
        from rlconform.distributed_tests.checks import CHECKS

        check = CHECKS[info.kind]
    return check(binding, case)
