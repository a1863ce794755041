"""Metric statistics: every statistic a trainer logs of one per-token quantity, in every value type a
trainer emits, through the engine's metric reducer.

Op ``metric_statistics``, bound as a :class:`~rlconform.harness.catalog.binding.MetricPipeline` (one optimizer
step: DP ranks -> micro-batches of row ranges, one mini-batch). ``stats`` maps each statistic of
:data:`STATISTICS` to the final key carrying it:

* token statistics over the unmasked tokens: ``mean``, ``min``, ``max``, ``sum``, ``count``;
* per-sequence statistics of the sequence lengths (row b's number of unmasked tokens): ``len_mean``,
  ``len_min``, ``len_max``, ``n_seq``.

Reference: :func:`rlconform.reference.metric_statistics` (float64; the integer statistics exact). The
per-token quantity is non-negative (an entropy, a \\|Δ log π\\|, a ratio): a min that reads masked positions
as 0 is visibly wrong. Regimes: the value type each logged number reaches the reducer as (``wrap``: see
:class:`MetricPipeline`) — ``python_values`` (Python float / int as emitted), ``tensor_values`` (0-d
tensors: float64 for float64 inputs, else float32; int64 for integers), ``numpy_values`` (NumPy scalars,
same widths) — and ``large_counts``: more than 2²⁴ = 16 777 216 unmasked tokens in one step (float32 holds
integers exactly only up to 2²⁴), built from row-constant values (a stride-0 view: no 2²⁴-element value
array) and a bool mask; its reference uses the run-length form (one entry per row, multiplicity = length),
and its faithful value is the reference rounded to the value dtype (a second pass over 2²⁴ tokens would
double the cost of the regime).
Integer statistics and ``len_mean`` are compared as float64 whatever the token dtype (a count does not
depend on the dtype of the values); ``len_mean``, a logged float number, is resolved in float32 (its bound
is never below half a float32 ulp: :data:`RESOLUTION`).
"""

from __future__ import annotations

import contextlib
import io
import math

import numpy as np
import torch
from hypothesis import strategies as st

import rlconform.reference as R
from rlconform.harness.core import faithful as F
from rlconform.harness.core import strategies as S
from rlconform.harness.core.evaluation import Compared, Evaluation, MetricFlow, call_engine, logged_number
from rlconform.harness.core.failure import problem as problem_clause
from rlconform.harness.core.opinfo import (
    MASK_INVARIANT,
    MATCHES_REFERENCE,
    METRIC_INTEGRITY,
    PARTITION_INVARIANT,
    OpInfo,
    reference_function,
)
from rlconform.harness.core.profiles import ExampleCap
from rlconform.harness.core.tensors import as_numpy, to_tensor
from rlconform.harness.families import OpFamily
from rlconform.harness.families.agg_loss import describe_partition
from rlconform.harness.families.metric_pipeline import GARBAGE, run_metric_pipeline

#: the statistics every binding of the op maps (reference.metric_statistics' keys)
STATISTICS = ("mean", "min", "max", "sum", "count", "len_mean", "len_min", "len_max", "n_seq")
#: statistics compared as float64 whatever the token dtype (integers, and the mean of integers)
COUNT_STATISTICS = tuple(R.INTEGER_STATISTICS) + ("len_mean",)
#: statistic -> the dtype its value is resolved in when coarser than the compared dtype: a
#: logged mean length is a float32 number (verl: ``response_mask.sum(-1).float()``, metric_utils.py:87, then
#: ``torch.mean``); the integer statistics stay exact
RESOLUTION = {"len_mean": "float32"}
#: regime -> value type each logged number reaches the reducer as
VALUE_TYPES = {"python_values": "python", "tensor_values": "tensor", "numpy_values": "numpy",
               "large_counts": "python"}
LARGE = "large_counts"
SMALL_REGIMES = ("python_values", "tensor_values", "numpy_values")
#: tokens in a large_counts step: just above 2²⁴
LARGE_TOKENS = 2**24
#: examples (and shrinking steps) per large_counts finding: one example costs about a second (2²⁴ tokens)
LARGE_EXAMPLES = 3

