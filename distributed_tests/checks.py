"""The distributed property checks, on one concrete :class:`~rlconform.properties.case.Case`.

``evaluate_vocab_parallel``, ``evaluate_context_parallel`` and ``evaluate_dp_metric`` take ``(binding,
case)`` and assemble every rank's results into an :class:`~rlconform.harness.core.evaluation.Evaluation`,
which ``run_check`` judges with the same generic properties as the in-process checks
(:mod:`rlconform.properties.generic`), so ``rlconform replay`` re-runs a saved distributed case. The parent draws and shards the data, ships one payload per
rank to the session's worker pool (:func:`rlconform.harness.workers.pool.get_pool`, world = the layout's
``tp·cp·dp``), and compares what comes back with the float64 reference of the *unsharded* data. Under
torchrun (``RANK``/``WORLD_SIZE`` set) the same payloads run in-process on each rank and the results
are all-gathered, so a case runs unchanged as ``torchrun --nproc-per-node N --no-python rlconform
replay CASE.json``.

Properties (the layout comes from the regime, see :mod:`rlconform.harness.core.layout`):

* ``matches_reference`` — every rank's value (each TP rank holds the full-vocab statistic; CP ranks
  their own rows) and, for the vocab-parallel ops, the gradient w.r.t. each rank's shard (shards
  concatenated) against the float64 reference under the tolerance policy.
* ``partition_invariant`` — the layout against the unsharded computation (TP = CP = DP = 1, on rank 0 of
  the same group, in the same round trip) and, for DP, against a second split of the rows: values (and
  gradients) may differ by at most twice the tolerance bound.
* ``non_destructive`` — on every rank, the shard (a producer's saved output, see
  :func:`rlconform.harness.core.guards.produce`) and the labels are bit-identical with unchanged version
  counters after forward and after backward; the producer must still backprop. For
  ``vocab_parallel_sum_pi_squared`` in the ``*_after_entropy`` regimes, the *ordering* check of verl PR #6153:
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
from rlconform.harness.catalog.binding import Binding, BindingError
from rlconform.harness.catalog.ops import (
    MASK_INVARIANT,
    MATCHES_REFERENCE,
    NON_DESTRUCTIVE,
    PARTITION_INVARIANT,
    get_op,
)
from rlconform.harness.core import faithful as F
from rlconform.harness.core.evaluation import Compared, EngineCrash, Evaluation, call_engine
from rlconform.harness.core.failure import mutation as mutation_clause
from rlconform.harness.core.failure import problem as problem_clause
from rlconform.harness.core.generated import LogitsGen
from rlconform.harness.core.layout import Layout, parse_regime, row_chunks, zigzag_index
from rlconform.harness.core.tensors import to_tensor
from rlconform.harness.workers.pool import PoolStartupError, RankFailure, get_pool, in_torchrun
from rlconform.properties.case import Case
from rlconform.properties.generic import JUDGES, Outcome

__all__ = ["EVALUATORS", "evaluate_context_parallel", "evaluate_dp_metric", "evaluate_dp_whiten",
           "evaluate_vocab_parallel", "on_pool", "run_check", "run_check_here", "run_ranks"]

#: deadline of one case on the ranks, ``RLCONFORM_DIST_DEADLINE_S`` (the first call of verl's vocab-parallel
#: entropy in a worker compiles a kernel: 15–40 s on 2 busy cores)
DEADLINE_S = float(os.environ.get("RLCONFORM_DIST_DEADLINE_S", "180"))
#: timeout of the pool's gloo groups when this module creates the pool, ``RLCONFORM_DIST_COLLECTIVE_TIMEOUT_S``
#: (a rank may wait in a collective while a peer compiles)
COLLECTIVE_TIMEOUT_S = float(os.environ.get("RLCONFORM_DIST_COLLECTIVE_TIMEOUT_S", "120"))


# ------------------------------------------------------------------------------------- running
def run_ranks(world: int, fn, payloads: list, where: str) -> list:
    """Run ``fn`` on ``world`` ranks (the session's pool, or this torchrun job) and return the results in
    rank order; a failure on any rank becomes an :class:`EngineCrash` with every rank's traceback.

    The round trip to the pool is an engine call (:func:`~rlconform.harness.core.evaluation.call_engine` of
    :func:`on_pool`): under a referee the evaluation runs in the referee, the engine's worker
    makes only this call on its pool and the ranks' raw outputs (NumPy arrays as bytes, dtype names,
    guard messages) travel back to the referee, which computes the reference, the faithful path and the
    verdict. Raises :class:`~rlconform.harness.workers.pool.PoolStartupError` (a harness error, never a
    verdict) when the pool cannot start."""
    if in_torchrun():  # every rank is a process of this job (no referee: `replay` under torchrun)
        try:
            return _run_torchrun(world, fn, payloads)
        except RankFailure as exc:
            raise EngineCrash(where, exc) from exc
    try:
        return call_engine(where, on_pool, world, fn, payloads)
    except EngineCrash as exc:
        cause = exc.__cause__
        if cause is not None and type(cause).__name__ == PoolStartupError.__name__:
            raise PoolStartupError(str(cause)) from None
        raise


def on_pool(world: int, fn, payloads: list) -> list:
    """``fn`` on ``world`` ranks of the session's pool (started on first use, in the calling process: the
    engine's worker); raises :class:`~rlconform.harness.workers.pool.RankFailure` when a rank fails."""
    from rlconform.harness.core import device

    backend, devices = device.pool_backend(world)  # gloo on cpu; nccl, or gloo over CUDA tensors
    pool = get_pool(world, backend=backend, devices=devices, timeout_s=DEADLINE_S,
                    collective_timeout_s=COLLECTIVE_TIMEOUT_S)
    return pool.run(fn, payloads, timeout_s=DEADLINE_S)


