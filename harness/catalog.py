"""The op catalog: one description per op (PyTorch OpInfo style), many generic tests over it.

Each :class:`OpInfo` gives the canonical signature, the float64 reference it is compared with, the
dtypes and input regimes that feed it, and the generic properties that apply. The generic property
tests in :mod:`rlconform.properties` iterate over this catalog; a binding provides any subset.

Canonical signatures (torch tensors in, torch tensors out):

========================  ===========================================================  ============
op                        signature                                                    returns
========================  ===========================================================  ============
logsumexp                 ``(logits [..., V])``                                        ``[...]``
token_logprobs            ``(logits [..., V], labels int64 [...])``                    ``[...]``
entropy                   ``(logits [..., V])``                                        ``[...]``
sum_pi_squared            ``(logits [..., V])``  (Σπ²)                                 ``[...]``
masked_sum/mean/min/max   ``(values [B, T], mask [B, T])``                             0-d
masked_var / masked_std   ``(values [B, T], mask [B, T], unbiased: bool)``             0-d
masked_count              ``(mask [B, T])``  (nnz)                                     0-d / int
agg_loss                  :class:`~rlconform.harness.binding.AggLoss`                  0-d
metric_pipeline           :class:`~rlconform.harness.binding.MetricPipeline`           dict
optimal_token_baseline    ``(rewards [B,T], mask [B,T], index [B], old_log_probs [B,T],  (adv, returns)
                          sum_pi_squared [B,T])``
========================  ===========================================================  ============

Distributed ops (kinds ``vocab_parallel``, ``context_parallel``, ``dp_metric``), checked by
:mod:`rlconform.distributed_tests` on real gloo ranks (every rank calls the op with its own shard and
the group; every rank must return the global statistic):

==============================  ===================================================  ===================
op                              signature (per rank)                                 returns
==============================  ===================================================  ===================
vocab_parallel_token_logprobs   ``(local_logits [..., V/tp], labels int64 [...], group)``  ``[...]``
vocab_parallel_entropy          ``(local_logits [..., V/tp], group)``                ``[...]``
vocab_parallel_sum_pi_squared   ``(local_logits [..., V/tp], group)``                ``[...]``
cp_masked_mean                  ``(local_values [B, T/cp], local_mask [B, T/cp], group)``  0-d
dp_metric_all_reduce            ``(local_values [b, T], local_mask [b, T], group)``  number / 0-d
==============================  ===================================================  ===================

* vocab-parallel: TP rank ``t`` holds the contiguous vocab shard ``[t·V/tp, (t+1)·V/tp)``; V is padded
  with ``-inf`` to a multiple of tp (Megatron pads V to a multiple of TP); gradients are w.r.t. the
  local shard only (the loss is replicated on the TP ranks, Megatron's convention).
* ``cp_masked_mean``: the token-mean of a loss over a sequence split over CP ranks with Megatron's
  load-balanced layout (T in ``2·cp`` chunks, CP rank ``c`` holds chunks ``c`` and ``2·cp−1−c``); masked
  sums *and* nnz must be reduced over the CP group (cases.md family 5).
* ``dp_metric_all_reduce``: a per-token metric (entropy, clip fraction) as a trainer logs it: each DP
  rank emits from its own rows, the emitted values are reduced over the DP group; the result must be
  the token-weighted mean over all DP ranks (cases.md families 1 and 6; seed 000).

Distributed regimes name the parallel layout first, then the data regime: ``tp2_moderate``,
``tp4_neg_inf_padded``, ``tp2cp2_moderate``, ``cp2_padded``, ``dp2_imbalanced``; ``tp2_after_entropy``
(Σπ² only) reads Σπ² after a vocab-parallel entropy forward + backward on the same logits (seed 002).
``partition_invariant`` compares the layout with the unsharded one (TP = CP = DP = 1) and, for DP, with a
second split of the rows; see :mod:`rlconform.distributed_tests.checks`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from rlconform.harness.binding import AggLoss, BindingError, MetricPipeline, signature_arity

MATCHES_REFERENCE = "matches_reference"
PARTITION_INVARIANT = "partition_invariant"
NON_DESTRUCTIVE = "non_destructive"
FINITE = "finite_where_reference_finite"
METRIC_INTEGRITY = "metric_integrity"
PROPERTIES = (MATCHES_REFERENCE, PARTITION_INVARIANT, NON_DESTRUCTIVE, FINITE, METRIC_INTEGRITY)

FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")

#: Logits regimes (see :mod:`rlconform.properties.strategies`), with the dtypes each applies to.
LOGITS_REGIMES = {
    "moderate": FLOAT_DTYPES,
    "peaked": FLOAT_DTYPES,
    "near_uniform_offset": FLOAT_DTYPES,
    "neg_inf_padded": FLOAT_DTYPES,
    "fp16_extreme": ("float16",),
    "bf16_coarse": ("bfloat16",),
}
#: Mask regimes for token reductions.
MASK_REGIMES = {name: FLOAT_DTYPES for name in ("all_on", "padded", "random", "all_off")}
#: Partition regimes for the pipeline ops (nested, imbalanced, with empty shards).
PARTITION_REGIMES = {"imbalanced_partitions": ("float32", "float64", "bfloat16")}
#: Vocab-parallel regimes: ``<layout>_<logits regime>`` (layouts tp2, tp4, tp2cp2: world = tp·cp ranks).
VOCAB_PARALLEL_REGIMES = {
    "tp2_moderate": FLOAT_DTYPES,
    "tp4_moderate": ("float32", "bfloat16"),
    "tp2_peaked": ("float32", "bfloat16"),
    "tp2_near_uniform_offset": ("float32", "float64"),
    "tp2_neg_inf_padded": FLOAT_DTYPES,
    "tp4_neg_inf_padded": ("float32", "bfloat16"),
    "tp2_fp16_extreme": ("float16",),
    "tp2cp2_moderate": ("float32",),
}
#: Σπ² only: the value read after a vocab-parallel entropy forward + backward (seed 002, family 12).
ORDER_REGIMES = {"tp2_after_entropy": FLOAT_DTYPES, "tp4_after_entropy": ("float32",)}
#: Context-parallel regimes: ``<layout>_<mask regime>`` (Megatron's load-balanced 2·cp chunks).
CONTEXT_PARALLEL_REGIMES = {
    "cp2_all_on": ("float32", "bfloat16", "float64"),
    "cp2_padded": FLOAT_DTYPES,
    "cp4_random": ("float32", "bfloat16"),
    "tp2cp2_padded": ("float32",),
}
#: DP metric regimes: rows split over DP ranks, imbalanced (0 to 10⁴ tokens per rank, fully masked ranks).
DP_METRIC_REGIMES = {
    "dp2_imbalanced": ("float32", "float64", "bfloat16"),
    "dp4_imbalanced": ("float32",),
}
DISTRIBUTED_KINDS = ("vocab_parallel", "context_parallel", "dp_metric")


@dataclasses.dataclass(frozen=True)
class OpInfo:
    """Description of one catalog op.

    ``kind``: ``token_stat`` | ``reduction`` | ``agg_loss`` | ``metric_pipeline`` | ``advantage`` |
    ``vocab_parallel`` | ``context_parallel`` | ``dp_metric`` (the distributed kinds).
    ``arity``: positional arguments of the canonical callable (``None`` for the pipeline objects).
    ``properties``: the generic properties that apply. ``regimes``: regime name -> dtypes.
    ``differentiable``: gradients are compared too (closed-form reference gradient ``reference_grad``).
    ``source``: where the formula comes from.
    """

    name: str
    kind: str
    arity: int | None
    properties: tuple[str, ...]
    regimes: dict[str, tuple[str, ...]]
    reference: Callable[..., Any]
    reference_grad: Callable[..., Any] | None = None
    differentiable: bool = False
    source: str = ""

    def cases(self):
        """Yield every (dtype, regime) pair this op is checked under."""
        for regime, dtypes in self.regimes.items():
            for dtype in dtypes:
                yield dtype, regime


def _ref(name: str) -> Callable:
    def call(*args, **kwargs):
        import rlconform.reference as R

        return getattr(R, name)(*args, **kwargs)

    call.__name__ = name
    call.__qualname__ = f"reference.{name}"
    return call


_TOKEN_PROPS = (MATCHES_REFERENCE, NON_DESTRUCTIVE, FINITE)
_RED_PROPS = (MATCHES_REFERENCE, NON_DESTRUCTIVE, FINITE)


def _token_stat(name: str, arity: int, source: str) -> OpInfo:
    return OpInfo(name, "token_stat", arity, _TOKEN_PROPS, LOGITS_REGIMES, _ref(name), _ref(name + "_grad"),
                  differentiable=True, source=source)


def _vocab_parallel(base: str, arity: int, source: str, extra_regimes=None) -> OpInfo:
    regimes = dict(VOCAB_PARALLEL_REGIMES, **(extra_regimes or {}))
    return OpInfo(f"vocab_parallel_{base}", "vocab_parallel", arity,
                  (MATCHES_REFERENCE, PARTITION_INVARIANT, NON_DESTRUCTIVE), regimes, _ref(base),
                  _ref(base + "_grad"), differentiable=True, source=source)


def _reduction(name: str, arity: int, source: str) -> OpInfo:
    return OpInfo(name, "reduction", arity, _RED_PROPS, MASK_REGIMES, _ref(name), source=source)


OPS: dict[str, OpInfo] = {
    op.name: op
    for op in (
        _token_stat("logsumexp", 1, "log Σ_v exp(x_v), shifted by the row max"),
        _token_stat("token_logprobs", 2, "log softmax(x)_y; d/dx = e_y − p"),
        _token_stat("entropy", 1, "H = logsumexp(x) − Σ p x; dH = −p ⊙ (log p + H)"),
        _token_stat("sum_pi_squared", 1, "Σπ² (verl PR #6153); dΣπ² = 2p ⊙ (p − Σπ²)"),
        _reduction("masked_sum", 2, "Σ values·mask, exactly rounded (math.fsum)"),
        _reduction("masked_count", 1, "nnz = Σ mask"),
        _reduction("masked_mean", 2, "Σ values·mask / nnz"),
        _reduction("masked_var", 3, "unbiased: Σ(x−μ)²/(nnz−1); population: /nnz"),
        _reduction("masked_std", 3, "sqrt(masked_var)"),
        _reduction("masked_min", 2, "min over unmasked"),
        _reduction("masked_max", 2, "max over unmasked"),
        OpInfo("agg_loss", "agg_loss", None, (MATCHES_REFERENCE, PARTITION_INVARIANT, NON_DESTRUCTIVE),
               PARTITION_REGIMES, _ref("agg_loss"),
               source="value over the global mini-batch (verl core_algos.agg_loss; HF transformers PR #34191)"),
        OpInfo("metric_pipeline", "metric_pipeline", None, (MATCHES_REFERENCE, PARTITION_INVARIANT, METRIC_INTEGRITY),
               PARTITION_REGIMES, _ref("token_metrics"),
               source="token-weighted statistics over all unmasked tokens (SkyRL issue #1822)"),
        OpInfo("optimal_token_baseline", "advantage", 5, (MATCHES_REFERENCE, NON_DESTRUCTIVE, FINITE),
               {"groups": ("float32", "float64")}, _ref("optimal_token_baseline"),
               source="verl PR #6153 / compute_optimal_token_baseline_advantage"),
        _vocab_parallel("token_logprobs", 3, "log p_y over TP vocab shards: all-reduce MAX, then SUM of exp and of "
                        "the label's logit (Megatron vocab_parallel_cross_entropy = −log p_y)"),
        _vocab_parallel("entropy", 2, "H over TP vocab shards: all-reduce MAX, SUM exp, SUM p·x "
                        "(verl vocab_parallel_entropy)"),
        _vocab_parallel("sum_pi_squared", 2, "Σπ² over TP vocab shards: all-reduce MAX, SUM exp, SUM exp² "
                        "(verl PR #6153, non-destructive)", ORDER_REGIMES),
        OpInfo("cp_masked_mean", "context_parallel", 3, (MATCHES_REFERENCE, PARTITION_INVARIANT, NON_DESTRUCTIVE),
               CONTEXT_PARALLEL_REGIMES, _ref("masked_mean"),
               source="token-mean over a sequence split over CP: masked sums and nnz reduced over the CP group "
               "(Megatron's load-balanced 2·cp chunks; cases.md family 5)"),
        OpInfo("dp_metric_all_reduce", "dp_metric", 3, (MATCHES_REFERENCE, PARTITION_INVARIANT),
               DP_METRIC_REGIMES, _ref("masked_mean"),
               source="token-weighted mean of a metric over DP ranks (SkyRL all_reduce_metrics, seed 000; "
               "cases.md families 1, 6)"),
    )
}


def get_op(name: str) -> OpInfo:
    try:
        return OPS[name]
    except KeyError:
        raise BindingError(f"unknown op {name!r}; the catalog has: {', '.join(OPS)}") from None


def validate_impl(op: str, impl: Any, *, where: str = "binding") -> None:
    """Check that ``impl`` has the shape the catalog expects for ``op``; raise :class:`BindingError`
    naming the op (and the callable's file and line) otherwise."""
    info = OPS.get(op)
    if info is None:
        return  # ops outside the catalog are rejected by engines.validate_binding
    if info.kind == "agg_loss":
        if not isinstance(impl, AggLoss):
            raise BindingError(f"{where}: op 'agg_loss' must be an AggLoss, got {type(impl).__name__}")
        return
    if info.kind == "metric_pipeline":
        if not isinstance(impl, MetricPipeline):
            raise BindingError(f"{where}: op 'metric_pipeline' must be a MetricPipeline, got {type(impl).__name__}")
        return
    if not callable(impl):
        raise BindingError(f"{where}: op {op!r} must be callable, got {type(impl).__name__}")
    arity = signature_arity(impl)
    if arity is not None and info.arity is not None:
        required, maximum = arity
        if not (required <= info.arity <= maximum):
            code = getattr(impl, "__code__", None)
            loc = f" ({code.co_filename}:{code.co_firstlineno})" if code is not None else ""
            raise BindingError(
                f"{where}: op {op!r} takes {info.arity} positional argument(s) "
                f"but {getattr(impl, '__qualname__', impl)!r}{loc} accepts {required}..{maximum}"
            )
