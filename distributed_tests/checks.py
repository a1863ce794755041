"""The distributed property checks, on one concrete :class:`~rlconform.properties.case.Case`.

``check_vocab_parallel``, ``check_context_parallel`` and ``check_dp_metric`` take ``(binding, case)`` and
return an :class:`~rlconform.properties.checks.Outcome`, like the in-process checks; ``run_check``
dispatches the kinds ``vocab_parallel``, ``context_parallel`` and ``dp_metric`` here, so ``rlconform
replay`` re-runs a saved distributed case. The parent draws and shards the data, ships one payload per
rank to the session's worker pool (:func:`rlconform.harness.pool.get_pool`, world = the layout's
``tp·cp·dp``), and compares what comes back with the float64 reference of the *unsharded* data. Under
torchrun (``RANK``/``WORLD_SIZE`` set) the same payloads run in-process on each rank and the results
are all-gathered, so a case runs unchanged as ``torchrun --nproc-per-node N --no-python rlconform
replay CASE.json``.

Properties (the layout comes from the regime, see :mod:`rlconform.distributed_tests.layout`):

* ``matches_reference`` — every rank's value (each TP rank holds the full-vocab statistic; CP ranks
  their own rows) and, for the vocab-parallel ops, the gradient w.r.t. each rank's shard (shards
  concatenated) against the float64 reference under the tolerance policy.
* ``partition_invariant`` — the layout against the unsharded computation (TP = CP = DP = 1, on rank 0 of
  the same group, in the same round trip) and, for DP, against a second split of the rows: values (and
  gradients) may differ by at most twice the tolerance bound.
* ``non_destructive`` — on every rank, the shard (a producer's saved output, see
  :func:`rlconform.harness.guards.produce`) and the labels are bit-identical with unchanged version
  counters after forward and after backward; the producer must still backprop. For
  ``vocab_parallel_sum_pi_squared`` in the ``*_after_entropy`` regimes, the *ordering* check of seed 002:
  Σπ² read before and after a vocab-parallel entropy forward + backward on the same logits (the
  binding's own ``vocab_parallel_entropy``, or the reference one) must be bit-identical.

A failure on a rank (an exception, a death, a hang past the deadline) is an
:class:`~rlconform.properties.checks.EngineCrash` carrying every rank's traceback.
"""

from __future__ import annotations

import os
import traceback

import numpy as np
import torch

from rlconform.distributed_tests import ranks as K
from rlconform.distributed_tests.layout import Layout, parse_regime, row_chunks, zigzag_index
from rlconform.harness import faithful as F
from rlconform.harness.binding import Binding
from rlconform.harness.catalog import MATCHES_REFERENCE, NON_DESTRUCTIVE, PARTITION_INVARIANT, get_op
from rlconform.harness.pool import RankFailure, get_pool, in_torchrun
from rlconform.harness.tolerance import ATOL, C, ULP_FLOOR, compare, ulp
from rlconform.properties.case import Case
from rlconform.properties.checks import EngineCrash, Outcome, to_tensor

__all__ = ["CHECKS", "check_context_parallel", "check_dp_metric", "check_vocab_parallel", "run_ranks"]

#: deadline of one case on the ranks, ``RLCONFORM_DIST_DEADLINE_S`` (the first call of verl's vocab-parallel
#: entropy in a worker compiles a kernel: 15–40 s on 2 busy cores)
DEADLINE_S = float(os.environ.get("RLCONFORM_DIST_DEADLINE_S", "180"))
#: timeout of the pool's gloo groups when this module creates the pool, ``RLCONFORM_DIST_COLLECTIVE_TIMEOUT_S``
#: (a rank may wait in a collective while a peer compiles)
COLLECTIVE_TIMEOUT_S = float(os.environ.get("RLCONFORM_DIST_COLLECTIVE_TIMEOUT_S", "120"))