def _run_torchrun(world: int, fn, payloads: list) -> list:
    import torch.distributed as dist

    from rlconform.harness.workers.pool import run_under_torchrun

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


# ------------------------------------------------------------------------------------ messages
def _rank_name(layout: Layout, rank: int) -> str:
    t, c, d = layout.coords(rank)
    return f"rank {rank} (" + ", ".join(f"{k} {v}" for k, v, n in (("tp", t, layout.tp), ("cp", c, layout.cp),
                                                                   ("dp", d, layout.dp)) if n > 1) + ")"


def _messages(ev: Evaluation, layout: Layout, results: list) -> None:
    """Per-rank guard messages become mutations; a rank that returned nothing is a problem."""
    for rank, res in enumerate(results):
        if res is None:
            ev.problems.append(problem_clause("missing output", f"{_rank_name(layout, rank)} returned nothing"))
            continue
        for m in res["messages"]:
            if isinstance(m, dict) and m.get("problem"):  # something the rank could not do (a backward)
                ev.problems.append(problem_clause(m["problem"], f"{_rank_name(layout, rank)}: {m['sentence']}"))
            elif isinstance(m, dict):  # a change of a tensor, as the keywords of failure.mutation
                ev.mutations.append(mutation_clause(**dict(m, sentence=f"{_rank_name(layout, rank)}: {m['sentence']}")))
            else:
                raise TypeError(f"a rank's message must be a record (a dict), not {type(m).__name__}: {m!r}"[:300])


# --------------------------------------------------------------------------------- vocab parallel
def _vp_shard(x: np.ndarray, labels, g: np.ndarray, layout: Layout, rank: int, params: tuple = ()) -> dict:
    t, c, _ = layout.coords(rank)
    if layout.cp > 1:
        rows = row_chunks(x.shape[0], layout.cp)[c]
        x, g = x[rows], g[rows]
        labels = labels[rows] if labels is not None else None
    vl = x.shape[-1] // layout.tp
    out = {"logits": np.ascontiguousarray(x[..., t * vl:(t + 1) * vl]), "grad_output": np.ascontiguousarray(g)}
    if labels is not None:
        out["labels"] = np.ascontiguousarray(labels)  # global vocab ids
    if params:
        out["params"] = list(params)
    return out


