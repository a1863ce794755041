"""Hypothesis strategies for the distributed checks (built on :mod:`rlconform.properties.strategies`).

* :func:`vocab_parallel_inputs` — logits from :func:`~rlconform.properties.strategies.logits`. In the
  ``*_neg_inf_padded`` regimes V is any size (primes included) padded with ``-inf`` to a multiple of TP
  (Megatron pads V to a multiple of TP), so a TP rank may hold a shard that is all ``-inf``; the other
  regimes draw V rounded up to a multiple of TP with finite logits, so that each regime isolates one
  difficulty (an engine's NaN on ``-inf`` shows in the padded regime, not in every regime). With CP the
  tokens are flattened to ``[N, V]`` rows (at least one per CP rank) and split over the CP ranks.
* :func:`context_parallel_inputs` — a loss ``[B, T]`` and its mask (``all_on``, ``padded``, ``random``,
  ``all_off``), T padded with masked zeros to a multiple of ``2·cp`` (Megatron's load-balanced layout
  needs it), so CP ranks hold very different token counts.
* :func:`dp_metric_inputs` — imbalanced rows (0 to 10⁴ tokens, fully masked rows) and two different
  splits of the rows over the DP ranks (every rank gets at least one row, maybe fully masked).
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from rlconform.distributed_tests.layout import parse_regime
from rlconform.harness.catalog import get_op
from rlconform.properties import strategies as S

#: data regimes that are not logits regimes, and the logits regime they draw
_LOGITS_ALIASES = {"after_entropy": "moderate"}


def pad_vocab(x: np.ndarray, multiple: int) -> np.ndarray:
    """Append ``-inf`` columns so that V is a multiple of ``multiple``."""
    v = x.shape[-1]
    pad = (-v) % multiple
    if not pad:
        return x
    return np.concatenate([x, np.full(x.shape[:-1] + (pad,), -np.inf)], axis=-1)


@st.composite
def vocab_parallel_inputs(draw, op: str, dtype: str, regime: str):
    """``{"logits": [..., Vp], ["labels": [...],] "grad_output": [...], "vocab": V}`` (Vp = V padded)."""
    layout, data = parse_regime(regime)
    with_labels = op.endswith("token_logprobs")
    logits_regime = _LOGITS_ALIASES.get(data, data)
    if logits_regime == "neg_inf_padded":  # any V (primes too), padded with -inf to a multiple of TP
        sizes = S.VOCAB_SIZES
    else:  # V rounded up to a multiple of TP, all finite: the regime keeps its own difficulty only
        sizes = tuple(sorted({-(-v // layout.tp) * layout.tp for v in S.VOCAB_SIZES}))
    d = draw(S.logits(dtype, logits_regime, with_labels=with_labels, vocab_sizes=sizes))
    x, g = d["logits"], d["grad_output"]
    labels = d.get("labels")
    v = x.shape[-1]
    if layout.cp > 1:  # tokens as rows; every CP rank holds at least one
        x, g = x.reshape(-1, v), g.reshape(-1)
        labels = labels.reshape(-1) if labels is not None else None
        reps = -(-layout.cp // x.shape[0])
        if reps > 1:
            x, g = np.tile(x, (reps, 1)), np.tile(g, reps)
            labels = np.tile(labels, reps) if labels is not None else None
    out = {"logits": pad_vocab(x, layout.tp), "grad_output": g, "vocab": int(v)}
    if labels is not None:
        out["labels"] = labels
    return out


@st.composite
def context_parallel_inputs(draw, dtype: str, regime: str):
    """``{"values": [B, T], "mask": [B, T]}`` with T a multiple of 2·cp (padding masked)."""
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
    return {"values": values, "mask": mask}


@st.composite
def dp_metric_inputs(draw, dtype: str, regime: str):
    """``{"values": [B, T], "mask": [B, T], "partitions": [[[a, b], ...] per DP rank] × 2}``."""
    layout, _ = parse_regime(regime)
    data = draw(S.row_lengths_data(dtype))
    values, mask = data["values"], data["mask"]
    short = layout.dp - values.shape[0]
    if short > 0:  # one row per DP rank at least: add fully masked rows (they change no statistic)
        values = np.concatenate([values, np.zeros((short, values.shape[1]))])
        mask = np.concatenate([mask, np.zeros((short, mask.shape[1]), bool)])
    n = values.shape[0]
    partitions = [[[int(a), int(b)] for a, b in draw(S.composition(n, layout.dp))] for _ in range(2)]
    return {"values": values, "mask": mask, "partitions": partitions}


def strategy_for(op: str, dtype: str, regime: str):
    """The strategy drawing the ``inputs`` of a distributed Case."""
    kind = get_op(op).kind
    if kind == "vocab_parallel":
        return vocab_parallel_inputs(op, dtype, regime)
    if kind == "context_parallel":
        return context_parallel_inputs(dtype, regime)
    if kind == "dp_metric":
        return dp_metric_inputs(dtype, regime)
    raise ValueError(f"no distributed strategy for op kind {kind!r}")