# ------------------------------------------------------------------------------------- running
def run_ranks(world: int, fn, payloads: list, where: str) -> list:
    """Run ``fn`` on ``world`` ranks (the session's pool, or this torchrun job) and return the results in
    rank order; a failure on any rank becomes an :class:`EngineCrash` with every rank's traceback."""
    try:
        if in_torchrun():
            return _run_torchrun(world, fn, payloads)
        pool = get_pool(world, timeout_s=DEADLINE_S, collective_timeout_s=COLLECTIVE_TIMEOUT_S)
        return pool.run(fn, payloads, timeout_s=DEADLINE_S)
    except RankFailure as exc:
        raise EngineCrash(where, exc) from exc


def _run_torchrun(world: int, fn, payloads: list) -> list:
    import torch.distributed as dist

    from rlconform.harness.pool import run_under_torchrun

    started = int(os.environ["WORLD_SIZE"])
    if started != world:
        raise RuntimeError(f"this case needs {world} ranks; torchrun started {started} (--nproc-per-node)")
    try:
        local = ("ok", run_under_torchrun(fn, payloads))
    except Exception:  # noqa: BLE001 - reported on every rank below
        local = ("err", traceback.format_exc())
    gathered = [None] * world
    dist.all_gather_object(gathered, local)
    failed = [r for r, (kind, _) in enumerate(gathered) if kind == "err"]
    if failed:
        tbs = {r: (msg if kind == "err" else "completed (result discarded)") for r, (kind, msg) in enumerate(gathered)}
        raise RankFailure("raised", tbs, failed, 0.0)
    return [value for _, value in gathered]


def _unsharded(world: int) -> Layout:
    """TP = CP = 1 over the same ranks (the 'tp' and 'cp' groups are single ranks)."""
    return Layout(1, 1, world)


# ------------------------------------------------------------------------------ tolerance helpers
def _bound(ref, faithful, dtype: str, kind: str) -> np.ndarray:
    r = np.asarray(ref, dtype=np.float64).reshape(-1)
    f = np.asarray(faithful, dtype=np.float64).reshape(-1)
    with np.errstate(invalid="ignore"):
        ferr = np.where(np.isfinite(r) & np.isfinite(f), np.abs(f - r), 0.0)
    return C[dtype] * ferr + ULP_FLOOR[dtype] * ulp(r, dtype) + ATOL[kind][dtype]


def _invariant(outcome: Outcome, label: str, a, b, ref, faithful, dtype: str, kind: str) -> None:
    """``a`` and ``b`` (two layouts) may differ by at most twice the tolerance bound at each element."""
    a = np.asarray(a, dtype=np.float64).reshape(-1)
    b = np.asarray(b, dtype=np.float64).reshape(-1)
    r = np.asarray(ref, dtype=np.float64).reshape(-1)
    if a.shape != b.shape:
        outcome.fail(f"{label}: shapes differ ({a.size} vs {b.size} elements)")
        return
    if a.size == 0:
        return
    allowed = 2 * _bound(r, faithful, dtype, kind)
    with np.errstate(invalid="ignore"):
        diff = np.abs(a - b)
        same_nonfinite = (~np.isfinite(a) | ~np.isfinite(b)) & ((a == b) | (np.isnan(a) & np.isnan(b)))
        diff = np.where(same_nonfinite | np.isnan(r), 0.0, np.where(np.isnan(diff), np.inf, diff))
        ratio = diff / allowed
    i = int(np.argmax(ratio))
    outcome.max_abs_err = max(outcome.max_abs_err, float(diff[i]) if np.isfinite(diff[i]) else outcome.max_abs_err)
    if ratio[i] >= outcome.ratio:
        outcome.ratio, outcome.tolerance = float(ratio[i]), float(allowed[i])
    if ratio[i] > 1.0:
        outcome.ok = False
        outcome.message += (("\n" if outcome.message else "") +
                            f"{label}: {float(a[i])!r} vs {float(b[i])!r} at flat index {i} (reference {float(r[i])!r}, "
                            f"allowed difference {allowed[i]:.3g})")


def _messages(outcome: Outcome, layout: Layout, results: list) -> None:
    for rank, res in enumerate(results):
        if res is None:
            continue
        t, c, d = layout.coords(rank)
        where = f"rank {rank} (" + ", ".join(f"{k} {v}" for k, v, n in (("tp", t, layout.tp), ("cp", c, layout.cp),
                                                                           ("dp", d, layout.dp)) if n > 1) + ")"
        for m in res["messages"]:
            outcome.fail(f"{where}: {m}")