def _vp_assemble(results: list, layout: Layout, expect_grad: bool, ev: Evaluation):
    """Per TP rank, the value over all rows; the gradient with the shards concatenated (or None). With
    ``expect_grad``, a rank without an autograd graph or without a gradient is a problem of ``ev`` (one
    rank's missing gradient never drops the check of the others: “gradient check skipped without a graph”)."""
    values = []
    for t in range(layout.tp):
        parts = [results[layout.rank(t, c)]["out"] for c in range(layout.cp)]
        values.append(np.concatenate([p.reshape(-1) for p in parts]) if layout.cp > 1 else parts[0])
    grad = None
    missing = [r for r in range(layout.world) if results[r]["grad"] is None]
    if expect_grad:
        for r in missing:
            why = "no autograd graph (requires_grad=False)" if not results[r].get("graph", True) else \
                "no gradient reached its vocab shard"
            ev.problems.append(problem_clause("missing gradient", f"gradient: {_rank_name(layout, r)}: {why}"))
    if not missing:
        rows = [np.concatenate([results[layout.rank(t, c)]["grad"] for t in range(layout.tp)], axis=-1)
                for c in range(layout.cp)]
        grad = np.concatenate(rows, axis=0) if layout.cp > 1 else rows[0]
    r0 = results[0]
    return values, grad, r0["out_dtype"], r0["grad_dtype"]


def _vp_faithful(base: str, x: torch.Tensor, labels, g: torch.Tensor, params: tuple = ()):
    leaf = x.detach().clone().requires_grad_(True)
    args = ((leaf, torch.from_numpy(labels).long()) if labels is not None else (leaf,)) + params
    out = getattr(F, base)(*args)
    (out.to(torch.float64) * g).sum().backward()
    return out.detach(), leaf.grad.detach()


def _evaluate_vp_implementation(binding: Binding, case: Case, name: str) -> Evaluation:
    """An alternative implementation ``name`` of a vocab-parallel op on TP ranks: the same
    data in every input rank its contract allows (tokens ``[N]`` or ``[b, N/b]``), each answer (value on every
    TP rank, the gradient w.r.t. the concatenated shards) compared with the reference; a rank that raises on
    some TP rank, or an output dtype off the contract, is a problem of the case."""
    from rlconform.harness.core import impl_contract as IC
    from rlconform.harness.core.opinfo import split_regime

    info = get_op(case.op)
    base = case.op[len("vocab_parallel_"):]
    layout, _ = parse_regime(split_regime(case.regime)[1])
    impl = binding.resolve_implementation(case.op, name)  # VariantNotProvided / OpUnavailable in the parent
    x64 = np.asarray(case.inputs["logits"], dtype=np.float64)
    v = x64.shape[-1]
    x64 = x64.reshape(-1, v)
    n = x64.shape[0]
    labels = case.inputs.get("labels")
    labels = np.asarray(labels, dtype=np.int64).reshape(-1) if labels is not None else None
    g64 = np.asarray(case.inputs.get("grad_output", np.ones(n)), dtype=np.float64).reshape(-1)
    ev = Evaluation()
    desc = K.engine_desc(binding)
    mode = "guard" if case.property == NON_DESTRUCTIVE else "value"
    where = f"{case.op}@{name} on {layout.name} ({layout.world} ranks)"
    ref = ref_grad = f_out = f_grad = None
    crashes = []
    for rank in impl.checked_ranks():
        batch = IC.rank_shape(n, rank)
        xs, gs = x64.reshape(batch + (v,)), g64.reshape(batch)
        ls = labels.reshape(batch) if labels is not None else None
        payloads = [{"engine": desc, "op": case.op, "dtype": case.dtype, "mode": mode, "impl": name,
                     "chunk_size": case.inputs.get("chunk_size"),
                     "runs": [{"layout": layout.as_dict(), "data": _vp_shard(xs, ls, gs, layout, r)}]}
                    for r in range(layout.world)]
        try:
            results = run_ranks(layout.world, K.vocab_parallel_rank, payloads, where)
        except EngineCrash as exc:
            crashes.append((rank, xs.shape, exc))
            continue
        if mode == "guard":  # the first rank the engine takes
            _messages(ev, layout, [r[0] for r in results])
            break
        expect_grad = info.differentiable and case.op not in binding.forward_only
        values, grad, odt, gdt = _vp_assemble([r[0] for r in results], layout, expect_grad, ev)
        if ref is None:
            ref = np.asarray(info.reference(x64, labels) if labels is not None else info.reference(x64), np.float64)
            f_out, f_grad = _vp_faithful(base, to_tensor(x64, case.dtype), labels, torch.from_numpy(g64))
        problem = IC.dtype_problem(f"{case.op}@{name}'s output", odt, case.dtype, impl)
        if problem and problem not in ev.problems:
            ev.problems.append(problem)
        for t, val in enumerate(values):
            if val.size != ref.size:
                ev.problems.append(problem_clause("missing output", f"value (rank {rank}) on TP rank {t}: the engine "
                                                                    f"returned {val.size} values, expected {ref.size}"))
                continue
            ev.values.append(Compared(f"value (rank {rank}) on TP rank {t} of {layout.name}", val.reshape(-1), ref,
                                      K.to_numpy(f_out.to(K._torch_dtype(odt))), odt, "token_stat"))
        if grad is not None and expect_grad:
            if ref_grad is None:
                ref_grad = (info.reference_grad(x64, labels, grad_output=g64) if labels is not None
                            else info.reference_grad(x64, grad_output=g64))
            ev.gradients.append(Compared(f"gradient (rank {rank}) w.r.t. the vocab shards of {layout.name}",
                                         grad.reshape(n, v), ref_grad, K.to_numpy(f_grad.to(K._torch_dtype(gdt))),
                                         gdt, "token_stat"))
    IC.settle_crashes(crashes, impl, ev.problems)
    ev.base_label = layout.name
    return ev


