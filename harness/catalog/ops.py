"""The op catalog: every op of every family (:mod:`rlconform.harness.families`), one description per op.

Each :class:`~rlconform.harness.core.opinfo.OpInfo` gives the canonical signature, the float64 reference it
is compared with, the dtypes and input regimes that feed it, its variants and the generic properties
that apply. The generic property tests (:mod:`rlconform.properties`, :mod:`rlconform.distributed_tests`)
iterate over this catalog; a binding provides any subset. ``rlconform list-ops`` prints it.

Families and their ops (the canonical signatures are in each family module's docstring):

======================  ==========================================================================
family                  ops
======================  ==========================================================================
token_stats             logsumexp, token_logprobs, entropy, sum_pi_squared (logits [..., V] -> [...])
reductions              masked_sum/count/mean/var/std/min/max (values [B, T], mask [B, T] -> 0-d)
agg_loss                agg_loss (AggLoss; every loss_agg_mode a variant; value and gradient)
metric_pipeline         metric_pipeline (MetricPipeline -> dict of token-weighted statistics)
optimal_token_baseline  optimal_token_baseline (rewards, mask, index, old_log_probs, Σπ² -> adv, returns)
advantages              outcome_advantage (an estimator per variant), gae, masked_whiten
kl_estimator            kl_estimator (a KL penalty / estimator name per variant; value and gradient)
policy_loss             policy_loss (a registered loss per variant; value, gradient, metrics)
vocab_parallel          vocab_parallel_token_logprobs / _entropy / _sum_pi_squared (TP ranks)
context_parallel        cp_masked_mean (CP ranks, Megatron load-balanced chunks)
dp_metric               dp_metric_all_reduce (DP ranks)
dp_whiten               dp_masked_whiten (DP ranks: statistics global over the DP group)
policy_step             policy_step, policy_step_metrics (PolicyStep: a trainer's step on a tiny model -> old log-probs
                        and parameter gradient; the logged metrics)
batch_metrics           batch_metrics (a trainer's batch -> the statistics logged of it; actor / critic variants)
======================  ==========================================================================

Regime names: a data regime (``moderate``, ``padded``), a distributed layout and data regime
(``tp2_moderate``, ``cp2_padded``, ``dp2_imbalanced``), or a variant and data regime
(``token-mean@imbalanced_partitions``), or a second implementation of a variant and data regime
(``grpo+vectorized@uneven_groups``, drawn like ``grpo@uneven_groups``): see :mod:`rlconform.harness.core.opinfo`.
"""

from __future__ import annotations

from rlconform.harness.core.contracts import BindingError
from rlconform.harness.core.opinfo import (  # noqa: F401 - the catalog's vocabulary, re-exported
    FINITE,
    FLOAT_DTYPES,
    IMPLEMENTATIONS_AGREE,
    MASK_INVARIANT,
    MATCHES_REFERENCE,
    METRIC_INTEGRITY,
    NON_DESTRUCTIVE,
    PARTITION_INVARIANT,
    PROPERTIES,
    OpInfo,
    plain_regime,
    split_regime,
)
from rlconform.harness.families import OpFamily, all_families
from rlconform.harness.families.agg_loss import PARTITION_DTYPES  # noqa: F401 - re-exported
from rlconform.harness.families.context_parallel import CONTEXT_PARALLEL_REGIMES  # noqa: F401
from rlconform.harness.families.dp_metric import DP_METRIC_REGIMES  # noqa: F401
from rlconform.harness.families.metric_pipeline import PARTITION_REGIMES  # noqa: F401
from rlconform.harness.families.reductions import MASK_REGIMES  # noqa: F401
from rlconform.harness.families.token_stats import LOGITS_REGIMES  # noqa: F401
from rlconform.harness.families.vocab_parallel import ORDER_REGIMES, VOCAB_PARALLEL_REGIMES  # noqa: F401

FAMILIES: tuple[OpFamily, ...] = all_families()

OPS: dict[str, OpInfo] = {op.name: op for family in FAMILIES for op in family.ops}

_FAMILY_OF: dict[str, OpFamily] = {op.name: family for family in FAMILIES for op in family.ops}

#: kinds checked on gloo ranks by :mod:`rlconform.distributed_tests`
DISTRIBUTED_KINDS = tuple(sorted({op.kind for op in OPS.values() if op.distributed}))


class UnknownOp(BindingError):
    """An op name the catalog does not know (the message lists the catalog): a usage error."""


def get_op(name: str) -> OpInfo:
    """The OpInfo of ``name``; raises :class:`UnknownOp` (a BindingError) listing the catalog otherwise."""
    try:
        return OPS[name]
    except KeyError:
        raise UnknownOp(f"unknown op {name!r}; the catalog has: {', '.join(OPS)}") from None


def family_of(op: str) -> OpFamily:
    """The family that declares ``op``."""
    get_op(op)
    return _FAMILY_OF[op]


def strategy_for(op: str, dtype: str, regime: str):
    """The hypothesis strategy drawing the ``inputs`` dict of a Case for ``op`` in ``dtype``/``regime``."""
    info = get_op(op)
    return _FAMILY_OF[op].strategy(info, dtype, plain_regime(regime))  # grpo+vectorized@x draws as grpo@x