# --------------------------------------------------------------------------------- vocab parallel
def _vp_shard(x: np.ndarray, labels, g: np.ndarray, layout: Layout, rank: int) -> dict:
    t, c, _ = layout.coords(rank)
    if layout.cp > 1:
        rows = row_chunks(x.shape[0], layout.cp)[c]
        x, g = x[rows], g[rows]
        labels = labels[rows] if labels is not None else None
    vl = x.shape[-1] // layout.tp
    out = {"logits": np.ascontiguousarray(x[..., t * vl:(t + 1) * vl]), "grad_output": np.ascontiguousarray(g)}
    if labels is not None:
        out["labels"] = np.ascontiguousarray(labels)  # global vocab ids
    return out


def _vp_assemble(results: list, layout: Layout):
    """Per TP rank, the value over all rows; the gradient with the shards concatenated (or None)."""
    values = []
    for t in range(layout.tp):
        parts = [results[layout.rank(t, c)]["out"] for c in range(layout.cp)]
        values.append(np.concatenate([p.reshape(-1) for p in parts]) if layout.cp > 1 else parts[0])
    grad = None
    if all(results[r]["grad"] is not None for r in range(layout.world)):
        rows = [np.concatenate([results[layout.rank(t, c)]["grad"] for t in range(layout.tp)], axis=-1)
                for c in range(layout.cp)]
        grad = np.concatenate(rows, axis=0) if layout.cp > 1 else rows[0]
    r0 = results[0]
    return values, grad, r0["out_dtype"], r0["grad_dtype"]


def _vp_faithful(base: str, x: torch.Tensor, labels, g: torch.Tensor):
    leaf = x.detach().clone().requires_grad_(True)
    args = (leaf, torch.from_numpy(labels).long()) if labels is not None else (leaf,)
    out = getattr(F, base)(*args)
    (out.to(torch.float64) * g).sum().backward()
    return out.detach(), leaf.grad.detach()