def evaluate_vocab_parallel(binding: Binding, case: Case) -> Evaluation:
    from rlconform.harness.core.opinfo import split_regime

    impl_name = split_regime(case.regime)[0]
    if impl_name is not None:
        return _evaluate_vp_implementation(binding, case, impl_name)
    info = get_op(case.op)
    base = case.op[len("vocab_parallel_"):]
    layout, data_regime = parse_regime(case.regime)
    after = data_regime == "after_entropy"
    binding.resolve(case.op)  # OpUnavailable / BindingError surface here, in the parent
    if after and "vocab_parallel_entropy" in binding.ops:
        binding.resolve("vocab_parallel_entropy")
    x64 = case.inputs["logits"]
    if isinstance(x64, LogitsGen):  # tp2_real_shapes: a few rows at real V, materialised in the case's dtype
        x64 = x64.materialise(case.dtype).to(torch.float64).numpy()
    x64 = np.asarray(x64, dtype=np.float64)
    labels = case.inputs.get("labels")
    labels = np.asarray(labels, dtype=np.int64) if labels is not None else None
    g64 = case.inputs.get("grad_output")
    g64 = np.ones(x64.shape[:-1]) if g64 is None else np.asarray(g64, dtype=np.float64)
    params = get_op(case.op).parameter_values(case.inputs)  # scalar parameters after the labels
    if x64.shape[-1] % layout.tp:
        raise ValueError(f"vocab size {x64.shape[-1]} is not padded to a multiple of tp = {layout.tp}")
    prop = case.property
    ev = Evaluation()
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
        runs = [{"layout": layout.as_dict(), "data": _vp_shard(x64, labels, g64, layout, rank, params)}]
        if len(layouts) > 1:
            runs.append({"layout": layouts[1].as_dict(),
                         "data": {"logits": x64, "grad_output": g64, "params": list(params),
                                  **({"labels": labels} if labels is not None else {})}
                         if rank == 0 else None})
        payloads.append({"engine": desc, "op": case.op, "dtype": case.dtype, "mode": mode, "runs": runs})
    results = run_ranks(world, K.vocab_parallel_rank, payloads, f"{case.op} on {layout.name} ({world} ranks)")

    if prop == NON_DESTRUCTIVE:
        _messages(ev, layout, [r[0] for r in results])
        return ev

    ref = info.reference(x64, labels, *params) if labels is not None else info.reference(x64, *params)
    x = to_tensor(x64, case.dtype)
    f_out, f_grad = _vp_faithful(base, x, labels, torch.from_numpy(g64), params)
    expect_grad = info.differentiable and case.op not in binding.forward_only
    if any(r[0] is None for r in results):
        _messages(ev, layout, [r[0] for r in results])
        return ev
    values, grad, out_dtype, grad_dtype = _vp_assemble([r[0] for r in results], layout, expect_grad, ev)
    if not expect_grad:  # the engine's contract has no gradient for this op
        grad = None
    f_out_np = K.to_numpy(f_out.to(K._torch_dtype(out_dtype)))
    ref_grad = None
    if grad is not None:
        ref_grad = (info.reference_grad(x64, labels, *params, grad_output=g64) if labels is not None
                    else info.reference_grad(x64, *params, grad_output=g64))
        f_grad_np = K.to_numpy(f_grad.to(K._torch_dtype(grad_dtype)))
    what = f"{base} read after vocab_parallel_entropy forward+backward" if after else base

    ref = np.asarray(ref, dtype=np.float64)
    for t, v in enumerate(values):
        if v.size != ref.size:
            ev.problems.append(problem_clause("missing output", f"value on TP rank {t}: the engine returned {v.size} "
                                                                f"values, expected {ref.size}"))
    if ev.problems:
        return ev
    shown = range(layout.tp) if prop == MATCHES_REFERENCE else range(1)
    for t in shown:
        label = f"value on TP rank {t} of {layout.name}" + (f" ({what})" if after else "")
        ev.values.append(Compared(label, values[t].reshape(ref.shape), ref, f_out_np, out_dtype, "token_stat"))
    if grad is not None:
        ev.gradients.append(Compared(f"gradient w.r.t. the vocab shards of {layout.name} (concatenated)", grad,
                                     ref_grad, f_grad_np, grad_dtype, "token_stat"))
    ev.base_label = layout.name
    if prop == PARTITION_INVARIANT:
        unsharded = results[0][1]
        alt = [Compared("value, unsharded (TP = 1)", unsharded["out"].reshape(ref.shape), ref, f_out_np, out_dtype,
                        "token_stat")]
        if grad is not None:
            if unsharded["grad"] is None:
                ev.problems.append(problem_clause("missing gradient", "gradient: the unsharded (TP = 1) run produced no gradient"))
            else:
                alt.append(Compared("gradient, unsharded (TP = 1)", unsharded["grad"], ref_grad, f_grad_np,
                                    grad_dtype, "token_stat"))
        ev.alternatives.append(("unsharded (TP = 1)", alt))
    return ev