OPS = (
    OpInfo("metric_statistics", "metric_pipeline", None,
           (MATCHES_REFERENCE, PARTITION_INVARIANT, METRIC_INTEGRITY, MASK_INVARIANT),
           {"python_values": ("float32", "float64", "bfloat16"), "tensor_values": ("float32", "float64"),
            "numpy_values": ("float32", "float64"), LARGE: ("float32",)},
           reference_function("metric_statistics"),
           source="mean / min / max / sum / count and per-sequence length statistics of one step, as the "
                  "engine's reducer folds them (verl Metric / reduce_metrics, SkyRL reduce_metrics / "
                  "all_reduce_metrics)", family="metric_statistics",
           property_regimes={PARTITION_INVARIANT: SMALL_REGIMES, MASK_INVARIANT: SMALL_REGIMES,
                             METRIC_INTEGRITY: SMALL_REGIMES},
           example_caps={LARGE: ExampleCap(LARGE_EXAMPLES, LARGE_EXAMPLES)}, probe_metric_keys=True),
)


@st.composite
def small_inputs(draw, dtype: str):
    """``{"values" ≥ 0, "mask", "partitions", "garbage"}``: one step's rows, three DP × micro-batch splits."""
    data = draw(S.row_lengths_data(dtype))
    data["values"] = np.abs(data["values"])
    data["partitions"] = [[p] for p in draw(S.nested_partitions(data["mask"].shape[0], mini_batches=False))]
    data["garbage"] = draw(st.sampled_from(GARBAGE))
    return data