def check_vocab_parallel(binding: Binding, case: Case) -> Outcome:
    info = get_op(case.op)
    base = case.op[len("vocab_parallel_"):]
    layout, data_regime = parse_regime(case.regime)
    after = data_regime == "after_entropy"
    binding.resolve(case.op)  # OpUnavailable / BindingError surface here, in the parent
    if after and "vocab_parallel_entropy" in binding.ops:
        binding.resolve("vocab_parallel_entropy")
    x64 = np.asarray(case.inputs["logits"], dtype=np.float64)
    labels = case.inputs.get("labels")
    labels = np.asarray(labels, dtype=np.int64) if labels is not None else None
    g64 = case.inputs.get("grad_output")
    g64 = np.ones(x64.shape[:-1]) if g64 is None else np.asarray(g64, dtype=np.float64)
    if x64.shape[-1] % layout.tp:
        raise ValueError(f"vocab size {x64.shape[-1]} is not padded to a multiple of tp = {layout.tp}")
    prop = case.property
    outcome = Outcome(True)
    world = layout.world

    if prop == NON_DESTRUCTIVE:
        mode, layouts = ("order" if after else "guard"), [layout]
    elif prop in (MATCHES_REFERENCE, PARTITION_INVARIANT):
        mode = "after" if after else "value"
        layouts = [layout] + ([_unsharded(world)] if prop == PARTITION_INVARIANT else [])
    else:
        raise ValueError(f"property {prop!r} does not apply to {case.op}")

    desc = K.engine_desc(binding)
    payloads = []
    for rank in range(world):
        runs = [{"layout": layout.as_dict(), "data": _vp_shard(x64, labels, g64, layout, rank)}]
        if len(layouts) > 1:
            runs.append({"layout": layouts[1].as_dict(),
                         "data": {"logits": x64, "grad_output": g64, **({"labels": labels} if labels is not None else {})}
                         if rank == 0 else None})
        payloads.append({"engine": desc, "op": case.op, "dtype": case.dtype, "mode": mode, "runs": runs})
    results = run_ranks(world, K.vocab_parallel_rank, payloads, f"{case.op} on {layout.name} ({world} ranks)")

    if prop == NON_DESTRUCTIVE:
        _messages(outcome, layout, [r[0] for r in results])
        return outcome

    ref = info.reference(x64, labels) if labels is not None else info.reference(x64)
    x = to_tensor(x64, case.dtype)
    f_out, f_grad = _vp_faithful(base, x, labels, torch.from_numpy(g64))
    values, grad, out_dtype, grad_dtype = _vp_assemble([r[0] for r in results], layout)
    if case.op in binding.forward_only:  # the engine's contract has no gradient for this op
        grad = None
    f_out_np = K.to_numpy(f_out.to(K._torch_dtype(out_dtype)))
    ref_grad = None
    if grad is not None:
        ref_grad = (info.reference_grad(x64, labels, grad_output=g64) if labels is not None
                    else info.reference_grad(x64, grad_output=g64))
        f_grad_np = K.to_numpy(f_grad.to(K._torch_dtype(grad_dtype)))
    what = f"{base} read after vocab_parallel_entropy forward+backward" if after else base

    if prop == MATCHES_REFERENCE:
        for t, v in enumerate(values):
            label = f"value on TP rank {t} of {layout.name}" + (f" ({what})" if after else "")
            outcome.absorb(label, compare(v.reshape(np.shape(ref)), ref, f_out_np, dtype=out_dtype, kind="token_stat"))
        if grad is not None:
            outcome.absorb(f"gradient w.r.t. the vocab shards of {layout.name} (concatenated)",
                           compare(grad, ref_grad, f_grad_np, dtype=grad_dtype, kind="token_stat"))
        return outcome

    # partition_invariant
    unsharded = results[0][1]
    _invariant(outcome, f"value, {layout.name} vs unsharded (TP = 1)", values[0], unsharded["out"], ref, f_out_np,
               out_dtype, "token_stat")
    if grad is not None and unsharded["grad"] is not None:
        _invariant(outcome, f"gradient, {layout.name} (shards concatenated) vs unsharded (TP = 1)", grad,
                   unsharded["grad"], ref_grad, f_grad_np, grad_dtype, "token_stat")
    return outcome


# ------------------------------------------------------------------------------- context parallel
def check_context_parallel(binding: Binding, case: Case) -> Outcome:
    layout, _ = parse_regime(case.regime)
    binding.resolve(case.op)
    values64 = np.asarray(case.inputs["values"], dtype=np.float64)
    mask = np.asarray(case.inputs["mask"], dtype=bool)
    world = layout.world
    seq = values64.shape[1]
    prop = case.property
    outcome = Outcome(True)
    if prop not in (MATCHES_REFERENCE, PARTITION_INVARIANT, NON_DESTRUCTIVE):
        raise ValueError(f"property {prop!r} does not apply to {case.op}")
    desc = K.engine_desc(binding)
    shards = []
    payloads = []
    for rank in range(world):
        _, c, _ = layout.coords(rank)
        idx = zigzag_index(seq, layout.cp, c)
        shard = {"values": np.ascontiguousarray(values64[:, idx]), "mask": np.ascontiguousarray(mask[:, idx])}
        shards.append(shard)
        runs = [{"layout": layout.as_dict(), "data": shard}]
        if prop == PARTITION_INVARIANT:
            runs.append({"layout": _unsharded(world).as_dict(),
                         "data": {"values": values64, "mask": mask} if rank == 0 else None})
        payloads.append({"engine": desc, "op": case.op, "dtype": case.dtype, "group": "cp",
                         "mode": "guard" if prop == NON_DESTRUCTIVE else "value", "runs": runs})
    results = run_ranks(world, K.token_reduction_rank, payloads, f"{case.op} on {layout.name} ({world} ranks)")
    if prop == NON_DESTRUCTIVE:
        _messages(outcome, layout, [r[0] for r in results])
        return outcome
    ref = np.float64(get_op(case.op).reference(values64, mask))
    if np.isnan(ref):  # no unmasked token: the mean is undefined
        return outcome
    out_dtype = results[0][0]["out_dtype"]
    faithful = K.to_numpy(F.masked_mean(to_tensor(values64, case.dtype), torch.from_numpy(mask))
                          .to(K._torch_dtype(out_dtype)))
    if prop == MATCHES_REFERENCE:
        for rank, res in enumerate(results):
            _, c, _ = layout.coords(rank)
            nnz = int(shards[rank]["mask"].sum())
            outcome.absorb(f"{layout.name}: CP rank {c} (global rank {rank}, {nnz} of {int(mask.sum())} tokens)",
                           compare(res[0]["out"], ref, faithful, dtype=out_dtype, kind="reduction"))
        return outcome
    nnz = [int(shards[layout.rank(0, c)]["mask"].sum()) for c in range(layout.cp)]
    _invariant(outcome, f"{layout.name} (tokens per CP rank {nnz}) vs unsharded (CP = 1)", results[0][0]["out"],
               results[0][1]["out"], ref, faithful, out_dtype, "reduction")
    return outcome