# ------------------------------------------------------------------------------- context parallel
def evaluate_context_parallel(binding: Binding, case: Case) -> Evaluation:
    """``cp_masked_mean`` on the CP ranks of the regime's layout (Megatron's load-balanced chunks), against
    the float64 token-mean of the whole sequence; ``mask_invariant``: the same shards with every masked
    position overwritten by ``case.inputs["garbage"]`` (NaN, ±inf, ±1e30) must give the same mean. An op whose adapter declares ``rlconform_world_group``
    (verl's ``distributed_masked_mean``: it reduces over the default group, not the group it is given)
    takes part in every collective on every rank: in the unsharded run (CP = 1, rank 0 holds the whole
    sequence) the other ranks pass an empty shard ``[B, 0]`` instead of sitting the call out."""
    layout, _ = parse_regime(case.regime)
    world_group = K.uses_world_group(binding.resolve(case.op))
    if world_group and layout.dp > 1:
        raise BindingError(f"{case.op} of engine {binding.name!r} reduces over the default (world) group: a layout "
                           f"with DP > 1 ({layout.name}) would mix DP ranks into its CP mean")
    values64 = np.asarray(case.inputs["values"], dtype=np.float64)
    mask = np.asarray(case.inputs["mask"], dtype=bool)
    world = layout.world
    seq = values64.shape[1]
    prop = case.property
    ev = Evaluation()
    if prop not in (MATCHES_REFERENCE, PARTITION_INVARIANT, NON_DESTRUCTIVE, MASK_INVARIANT):
        raise ValueError(f"property {prop!r} does not apply to {case.op}")
    garbage = float(case.inputs.get("garbage", np.nan))
    desc = K.engine_desc(binding)
    shards = []
    payloads = []
    for rank in range(world):
        _, c, _ = layout.coords(rank)
        idx = zigzag_index(seq, layout.cp, c)
        shard = {"values": np.ascontiguousarray(values64[:, idx]), "mask": np.ascontiguousarray(mask[:, idx])}
        shards.append(shard)
        runs = [{"layout": layout.as_dict(), "data": shard}]
        if prop == MASK_INVARIANT:  # the same shard with every masked position overwritten by the garbage value
            runs.append({"layout": layout.as_dict(),
                         "data": {"values": np.where(shard["mask"], shard["values"], garbage), "mask": shard["mask"]}})
        if prop == PARTITION_INVARIANT:
            idle = ({"values": values64[:, :0], "mask": mask[:, :0]} if world_group else None)
            runs.append({"layout": _unsharded(world).as_dict(),
                         "data": {"values": values64, "mask": mask} if rank == 0 else idle})
        payloads.append({"engine": desc, "op": case.op, "dtype": case.dtype, "group": "cp",
                         "mode": "guard" if prop == NON_DESTRUCTIVE else "value", "runs": runs})
    results = run_ranks(world, K.token_reduction_rank, payloads, f"{case.op} on {layout.name} ({world} ranks)")
    if prop == NON_DESTRUCTIVE or any(r[0] is None for r in results):
        _messages(ev, layout, [r[0] for r in results])
        return ev
    ref = np.float64(get_op(case.op).reference(values64, mask))
    if np.isnan(ref):
        ev.undefined = "no unmasked token: the mean is undefined"
        return ev
    out_dtype = results[0][0]["out_dtype"]
    faithful = K.to_numpy(F.masked_mean(to_tensor(values64, case.dtype), torch.from_numpy(mask))
                          .to(K._torch_dtype(out_dtype)))
    shown = range(world) if prop == MATCHES_REFERENCE else range(1)
    for rank in shown:
        _, c, _ = layout.coords(rank)
        nnz = int(shards[rank]["mask"].sum())
        ev.values.append(Compared(f"{layout.name}: CP rank {c} (global rank {rank}, {nnz} of {int(mask.sum())} "
                                  f"tokens)", _scalar(results[rank][0]["out"], ev), ref, faithful, out_dtype,
                                  "reduction"))
    if prop == PARTITION_INVARIANT:
        nnz = [int(shards[layout.rank(0, c)]["mask"].sum()) for c in range(layout.cp)]
        ev.base_label = f"{layout.name} (tokens per CP rank {nnz})"
        ev.alternatives.append(("unsharded (CP = 1)", [Compared("unsharded (CP = 1)", _scalar(results[0][1]["out"], ev),
                                                                ref, faithful, out_dtype, "reduction")]))
    if prop == MASK_INVARIANT:
        label = f"masked positions set to {garbage!r}"
        ev.base_label = layout.name
        ev.alternatives.append((label, [Compared(label, _scalar(results[0][1]["out"], ev), ref,
                                                 faithful, out_dtype, "reduction")]))
    return ev


