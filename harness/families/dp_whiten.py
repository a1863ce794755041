"""``dp_masked_whiten``: advantage whitening whose statistics are global over the DP group, on real gloo
DP ranks (checked by :mod:`rlconform.distributed_tests`, evaluator ``evaluate_dp_whiten``).

Per-rank signature: ``(local_values [b, T], local_mask [b, T], group, shift_mean: bool) -> [b, T]``: each
DP rank holds some rows of the batch (imbalanced, maybe fully masked); the mean and the unbiased
variance are those of every unmasked entry over all DP ranks, so each rank's output must equal the rows
it holds of ``masked_whiten`` over the whole batch (:func:`rlconform.reference.masked_whiten`; the
float64 reference merges the ranks' exact moments, so every split gives the same answer). Masked output
positions are not compared (the engines leave ``(x − μ)·rsqrt(σ² + ε)`` there; the reference 0).

Faults this finds: whitening with each rank's *local* statistics (exact only when every rank's rows
have the same mean and variance: the mean-of-per-shard-means bug of SkyRL issue #1822
applied to advantages), a one-pass fp32 variance E[x²] − μ² merged over ranks (cancels for rewards
offset by 10⁴), counts not reduced, garbage at masked positions leaking into the global sums.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from rlconform.harness.core import strategies as S
from rlconform.harness.core.layout import parse_regime
from rlconform.harness.core.opinfo import (
    MASK_INVARIANT,
    MATCHES_REFERENCE,
    NON_DESTRUCTIVE,
    PARTITION_INVARIANT,
    OpInfo,
    reference_function,
)
from rlconform.harness.families import OpFamily

#: rows split over DP ranks, imbalanced; ``offset``: values around 10⁴ with spread 10⁻³…30 (E[x²] − μ²
#: cancels in fp32)
DP_WHITEN_REGIMES = {
    "dp2_imbalanced": ("float32", "float64", "bfloat16"),
    "dp4_imbalanced": ("float32",),
    "dp2_offset": ("float32",),
}

#: what a masked position holds in the mask_invariant property
GARBAGE = (float("nan"), float("inf"), float("-inf"), 1e30, -1e30)

OPS = (
    OpInfo("dp_masked_whiten", "dp_whiten", 4,
           (MATCHES_REFERENCE, PARTITION_INVARIANT, MASK_INVARIANT, NON_DESTRUCTIVE), DP_WHITEN_REGIMES,
           reference_function("masked_whiten"),
           source="verl/SkyRL masked_whiten with statistics global over DP: (x − μ)·rsqrt(σ² + 1e-8), "
                  "unbiased σ² over every unmasked entry of every DP rank", family="dp_whiten", distributed=True),
)


@st.composite
def inputs(draw, dtype: str, regime: str):
    """``{"values": [B, T], "mask": [B, T], "shift_mean": bool, "partitions": [[[a, b], ...] per DP rank] × 2,
    "garbage": float}``: B ≥ the DP size rows, two different contiguous splits of them over the DP ranks
    (each rank ≥ 1 row, maybe fully masked; right-padded, or in half the examples multi-turn rows: interior
    observation spans), values exactly representable in ``dtype``."""
    layout, data = parse_regime(regime)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    b = draw(st.integers(layout.dp, layout.dp + 5))
    t = draw(st.sampled_from([1, 4, 16, 64]))
    mask = draw(S.masks((b, t), "padded", rng))
    if draw(st.booleans()):  # a fully masked row (a rank may hold nothing valid)
        mask[rng.integers(0, b)] = False
    if not mask.any():
        mask[rng.integers(0, b), 0] = True
    offset = 1e4 if data == "offset" else 0.0
    values = offset + rng.standard_normal((b, t)) * draw(st.sampled_from([1e-3, 1.0, 30.0]))
    partitions = [[[int(a), int(c)] for a, c in draw(S.composition(b, layout.dp))] for _ in range(2)]
    out = {"values": S.round_to(values, dtype), "mask": mask, "shift_mean": draw(st.booleans()),
           "partitions": partitions, "garbage": draw(st.sampled_from(GARBAGE))}
    if draw(st.booleans()):  # multi-turn rows, drawn last: the other examples are unchanged
        mt = S.multi_turn_mask(rng, b, t)
        if mt.any():
            out["mask"] = mt
    return out


def strategy(op: OpInfo, dtype: str, regime: str):
    return inputs(dtype, regime)


FAMILY = OpFamily("dp_whiten", OPS, strategy, None, order=81,
                  doc="advantage whitening with statistics global over DP ranks, on gloo")
