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

Vocab-parallel forms (``vocab_parallel_<name>(local_logits [..., V/tp], [labels,] group)``) are
checked by :mod:`rlconform.distributed_tests`.
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


@dataclasses.dataclass(frozen=True)
class OpInfo:
    """Description of one catalog op.

    ``kind``: ``token_stat`` | ``reduction`` | ``agg_loss`` | ``metric_pipeline`` | ``advantage``.
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
        return  # ops outside the catalog (e.g. vocab_parallel_*) are validated by their tests
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