# ------------------------------------------------------------------------------------ DP metrics
def check_dp_metric(binding: Binding, case: Case) -> Outcome:
    layout, _ = parse_regime(case.regime)
    binding.resolve(case.op)
    values64 = np.asarray(case.inputs["values"], dtype=np.float64)
    mask = np.asarray(case.inputs["mask"], dtype=bool)
    partitions = case.inputs["partitions"]
    world = layout.world
    prop = case.property
    outcome = Outcome(True)
    if prop not in (MATCHES_REFERENCE, PARTITION_INVARIANT):
        raise ValueError(f"property {prop!r} does not apply to {case.op}")
    splits = partitions[:1] if prop == MATCHES_REFERENCE else partitions[:2]
    desc = K.engine_desc(binding)
    payloads = []
    for rank in range(world):
        _, _, d = layout.coords(rank)
        runs = []
        for split in splits:
            a, b = split[d]
            runs.append({"layout": layout.as_dict(), "group": "dp",
                         "data": {"values": values64[a:b], "mask": mask[a:b]}})
        if prop == PARTITION_INVARIANT:
            runs.append({"layout": _unsharded(world).as_dict(), "group": "tp",
                         "data": {"values": values64, "mask": mask} if rank == 0 else None})
        payloads.append({"engine": desc, "op": case.op, "dtype": case.dtype, "group": "dp", "mode": "value",
                         "runs": runs})
    results = run_ranks(world, K.token_reduction_rank, payloads, f"{case.op} on {layout.name} ({world} ranks)")
    ref = np.float64(get_op(case.op).reference(values64, mask))
    if np.isnan(ref):
        return outcome
    out_dtype = results[0][0]["out_dtype"]
    faithful = K.to_numpy(F.masked_mean(to_tensor(values64, case.dtype), torch.from_numpy(mask))
                          .to(K._torch_dtype(out_dtype)))

    def nnz(split):
        return [int(mask[a:b].sum()) for a, b in split]

    if prop == MATCHES_REFERENCE:
        for rank, res in enumerate(results):
            outcome.absorb(f"{layout.name}: DP rank {rank}, tokens per DP rank {nnz(splits[0])}",
                           compare(res[0]["out"], ref, faithful, dtype=out_dtype, kind="pipeline"))
        return outcome
    base = results[0][0]["out"]
    for i in range(1, len(splits)):
        _invariant(outcome, f"tokens per DP rank {nnz(splits[i])} vs {nnz(splits[0])}", results[0][i]["out"], base,
                   ref, faithful, out_dtype, "pipeline")
    _invariant(outcome, f"unsharded (DP = 1) vs tokens per DP rank {nnz(splits[0])}", results[0][len(splits)]["out"],
               base, ref, faithful, out_dtype, "pipeline")
    return outcome


CHECKS = {
    "vocab_parallel": check_vocab_parallel,
    "context_parallel": check_context_parallel,
    "dp_metric": check_dp_metric,
}
