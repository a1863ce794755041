"""Whether a data regime is realistic for training.

The catalog's regimes probe the arithmetic at its edges on purpose: logits offset by ±1e4, on bf16's coarse
grid at 256–3e4 or near fp16's ±65504, log-ratios of ±20 or below −12, values near a dtype's range. No
trainer hands an op such inputs (a model's logits stay within |logit| ≲ 30–50, a policy's log-ratio within a
few units of 0), so a wrong value seen *only* there is not a training defect: it is ``robustness`` when it is
a NaN / inf or a crash, ``precision`` otherwise (:mod:`rlconform.harness.report.severity`). Every other data
regime (``moderate``, ``peaked``, ``neg_inf_padded``, the mask, group and partition regimes) is one a trainer
meets, edge cases included (a row with no valid token, a group of one sample).

Keyed by the data part of a regime (``variant@data``; a layout prefix such as ``tp2_`` / ``tp2cp2_`` is not
part of it: ``tp2_near_uniform_offset`` is ``near_uniform_offset``). Core layer: imports nothing of the project.
"""

from __future__ import annotations

import re

#: data regimes whose inputs no trainer produces, with what makes them extreme (the strategies that draw them:
#: :func:`rlconform.harness.core.strategies.logits`, the families' own regimes)
EXTREME_REGIMES = {
    "near_uniform_offset": "logits offset by ±3e3–1e4",
    "bf16_coarse": "logits of 256–3e4 on bf16's coarse grid",
    "fp16_extreme": "logits near fp16's ±65504",
    "extreme_log_ratios": "log-ratios of ±20",
    "large_errors": "value errors near the dtype's range",
    "underflow": "every log-ratio in [−30, −12] (IS weights ≤ 6e-6)",
    "offset": "values offset by 1e4",
}
#: |logit| a trainer's model typically produces (the bound the realistic logits regimes stay within)
TYPICAL_LOGIT = 50.0

_LAYOUT = re.compile(r"^(?:(?:tp|cp|dp)\d+)+_")


def data_regime(regime: str) -> str:
    """The data part of ``regime``: ``grpo@singleton_groups`` -> ``singleton_groups``, ``chunked@tp2_moderate``
    -> ``moderate``."""
    data = (regime or "").split("@", 1)[-1]
    return _LAYOUT.sub("", data)


def extreme(regime: str) -> str | None:
    """What makes ``regime``'s inputs extreme (:data:`EXTREME_REGIMES`), or None for a realistic regime."""
    return EXTREME_REGIMES.get(data_regime(regime))


def realistic(regime: str) -> bool:
    """Whether a trainer meets ``regime``'s inputs (every regime but :data:`EXTREME_REGIMES`)."""
    return extreme(regime) is None
