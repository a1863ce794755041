"""Which strategy feeds which op (the catalog's ``kind`` decides)."""

from __future__ import annotations

from rlconform.harness.catalog import get_op
from rlconform.properties import strategies as S


def strategy_for(op: str, dtype: str, regime: str):
    """The hypothesis strategy drawing the ``inputs`` dict of a Case for ``op`` in ``dtype``/``regime``."""
    kind = get_op(op).kind
    if kind == "token_stat":
        return S.logits(dtype, regime, with_labels=True)
    if kind == "reduction":
        return S.reduction_inputs(dtype, regime)
    if kind == "agg_loss":
        return S.agg_loss_inputs(dtype)
    if kind == "metric_pipeline":
        return S.metric_inputs(dtype)
    if kind == "advantage":
        return S.advantage_inputs(dtype)
    if kind in ("vocab_parallel", "context_parallel", "dp_metric"):
        from rlconform.distributed_tests.strategies import strategy_for as distributed_strategy_for

        return distributed_strategy_for(op, dtype, regime)
    raise ValueError(f"no strategy for op kind {kind!r}")