# ------------------------------------------------------------------------------------ DP metrics
def evaluate_dp_metric(binding: Binding, case: Case) -> Evaluation:
    layout, _ = parse_regime(case.regime)
    binding.resolve(case.op)
    values64 = np.asarray(case.inputs["values"], dtype=np.float64)
    mask = np.asarray(case.inputs["mask"], dtype=bool)
    partitions = case.inputs["partitions"]
    world = layout.world
    prop = case.property
    ev = Evaluation()
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
    if any(r[0] is None for r in results):
        _messages(ev, layout, [r[0] for r in results])
        return ev
    ref = np.float64(get_op(case.op).reference(values64, mask))
    if np.isnan(ref):
        ev.undefined = "no unmasked token: the mean is undefined"
        return ev
    out_dtype = results[0][0]["out_dtype"]
    faithful = K.to_numpy(F.masked_mean(to_tensor(values64, case.dtype), torch.from_numpy(mask))
                          .to(K._torch_dtype(out_dtype)))

    def nnz(split):
        return [int(mask[a:b].sum()) for a, b in split]

    shown = range(world) if prop == MATCHES_REFERENCE else range(1)
    for rank in shown:
        ev.values.append(Compared(f"{layout.name}: DP rank {rank}, tokens per DP rank {nnz(splits[0])}",
                                  _scalar(results[rank][0]["out"], ev), ref, faithful, out_dtype, "pipeline",
                                  quantity="metric", layout=_dp_layout(nnz(splits[0]))))
    if prop == PARTITION_INVARIANT:
        ev.base_label = f"tokens per DP rank {nnz(splits[0])}"
        for i in range(1, len(splits)):
            label = f"tokens per DP rank {nnz(splits[i])}"
            ev.alternatives.append((label, [Compared(label, _scalar(results[0][i]["out"], ev), ref, faithful,
                                                     out_dtype, "pipeline", quantity="metric",
                                                     layout=_dp_layout(nnz(splits[i])))]))
        ev.alternatives.append(("unsharded (DP = 1)", [Compared("unsharded (DP = 1)",
                                                                _scalar(results[0][len(splits)]["out"], ev), ref,
                                                                faithful, out_dtype, "pipeline", quantity="metric")]))
    return ev


