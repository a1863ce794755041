"""How a finding's error measures are printed in report.md and report.html.

A finding's ``max_abs_err`` / ``max_rel_err`` are maxima over its examples of the *finite* comparisons;
they do not see an engine NaN or ±inf where the exact value is finite, nor a crash or a mutated input.
Printed as a number there they read ``0`` next to a NaN. :func:`error_text` says what the worst error
actually is:

=========================================================  ===========================================
finding                                                    text
=========================================================  ===========================================
an engine NaN / ±inf where the exact value is finite       ``NaN``, ``inf`` or ``NaN/inf`` (read by
                                                           :func:`rlconform.harness.report.severity.nonfinite_where_finite`)
a measure that is itself NaN / ±inf                        ``NaN`` / ``inf`` / ``-inf``
a failing finding whose measure is 0 or missing (a crash,  ``–`` (no numeric measure: see its message)
an unavailable op, a mutated input, a lost output)
otherwise                                                  the value, 3 significant digits
=========================================================  ===========================================
"""

from __future__ import annotations

import math

FAILING = ("discrepancy", "crash", "xfail", "unavailable", "error")
NONFINITE_TEXT = {"nan": "NaN", "inf": "inf", "nan/inf": "NaN/inf"}


def number_text(x) -> str:
    """``None`` → ``–``; a NaN → ``NaN``; ±inf → ``inf`` / ``-inf``; a float → 3 significant digits."""
    if x is None:
        return "–"
    if isinstance(x, float):
        if math.isnan(x):
            return "NaN"
        if math.isinf(x):
            return "inf" if x > 0 else "-inf"
        return f"{x:.3g}"
    return str(x)


def error_text(finding: dict, field: str = "max_abs_err") -> str:
    """The worst error of ``finding`` (``field``: ``max_abs_err`` or ``max_rel_err``) as report text; see
    the module docstring."""
    from rlconform.harness.report.severity import nonfinite_where_finite

    status = finding.get("status")
    if status in FAILING:
        nf = nonfinite_where_finite(finding)
        if nf:
            return NONFINITE_TEXT.get(nf, nf)
    value = finding.get(field)
    if status in FAILING and (value is None or value == 0):
        return "–"
    return number_text(value)