@st.composite
def large_inputs(draw, dtype: str):
    """Row-constant values ``[B]`` ≥ 0, row lengths summing to an odd number above 2²⁴, maybe one empty row."""
    b = draw(st.integers(2, 6))
    t_big = -(-LARGE_TOKENS // b) + 2048
    lengths = [t_big - draw(st.integers(0, 1024)) for _ in range(b)]
    if sum(lengths) % 2 == 0:  # an odd count above 2²⁴ is not a float32 number: carrying it in float32 shows
        lengths[-1] -= 1
    if draw(st.booleans()):
        lengths.insert(draw(st.integers(0, b)), 0)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    row_values = np.abs(draw(S.values((len(lengths), 1), dtype, rng)))[:, 0]
    ranks = draw(S.nested_partition(len(lengths), mini_batches=False))
    partition = [[[[int(a), int(c)] for a, c in rank] for rank in ranks]]  # one mini-batch
    return {"row_values": row_values, "lengths": lengths, "t_big": t_big, "partitions": [partition]}


def strategy(op: OpInfo, dtype: str, regime: str):
    return large_inputs(dtype) if regime == LARGE else small_inputs(dtype)


def large_tensors(inputs: dict, dtype: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``values [B, T]`` as a stride-0 view of the row constants, ``mask [B, T]`` bool (right-padded)."""
    base = to_tensor(np.asarray(inputs["row_values"], np.float64), dtype).contiguous()
    b, t = base.shape[0], int(inputs["t_big"])
    values = base.as_strided((b, t), (1, 0))
    mask = torch.arange(t)[None, :] < torch.tensor(inputs["lengths"])[:, None]
    return values, mask


def as_value_type(x, vtype: str, dtype: str):
    """One logged number as ``vtype``: floats keep float64 width for float64 inputs, float32 otherwise;
    integers are int64 (bools and anything not a real number are passed through unchanged)."""
    if vtype == "python" or isinstance(x, (bool, np.bool_)):
        return x
    if isinstance(x, torch.Tensor) and x.numel() == 1:
        x = x.item()
    elif isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, int):
        return torch.tensor(x, dtype=torch.int64) if vtype == "tensor" else np.int64(x)
    if isinstance(x, float):
        wide = dtype == "float64"
        if vtype == "tensor":
            return torch.tensor(x, dtype=torch.float64 if wide else torch.float32)
        return np.float64(x) if wide else np.float32(x)
    return x


def run_statistics(mp, values: torch.Tensor, mask: torch.Tensor, partition, vtype: str, dtype: str):
    """Drive ``mp`` over one step (``partition``: [mini-batch][DP rank][micro-batch (a, b)]) with
    :func:`~rlconform.harness.families.metric_pipeline.run_metric_pipeline`; each emitted number becomes
    ``vtype`` and is wrapped by ``mp.wrap`` before the reducer sees it. Returns (emitted values: key ->
    first value handed to the reducer, final dict, printed text)."""
    emitted: dict = {}

    def convert(d) -> dict:
        d = dict(d)
        for k in list(d):
            d[k] = as_value_type(d[k], vtype, dtype)
            emitted.setdefault(k, d[k])
            if mp.wrap is not None:
                d[k] = call_engine("metric_statistics.wrap", mp.wrap, k, d[k])
        return d

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        _, final = run_metric_pipeline(mp, values, mask, partition, op="metric_statistics", on_emit=convert)
    return emitted, final, out.getvalue() + err.getvalue()


def faithful(values: torch.Tensor, mask: torch.Tensor) -> dict:
    """The token statistics in the value dtype over all unmasked tokens at once (masked positions = 0)."""
    return {"mean": F.masked_mean(values, mask), "min": F.masked_min(values, mask),
            "max": F.masked_max(values, mask), "sum": F.masked_sum(values, mask)}


def _stats(mp, final: dict, ref: dict, fa: dict, dtype: str, label: str, ev: Evaluation) -> list[Compared]:
    out = []
    for stat in STATISTICS:
        key = mp.stats.get(stat)
        if key is None:
            continue  # reported once as a problem by evaluate
        r = ref[stat]
        if isinstance(r, float) and math.isnan(r):
            continue  # no unmasked token: mean / min / max undefined
        got = logged_number(final, key, f"{key} ({stat})", "the final dict", label, ev.problems)
        if got is None:
            continue
        exact = stat in COUNT_STATISTICS
        out.append(Compared(f"{key} ({stat}), {label}", got.reshape(()), np.float64(r),
                            None if exact else as_numpy(fa[stat]), "float64" if exact else dtype, "pipeline",
                            resolution=RESOLUTION.get(stat), quantity="metric"))
    return out


def evaluate(binding, case) -> Evaluation:
    mp = binding.resolve("metric_statistics")
    vtype = VALUE_TYPES[case.regime]
    partitions = case.inputs["partitions"]
    ev = Evaluation()
    missing = [s for s in STATISTICS if s not in mp.stats]
    if missing:
        ev.problems.append(problem_clause("missing output", f"the binding's MetricPipeline maps no final key for "
                                          f"statistic(s) {missing}: every statistic the reducer handles is checked"))
    if case.regime == LARGE:
        values, mask = large_tensors(case.inputs, case.dtype)
        lengths = np.asarray(case.inputs["lengths"])
        ref = R.metric_statistics(np.asarray(values[:, :1], np.float64), (lengths > 0)[:, None],
                                  lengths[:, None])
        mask_np = None
    else:
        values64, mask_np = case.inputs["values"], case.inputs["mask"].astype(bool)
        if case.property == MASK_INVARIANT and mask_np.all():  # garbage needs a masked position
            mask_np = mask_np.copy()
            mask_np[-1, -1] = False
        values, mask = to_tensor(values64, case.dtype), torch.from_numpy(mask_np)
        ref = R.metric_statistics(values64, mask_np)
    if case.property == METRIC_INTEGRITY:
        emitted, final, printed = run_statistics(mp, values, mask, partitions[0], vtype, case.dtype)
        integral = frozenset(mp.stats[s] for s in R.INTEGER_STATISTICS if s in mp.stats)
        ev.metrics = MetricFlow(set(emitted), final, dict(mp.emitted_to_final or {}), emitted, integral, printed)
        return ev
    if mask_np is None:  # large_counts: the reference rounded to the value dtype (no second 2²⁴-token pass)
        fa = {k: to_tensor(np.float64(ref[k]), case.dtype) for k in ("mean", "min", "max", "sum")}
    else:
        fa = faithful(to_tensor(np.where(mask_np, values64, 0.0), case.dtype), mask)
    if mask_np is None:
        label = lambda p: f"shards (rows) {p}, {ref['count']} tokens"  # noqa: E731
    else:
        label = lambda p: f"shards (nnz) {describe_partition(p, mask_np)}"  # noqa: E731
    final = run_statistics(mp, values, mask, partitions[0], vtype, case.dtype)[1]
    ev.values = _stats(mp, final, ref, fa, case.dtype, label(partitions[0]), ev)
    ev.base_label = label(partitions[0])
    if case.property == PARTITION_INVARIANT:
        for p in partitions[1:]:
            final = run_statistics(mp, values, mask, p, vtype, case.dtype)[1]
            ev.alternatives.append((label(p), _stats(mp, final, ref, fa, case.dtype, label(p), ev)))
    elif case.property == MASK_INVARIANT:
        garbage = float(case.inputs.get("garbage", np.nan))
        dirty = to_tensor(np.where(mask_np, values64, garbage), case.dtype)
        final = run_statistics(mp, dirty, mask, partitions[0], vtype, case.dtype)[1]
        ev.alternatives.append((f"masked positions set to {garbage!r}",
                                _stats(mp, final, ref, fa, case.dtype, f"masked = {garbage!r}", ev)))
    if not ev.values and not ev.problems:
        ev.undefined = "no statistic to compare"
    return ev


FAMILY = OpFamily("metric_statistics", OPS, strategy, evaluate, order=41,
                  doc="mean / min / max / sum / count / per-sequence statistics in every value type, via the reducer")