# ---------------------------------------------------------------------------------- DP whitening
def evaluate_dp_whiten(binding: Binding, case: Case) -> Evaluation:
    """``dp_masked_whiten`` on the DP ranks of the regime's layout: each rank whitens the rows of its
    split; the ranks' rows, in order, are compared with ``masked_whiten`` of the whole batch (float64
    reference, fp32 two-pass faithful path) at unmasked positions. ``partition_invariant``: a second
    split of the rows and the unsharded run (DP = 1, rank 0 holds every row); ``mask_invariant``: the
    same split with every masked position overwritten by ``case.inputs["garbage"]``;
    ``non_destructive``: every rank's values and mask bit-identical after the call."""
    from rlconform.harness.families.advantages import faithful_masked_whiten
    from rlconform.reference import masked_whiten

    layout, _ = parse_regime(case.regime)
    binding.resolve(case.op)
    values64 = np.asarray(case.inputs["values"], dtype=np.float64)
    mask = np.asarray(case.inputs["mask"], dtype=bool)
    shift_mean = bool(case.inputs["shift_mean"])
    partitions = case.inputs["partitions"]
    world = layout.world
    prop = case.property
    ev = Evaluation()
    if prop not in get_op(case.op).properties:
        raise ValueError(f"property {prop!r} does not apply to {case.op}")
    garbage = float(case.inputs.get("garbage", np.nan))
    dirty = np.where(mask, values64, garbage)
    # (label, values, split) of each run every rank takes part in
    runs = [("split", values64, partitions[0])]
    if prop == PARTITION_INVARIANT:
        runs.append(("second split", values64, partitions[1]))
    if prop == MASK_INVARIANT:
        runs.append((f"masked positions set to {garbage!r}", dirty, partitions[0]))
    desc = K.engine_desc(binding)
    payloads = []
    for rank in range(world):
        _, _, d = layout.coords(rank)
        rank_runs = [{"layout": layout.as_dict(), "group": "dp",
                      "data": {"values": vals[split[d][0]:split[d][1]], "mask": mask[split[d][0]:split[d][1]]}}
                     for _, vals, split in runs]
        if prop == PARTITION_INVARIANT:
            rank_runs.append({"layout": _unsharded(world).as_dict(), "group": "tp",
                              "data": {"values": values64, "mask": mask} if rank == 0 else None})
        payloads.append({"engine": desc, "op": case.op, "dtype": case.dtype, "group": "dp",
                         "mode": "guard" if prop == NON_DESTRUCTIVE else "value", "runs": rank_runs,
                         "args": [shift_mean]})
    results = run_ranks(world, K.token_reduction_rank, payloads, f"{case.op} on {layout.name} ({world} ranks)")
    if prop == NON_DESTRUCTIVE or any(r[0] is None for r in results):
        _messages(ev, layout, [r[0] for r in results])
        return ev
    ref = masked_whiten(values64, mask, shift_mean)
    faithful = K.to_numpy(faithful_masked_whiten(to_tensor(values64, case.dtype), torch.from_numpy(mask), shift_mean))

    def nnz(split):
        return [int(mask[a:b].sum()) for a, b in split]

    def assembled(i: int, split, label: str) -> list:
        """Run ``i``'s outputs of every DP rank, rows in order, as one Compared (the splits differ, so
        partitions compare whole batches)."""
        parts = []
        for d, (a, b) in enumerate(split):
            res = results[layout.rank(0, 0, d)][i]
            got = np.asarray(res["out"], dtype=np.float64)
            if got.shape != values64[a:b].shape:
                ev.problems.append(problem_clause("missing output", f"{label}: DP rank {d} returned shape {got.shape} "
                                                                    f"for its rows {a}:{b}, expected "
                                                                    f"{values64[a:b].shape}"))
                return []
            parts.append(got)
        name = f"{label} (rows per DP rank {', '.join(f'{a}:{b}' for a, b in split)}; tokens {nnz(split)})"
        return [Compared(name, np.concatenate(parts), ref, faithful, results[0][i]["out_dtype"], "advantage",
                         only_where=mask)]

    ev.values = assembled(0, partitions[0], layout.name)
    if prop == PARTITION_INVARIANT:
        ev.base_label = f"tokens per DP rank {nnz(partitions[0])}"
        ev.alternatives.append(("second split", assembled(1, partitions[1], "second split")))
        res = results[0][2]
        got = np.asarray(res["out"], dtype=np.float64)
        if got.shape != values64.shape:
            ev.problems.append(problem_clause("missing output", f"unsharded (DP = 1): the engine returned shape {got.shape}, expected {values64.shape}"))
        else:
            ev.alternatives.append(("unsharded (DP = 1)", [Compared("unsharded (DP = 1)", got, ref, faithful,
                                                                    res["out_dtype"], "advantage", only_where=mask)]))
    if prop == MASK_INVARIANT:
        ev.alternatives.append((runs[1][0], assembled(1, partitions[0], runs[1][0])))
    return ev


