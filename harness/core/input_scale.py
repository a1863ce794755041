"""The scale of a case's inputs: what a float32 (or float64) computation of them can resolve.

:func:`leading_scale` is the largest finite magnitude among the leading values of a case's floating inputs (the
values its summary shows, ``Case.summary``: the first :data:`LEADING` of each array), leaving out ids, masks,
the upstream gradient and the garbage written at masked positions. It is a lower bound of the inputs' scale, kept
as one number on the finding (``input_scale`` in report.json) so that severity's ulp-level rule
(:func:`rlconform.harness.report.severity.ulp_level`) reads a field, not the summary's text.
"""

from __future__ import annotations

import math

import numpy as np

#: names of inputs whose values are no scale of the computation (ids, masks, the upstream gradient, the garbage
#: written at masked positions)
NOT_SCALE = ("grad_output", "labels", "index", "mask", "response_mask", "loss_mask", "attention_mask", "garbage")
#: how many leading values of each array count (those ``Case.summary`` shows)
LEADING = 6


def leading_scale(inputs: dict) -> float:
    """The largest finite |x| among the first :data:`LEADING` values of each NumPy array of ``inputs`` not named
    in :data:`NOT_SCALE`; 0.0 when there is none."""
    best = 0.0
    for name, value in (inputs or {}).items():
        if name in NOT_SCALE or not isinstance(value, np.ndarray):
            continue
        for v in value.reshape(-1)[:LEADING].tolist():
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                continue
            v = abs(float(v))
            if math.isfinite(v):
                best = max(best, v)
    return best
