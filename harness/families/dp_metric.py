"""``dp_metric_all_reduce``: a per-token metric (entropy, clip fraction) as a trainer logs it over DP ranks
(checked by :mod:`rlconform.distributed_tests`).

Per-rank signature: ``(local_values [b, T], local_mask [b, T], group) -> number / 0-d``: each DP rank
emits from its own rows, the emitted values are reduced over the DP group; the result must be the
token-weighted mean over all DP ranks (“mean of per-shard means” / “mean of ratios across DP ranks”; SkyRL issue #1822: SkyRL all_reduce_metrics).
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from rlconform.harness.core import strategies as S
from rlconform.harness.core.layout import parse_regime
from rlconform.harness.core.opinfo import MATCHES_REFERENCE, PARTITION_INVARIANT, OpInfo, reference_function
from rlconform.harness.families import OpFamily

#: rows split over DP ranks, imbalanced (0 to 10⁴ tokens per rank, fully masked ranks)
DP_METRIC_REGIMES = {
    "dp2_imbalanced": ("float32", "float64", "bfloat16"),
    "dp4_imbalanced": ("float32",),
}

OPS = (
    OpInfo("dp_metric_all_reduce", "dp_metric", 3, (MATCHES_REFERENCE, PARTITION_INVARIANT), DP_METRIC_REGIMES,
           reference_function("masked_mean"),
           source="token-weighted mean of a metric over DP ranks (SkyRL all_reduce_metrics, SkyRL issue #1822; "
                  "“mean of per-shard means” / “mean of ratios across DP ranks”)", family="dp_metric", distributed=True),
)


@st.composite
def inputs(draw, dtype: str, regime: str):
    """``{"values": [B, T], "mask": [B, T], "partitions": [[[a, b], ...] per DP rank] × 2}``: imbalanced
    rows and two different splits of them over the DP ranks (each rank ≥ 1 row, maybe fully masked)."""
    layout, _ = parse_regime(regime)
    data = draw(S.row_lengths_data(dtype))
    values, mask = data["values"], data["mask"]
    short = layout.dp - values.shape[0]
    if short > 0:
        values = np.concatenate([values, np.zeros((short, values.shape[1]))])
        mask = np.concatenate([mask, np.zeros((short, mask.shape[1]), bool)])
    n = values.shape[0]
    partitions = [[[int(a), int(b)] for a, b in draw(S.composition(n, layout.dp))] for _ in range(2)]
    return {"values": values, "mask": mask, "partitions": partitions}


def strategy(op: OpInfo, dtype: str, regime: str):
    return inputs(dtype, regime)


FAMILY = OpFamily("dp_metric", OPS, strategy, None, order=80,
                  doc="a token-level metric reduced over DP ranks on gloo")