def _dp_layout(tokens) -> dict | None:
    """The layout record of a run split over DP ranks (:mod:`rlconform.harness.core.failure`): tokens per rank."""
    try:
        return {"parts": "DP ranks", "nnz": [int(n) for n in tokens]}
    except (TypeError, ValueError):
        return None


def _scalar(out, ev: Evaluation) -> np.ndarray:
    a = np.asarray(out, dtype=np.float64)
    if a.size != 1:
        ev.problems.append(problem_clause("missing output", f"the engine returned shape {a.shape}, expected a scalar"))
        return np.float64(np.nan)
    return a.reshape(())


#: distributed kind -> evaluate(binding, case) -> Evaluation
EVALUATORS = {
    "vocab_parallel": evaluate_vocab_parallel,
    "context_parallel": evaluate_context_parallel,
    "dp_metric": evaluate_dp_metric,
    "dp_whiten": evaluate_dp_whiten,
}


def run_check(binding: Binding, case: Case) -> Outcome:
    """Check a distributed ``case`` against ``binding`` on gloo ranks (or this torchrun job): the
    Evaluation assembled from every rank is judged by the generic property. With a referee connected
    (:mod:`rlconform.properties.referee`) the op is resolved here (OpUnavailable and
    BindingError surface in the engine's worker, as without one), then the evaluation and the verdict are
    the referee's (:func:`run_check_here` there), the pool round trips the engine calls made here
    (:func:`run_ranks`); otherwise everything runs on this process."""
    from rlconform.properties import referee

    info = _applies(case)
    if referee.connected():
        binding.resolve(case.op)
        if info.kind == "vocab_parallel" and case.regime.endswith("after_entropy") and \
                "vocab_parallel_entropy" in binding.ops:
            binding.resolve("vocab_parallel_entropy")
        return referee.refereed_check(binding, case)
    return run_check_here(binding, case)


def run_check_here(binding: Binding, case: Case) -> Outcome:
    """:func:`run_check` on this process (the evaluation and the judgment both; the referee's side)."""
    info = _applies(case)
    return JUDGES[case.property](EVALUATORS[info.kind](binding, case))


def _applies(case: Case):
    """The op's catalog entry; BindingError when the property does not apply or the op is not distributed."""
    info = get_op(case.op)
    if case.property not in info.properties:
        raise BindingError(f"property {case.property!r} does not apply to op {case.op!r}")
    if info.kind not in EVALUATORS:
        raise BindingError(f"op {case.op!r} is not a distributed op")
    return info
