"""Metric pipelines: emit (per micro-batch) → reduce over micro-batches → all-reduce over DP →
reduce over mini-batches → finalize, as a trainer logs a token-level metric.

Canonical form: a :class:`~rlconform.harness.catalog.binding.MetricPipeline`. The reference is the
token-weighted mean, population std, min and max over every unmasked token of the global batch
(:func:`rlconform.reference.token_metrics`; SkyRL issue #1822 and SkyRL issue #1822: a mean of per-shard means is
exact only when shards are balanced). Partitions nest mini-batches → DP ranks → micro-batches, with
0-token and fully masked shards and imbalance up to 1:10⁴.

``real_shapes`` (``nightly`` profile only): the global batch of the reductions' real_shapes
(sequences of 32 768 or 8192 tokens, more than 2^24 unmasked tokens; a seeded
:class:`~rlconform.harness.core.generated.TokensGen`), split by nested partitions of its rows.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

import numpy as np
import torch
from hypothesis import strategies as st

import rlconform.reference as R
from rlconform.harness.core import faithful as F
from rlconform.harness.core import strategies as S
from rlconform.harness.core.evaluation import Compared, Evaluation, MetricFlow, call_engine
from rlconform.harness.core.failure import problem as problem_clause
from rlconform.harness.core.generated import TokensGen
from rlconform.harness.core.opinfo import (
    MASK_INVARIANT,
    MATCHES_REFERENCE,
    METRIC_INTEGRITY,
    PARTITION_INVARIANT,
    OpInfo,
    reference_function,
)
from rlconform.harness.core.profiles import profile_regimes
from rlconform.harness.core.tensors import as_numpy, to_tensor
from rlconform.harness.families import OpFamily
from rlconform.harness.families.agg_loss import describe_partition, equalize_micro_batches

PARTITION_REGIMES = {"imbalanced_partitions": ("float32", "float64", "bfloat16")}
REGIMES = dict(PARTITION_REGIMES, real_shapes=("float32", "bfloat16"))
GARBAGE = (np.nan, np.inf, -np.inf, 1e30)

OPS = (
    OpInfo("metric_pipeline", "metric_pipeline", None,
           (MATCHES_REFERENCE, PARTITION_INVARIANT, METRIC_INTEGRITY, MASK_INVARIANT), REGIMES,
           reference_function("token_metrics"),
           source="token-weighted statistics over all unmasked tokens (SkyRL issue #1822)", family="metric_pipeline",
           profile_regimes=profile_regimes(REGIMES)),
)


@st.composite
def inputs(draw, dtype: str):
    """``{"values", "mask", "partitions", "garbage"}``: token values of a global batch and nested partitions."""
    data = draw(S.row_lengths_data(dtype))
    data["partitions"] = draw(S.nested_partitions(data["mask"].shape[0], mini_batches=True))
    data["garbage"] = draw(st.sampled_from(GARBAGE))
    return data


@st.composite
def real_inputs(draw):
    """``{"tokens": TokensGen, "partitions", "garbage"}`` at real sizes (see the module doc)."""
    from rlconform.harness.families.reductions import real_inputs as real_tokens

    data = {"tokens": draw(real_tokens())["tokens"]}
    data["partitions"] = draw(S.nested_partitions(data["tokens"].shape[0], mini_batches=True))
    data["garbage"] = draw(st.sampled_from(GARBAGE))
    return data


def strategy(op: OpInfo, dtype: str, regime: str):
    if regime == "real_shapes":
        return real_inputs()
    return inputs(dtype)


def _accepts_info(fn: Callable) -> bool:
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return False
    return len([p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]) >= 3 or any(
        p.kind == p.VAR_POSITIONAL for p in params)


def run_metric_pipeline(mp, values: torch.Tensor, mask: torch.Tensor, partition, *, op: str = "metric_pipeline",
                        on_emit: Callable[[dict], dict] | None = None):
    """Drive the engine's MetricPipeline over a nested partition (mini-batches -> DP ranks ->
    micro-batches of row ranges). ``on_emit(d) -> d`` sees every emitted dict before the reducer does
    (metric_statistics converts value types there); ``op`` names the engine calls in crash messages.
    Returns (emitted keys, final dict)."""
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
                d = call_engine(f"{op}.emit", mp.emit, *args)
                if on_emit is not None:
                    d = on_emit(d)
                emitted.update(d)
                outs.append(d)
            ranks.append(call_engine(f"{op}.reduce_micro", mp.reduce_micro, outs))
        minis.append(call_engine(f"{op}.reduce_dp", mp.reduce_dp, ranks))
    reduce_mini = mp.reduce_mini or mp.reduce_micro
    final = call_engine(f"{op}.finalize", mp.finalize, call_engine(f"{op}.reduce_mini", reduce_mini, minis))
    return emitted, final


def faithful(values: torch.Tensor, mask: torch.Tensor) -> dict:
    """The fp32 statistics of all unmasked tokens at once (no partition)."""
    return {"mean": F.masked_mean(values, mask), "std": F.masked_std(values, mask, False),
            "min": F.masked_min(values, mask), "max": F.masked_max(values, mask)}


def _stats(mp, final: dict, ref: dict, fa: dict, dtype: str, label: str, ev: Evaluation) -> list[Compared]:
    out = []
    for stat, key in mp.stats.items():
        if key not in final:
            ev.problems.append(problem_clause("lost metric", f"{key} ({stat}) missing from the final dict {sorted(final)} ({label})",
                                              key=f"{key} ({stat})"))
            continue
        got = as_numpy(final[key])
        if got.size != 1:
            ev.problems.append(problem_clause("missing output", f"{key} ({stat}) is not a scalar: shape {got.shape} ({label})"))
            continue
        # the case's drawn values stand in for the engine's per-token quantity (a 0/1 clip indicator, a log-ratio):
        # the label says so, so that a value no real metric could take (a clip fraction of −1.4) reads as what it is
        out.append(Compared(f"{key} ({stat} over the unmasked tokens of drawn values), {label}", got.reshape(()),
                            np.float64(ref[stat]), as_numpy(fa[stat]), dtype, "pipeline", quantity="metric"))
    return out


def evaluate(binding, case) -> Evaluation:
    mp = binding.resolve("metric_pipeline")
    if isinstance(case.inputs.get("tokens"), TokensGen):  # real_shapes: materialised from its seed
        values64, mask_np = case.inputs["tokens"].materialise(case.dtype)
    else:
        values64, mask_np = case.inputs["values"], case.inputs["mask"].astype(bool)
    if case.property == MASK_INVARIANT and mask_np.all():  # garbage needs a masked position
        mask_np = mask_np.copy()
        mask_np[-1, -1] = False
    values, mask = to_tensor(values64, case.dtype), torch.from_numpy(mask_np)
    partitions = case.inputs["partitions"]
    ev = Evaluation()
    if not mp.stats:
        ev.problems.append(problem_clause("missing output", "the binding's MetricPipeline maps no statistic (stats is "
                                                            "empty): nothing is checked"))
    if case.property == METRIC_INTEGRITY:
        emitted, final = run_metric_pipeline(mp, values, mask, partitions[0])
        mapping = mp.emitted_to_final
        # a callable mapping is the binding's code: it runs where the binding does (under the referee, in
        # the engine's worker), like every other engine call
        to_final = ({k: call_engine("metric_pipeline.emitted_to_final", mapping, k) for k in sorted(emitted)}
                    if callable(mapping) else dict(mapping or {}))
        ev.metrics = MetricFlow(emitted, final, to_final)
        return ev
    ref = R.token_metrics(values64, mask_np)
    if not ref["nnz"]:
        ev.undefined = "no unmasked token in the global batch: the statistics are undefined"
        return ev
    clean = to_tensor(np.where(mask_np, values64, 0.0), case.dtype)
    fa = faithful(clean, mask)
    label = lambda p: f"shards (nnz) {describe_partition(p, mask_np)}"  # noqa: E731
    final = run_metric_pipeline(mp, values, mask, partitions[0])[1]
    ev.values = _stats(mp, final, ref, fa, case.dtype, label(partitions[0]), ev)
    ev.base_label = label(partitions[0])
    if case.property == PARTITION_INVARIANT:
        for p in partitions[1:]:
            final = run_metric_pipeline(mp, values, mask, p)[1]
            ev.alternatives.append((label(p), _stats(mp, final, ref, fa, case.dtype, label(p), ev)))
    elif case.property == MASK_INVARIANT:
        garbage = float(case.inputs.get("garbage", np.nan))
        dirty = to_tensor(np.where(mask_np, values64, garbage), case.dtype)
        final = run_metric_pipeline(mp, dirty, mask, partitions[0])[1]
        ev.alternatives.append((f"masked positions set to {garbage!r}",
                                _stats(mp, final, ref, fa, case.dtype, f"masked = {garbage!r}", ev)))
    return ev


def is_number(x: Any) -> bool:
    """A Python or NumPy real scalar (loggers accept both); not a tensor, not a bool, not an array."""
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, (bool, np.bool_))


FAMILY = OpFamily("metric_pipeline", OPS, strategy, evaluate, order=40,
                  doc="emit -> reduce micro-batches -> all-reduce DP -> finalize, as a trainer logs a metric")
