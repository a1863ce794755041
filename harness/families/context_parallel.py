"""``cp_masked_mean``: the token-mean of a loss over a sequence split over CP ranks (checked by
:mod:`rlconform.distributed_tests`).

Per-rank signature: ``(local_values [B, T/cp], local_mask [B, T/cp], group) -> 0-d``, with Megatron's
load-balanced layout (T in ``2·cp`` chunks, CP rank ``c`` holds chunks ``c`` and ``2·cp−1−c``); masked
sums *and* nnz must be reduced over the CP group (“CP token count not reduced”), and garbage at masked positions
(NaN, ±inf from padded log-probs) must not reach the mean. Regimes ``<layout>_<mask regime>``.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from rlconform.harness.core import strategies as S
from rlconform.harness.core.layout import parse_regime
from rlconform.harness.core.opinfo import (
    FLOAT_DTYPES,
    MASK_INVARIANT,
    MATCHES_REFERENCE,
    NON_DESTRUCTIVE,
    PARTITION_INVARIANT,
    OpInfo,
    reference_function,
)
from rlconform.harness.families import OpFamily

#: what ``mask_invariant`` writes into masked positions (as for the single-device reductions)
GARBAGE = (float("nan"), float("inf"), float("-inf"), 1e30, -1e30)

CONTEXT_PARALLEL_REGIMES = {
    "cp2_all_on": ("float32", "bfloat16", "float64"),
    "cp2_padded": FLOAT_DTYPES,
    "cp4_random": ("float32", "bfloat16"),
    "tp2cp2_padded": ("float32",),
    "cp2_multi_turn": ("float32",),  # interior observation spans split over the CP chunks
}

OPS = (
    OpInfo("cp_masked_mean", "context_parallel", 3,
           (MATCHES_REFERENCE, PARTITION_INVARIANT, NON_DESTRUCTIVE, MASK_INVARIANT),
           CONTEXT_PARALLEL_REGIMES, reference_function("masked_mean"),
           property_regimes={MASK_INVARIANT: tuple(r for r in CONTEXT_PARALLEL_REGIMES if not r.endswith("all_on"))},
           source="token-mean over a sequence split over CP: masked sums and nnz reduced over the CP group "
                  "(Megatron's load-balanced 2·cp chunks; “CP token count not reduced”)",
           family="context_parallel", distributed=True),
)


@st.composite
def inputs(draw, dtype: str, regime: str):
    """``{"values": [B, T], "mask": [B, T], "garbage": float}`` with T a multiple of 2·cp (padding masked),
    so CP ranks hold very different token counts; ``garbage`` is what ``mask_invariant`` writes into the
    masked positions."""
    layout, mask_regime = parse_regime(regime)
    b = draw(st.integers(1, 4))
    t = draw(st.sampled_from([1, 2, 3, 8, 37, 256, 2000]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    values = draw(S.values((b, t), dtype, rng))
    mask = draw(S.masks((b, t), mask_regime, rng))
    pad = (-t) % (2 * layout.cp)
    if pad:
        values = np.concatenate([values, np.zeros((b, pad))], axis=1)
        mask = np.concatenate([mask, np.zeros((b, pad), bool)], axis=1)
    return {"values": values, "mask": mask, "garbage": draw(st.sampled_from(GARBAGE))}


def strategy(op: OpInfo, dtype: str, regime: str):
    return inputs(dtype, regime)


FAMILY = OpFamily("context_parallel", OPS, strategy, None, order=70,
                  doc="token-mean over a sequence split over CP ranks (Megatron load-balanced chunks)")
