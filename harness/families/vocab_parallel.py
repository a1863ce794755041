"""Vocab-parallel token statistics on TP ranks: ``vocab_parallel_token_logprobs``,
``vocab_parallel_entropy``, ``vocab_parallel_sum_pi_squared`` (checked by :mod:`rlconform.distributed_tests`).

Per-rank signature: ``(local_logits [..., V/tp], [labels int64 [...], [label_smoothing: float,]] group) -> [...]``
(``vocab_parallel_smoothed_token_logprobs`` takes the label smoothing α after the labels). TP rank ``t``
holds the contiguous vocab shard ``[t·V/tp, (t+1)·V/tp)``; V is padded with ``-inf`` to a multiple of tp
(Megatron pads V to a multiple of TP); every rank returns the full-vocab statistic; gradients are w.r.t.
the local shard (the loss is replicated on the TP ranks, Megatron's convention).

Regimes are ``<layout>_<logits regime>`` (layouts tp2, tp4, tp2cp2); ``tp{2,4}_after_entropy`` (Σπ²
only) reads Σπ² after a vocab-parallel entropy forward + backward on the same logits (verl PR #6153).
``tp2_real_shapes`` (``nightly`` profile only): the vocab shards of V = 151 936 / 128 256
under TP = 2 (75 968 / 64 128 entries a rank), T ≤ 8 rows, bf16 and fp32, logits described by a seed
(:class:`~rlconform.harness.core.generated.LogitsGen`, materialised when the case runs). Only TP = 2 and a few
rows: every case ships the float64 shards to gloo ranks over pickled pipes and the 2-core CI machine runs
both ranks; the shard size (what a per-rank fp32 accumulation over V/tp sees) is the real one, and
TP = 4 shards (37 984 / 32 064) lie between TP = 2's and the CI regimes' sizes.

Alternative implementations: ``vocab_parallel_entropy`` ``chunked`` (tokens in chunks
of ``chunk_size``; verl ``vocab_parallel_entropy_with_chunking``; rows drawn around chunk boundaries) and
``vocab_parallel_token_logprobs`` ``fused`` (Megatron-core ``fused_vocab_parallel_cross_entropy``) under
``impl@<layout>_<data>`` for the TP-only layouts, every input rank its binding declares, its declared
output dtype; ``matches_reference`` and ``non_destructive`` (the TP-partition invariance is
the default implementation's finding).
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from rlconform.harness.core import impl_contract as IC
from rlconform.harness.core import strategies as S
from rlconform.harness.core.layout import parse_regime
from rlconform.harness.core.opinfo import (
    FLOAT_DTYPES,
    MATCHES_REFERENCE,
    NON_DESTRUCTIVE,
    PARTITION_INVARIANT,
    OpInfo,
    implementation_regimes,
    reference_function,
    split_regime,
)
from rlconform.harness.core.profiles import profile_regimes
from rlconform.harness.families import OpFamily
from rlconform.harness.families.token_stats import LABEL_SMOOTHING

VOCAB_PARALLEL_REGIMES = {
    "tp2_moderate": FLOAT_DTYPES,
    "tp4_moderate": ("float32", "bfloat16"),
    "tp2_peaked": ("float32", "bfloat16"),
    "tp2_near_uniform_offset": ("float32", "float64"),
    "tp2_neg_inf_padded": FLOAT_DTYPES,
    "tp4_neg_inf_padded": ("float32", "bfloat16"),
    "tp2_fp16_extreme": ("float16",),
    "tp2cp2_moderate": ("float32",),
    "tp2_real_shapes": ("float32", "bfloat16"),
}
#: rows of a tp2_real_shapes case (the first is the first, derandomized, example's)
REAL_ROWS = (8, 2)
#: the label-smoothed log-probs: smoothing runs over every vocab entry, so no ``-inf``-padded vocab
SMOOTHED_REGIMES = {k: v for k, v in VOCAB_PARALLEL_REGIMES.items() if "neg_inf_padded" not in k}
#: Σπ² only: the value read after a vocab-parallel entropy forward + backward (verl PR #6153, “Σπ² read after a destructive op”).
ORDER_REGIMES = {"tp2_after_entropy": FLOAT_DTYPES, "tp4_after_entropy": ("float32",)}
#: data regimes that are not logits regimes, and the logits regime they draw
_LOGITS_ALIASES = {"after_entropy": "moderate"}


#: alternative implementations per op: name -> what it is
IMPLEMENTATIONS = {
    "vocab_parallel_entropy": {"chunked": "tokens in chunks of chunk_size through the same vocab-parallel entropy, "
                                          "written into an output buffer (verl vocab_parallel_entropy_with_chunking)"},
    "vocab_parallel_token_logprobs": {"fused": "the vocab-parallel cross-entropy with jit-fused steps (Megatron-core "
                                               "fused_vocab_parallel_cross_entropy)"},
}
#: the implementations that take a chunk size (their cases are drawn around chunk boundaries)
CHUNKED = ("chunked",)
#: chunk sizes of the chunked implementations: small ones and 2048 (verl's default; its callers pass no other)
VP_CHUNK_SIZES = (1, 2, 3, 2048)


def _op(base: str, arity: int, source: str, extra_regimes=None, regimes=None, parameters=None) -> OpInfo:
    name = f"vocab_parallel_{base}"
    regimes = dict(regimes or VOCAB_PARALLEL_REGIMES, **(extra_regimes or {}))
    impls = IMPLEMENTATIONS.get(name, {})
    # the alternative implementations: TP-only layouts, regimes every profile has (not tp2_real_shapes)
    tp_only = {k: v for k, v in regimes.items() if "cp" not in k.split("_")[0] and k not in profile_regimes(regimes)}
    all_regimes = dict(regimes, **implementation_regimes(tp_only, impls))
    return OpInfo(name, "vocab_parallel", arity,
                  (MATCHES_REFERENCE, PARTITION_INVARIANT, NON_DESTRUCTIVE), all_regimes, reference_function(base),
                  reference_function(base + "_grad"), differentiable=True, source=source,
                  family="vocab_parallel", distributed=True, implementations=dict(impls), parameters=parameters or {},
                  property_regimes={PARTITION_INVARIANT: tuple(regimes)} if impls else {},
                  profile_regimes=profile_regimes(regimes))


OPS = (
    _op("token_logprobs", 3, "log p_y over TP vocab shards: all-reduce MAX, then SUM of exp and of the label's "
        "logit (Megatron vocab_parallel_cross_entropy = −log p_y)"),
    _op("entropy", 2, "H over TP vocab shards: all-reduce MAX, SUM exp, SUM p·x (verl vocab_parallel_entropy)"),
    _op("sum_pi_squared", 2, "Σπ² over TP vocab shards: all-reduce MAX, SUM exp, SUM exp² "
        "(verl PR #6153, non-destructive)", ORDER_REGIMES),
    _op("smoothed_token_logprobs", 4, "(1 − α)·log p_y + α·mean_v log p_v over TP vocab shards: the mean runs over "
        "the whole vocab, V is the whole vocab's size (Megatron vocab_parallel_cross_entropy(label_smoothing); "
        "a per-shard mean or V is the classic TP fault)", regimes=SMOOTHED_REGIMES,
        parameters={"label_smoothing": LABEL_SMOOTHING}),
)


@st.composite
def inputs(draw, op: OpInfo, dtype: str, regime: str):
    """``{"logits": [..., Vp], ["labels": [...],] "grad_output": [...], "vocab": V}`` (Vp = V padded).

    In the ``*_neg_inf_padded`` regimes V is any size (primes included) padded with ``-inf`` to a
    multiple of TP, so a TP rank may hold a shard that is all ``-inf``; the other regimes draw V rounded
    up to a multiple of TP with finite logits, so each regime isolates one difficulty. With CP the
    tokens are flattened to ``[N, V]`` rows (at least one per CP rank) and split over the CP ranks."""
    impl, regime = split_regime(regime)
    layout, data = parse_regime(regime)
    with_labels = op.name.endswith("token_logprobs")
    if data == "real_shapes":
        from rlconform.harness.families.token_stats import real_logits

        d = draw(real_logits(rows=REAL_ROWS))
        out = {"logits": d["logits"], "grad_output": d["grad_output"], "vocab": d["logits"].vocab}
        if with_labels:
            out["labels"] = d["labels"]
        for name, values in op.parameters.items():
            out[name] = draw(st.sampled_from(values))
        return out
    logits_regime = _LOGITS_ALIASES.get(data, data)
    if logits_regime == "neg_inf_padded":
        sizes = S.VOCAB_SIZES
    else:
        sizes = tuple(sorted({-(-v // layout.tp) * layout.tp for v in S.VOCAB_SIZES}))
    if "label_smoothing" in op.parameters:  # Megatron pads V to a multiple of 128·TP: a shard holds ≥ 2 entries
        sizes = tuple(v for v in sizes if v >= 2 * layout.tp) or (2 * layout.tp,)
    chunk = None
    if impl in CHUNKED:  # a chunked implementation: [rows, V] with rows around a chunk boundary
        chunk, rows = draw(IC.multi_chunk_rows(VP_CHUNK_SIZES))
        if rows > 64:
            sizes = tuple(sorted({-(-v // layout.tp) * layout.tp for v in IC.LARGE_CHUNK_VOCAB}))
        d = draw(S.logits(dtype, logits_regime, with_labels=with_labels, vocab_sizes=sizes, batch_shapes=[(rows,)]))
    else:
        d = draw(S.logits(dtype, logits_regime, with_labels=with_labels, vocab_sizes=sizes))
    x, g = d["logits"], d["grad_output"]
    labels = d.get("labels")
    v = x.shape[-1]
    if layout.cp > 1:
        x, g = x.reshape(-1, v), g.reshape(-1)
        labels = labels.reshape(-1) if labels is not None else None
        reps = -(-layout.cp // x.shape[0])
        if reps > 1:
            x, g = np.tile(x, (reps, 1)), np.tile(g, reps)
            labels = np.tile(labels, reps) if labels is not None else None
    out = {"logits": S.pad_vocab(x, layout.tp), "grad_output": g, "vocab": int(v)}
    if chunk is not None:
        out["chunk_size"] = chunk
    if labels is not None:
        out["labels"] = labels
    for name, values in op.parameters.items():
        out[name] = draw(st.sampled_from(values))
    return out


def strategy(op: OpInfo, dtype: str, regime: str):
    return inputs(op, dtype, regime)


FAMILY = OpFamily("vocab_parallel", OPS, strategy, None, order=60,
                  doc="token statistics over TP vocab shards on gloo ranks")
