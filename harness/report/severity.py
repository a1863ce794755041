"""Severity of a failing finding: ``wrong``, ``destructive`` or ``imprecise`` (issue 12).

Operates on a finding of ``report.json`` (a dict), from the numbers it carries: the clauses of its
``message`` (``engine E vs reference R at flat index i: … tolerance T``; ``X vs Y … (reference R,
allowed difference D)``; ``engine nan where the reference is finite``), ``max_ratio``, ``max_rel_err``,
its ``status`` and ``property``. The thresholds and the reason for each are in the severity table of
:mod:`rlconform.harness.core.tolerance` (``WRONG_REL``, ``WRONG_PARTITION``, ``NEAR``).

The message describes the shrunk example (the simplest failing input hypothesis found), ``max_ratio``
the worst example: relative errors are read from the message's clauses (``max_rel_err`` is a maximum
over every element, dominated by near-zero references), and a finding whose worst example is within
``NEAR``× of its tolerance is never ``wrong``.

``--fail-on`` (:func:`fails`): ``imprecise`` (default; any failing finding turns the exit code red, as
before severities existed) or ``wrong`` (only ``wrong`` and ``destructive`` findings do). ``xpass`` and
``unavailable`` always do: the ledger works as before, and an op that cannot be loaded is never fine.
"""

from __future__ import annotations

import math
import re

from rlconform.harness.core.tolerance import NEAR, WRONG_PARTITION, WRONG_REL

SEVERITIES = ("wrong", "destructive", "imprecise")  # most severe first
RANK = {s: i for i, s in enumerate(SEVERITIES)}
FAIL_ON = ("wrong", "imprecise")
DEFAULT_FAIL_ON = "imprecise"
#: statuses whose findings get a severity (an engine failure, listed in the ledger or not)
JUDGED = ("discrepancy", "crash", "xfail", "unavailable")

_NUM = r"[-+]?(?:nan|inf|[0-9.]+(?:e[-+]?[0-9]+)?)"
VALUE_CLAUSE = re.compile(rf"engine (?P<e>{_NUM}) vs reference (?P<r>{_NUM}) at flat index \d+:[^\n]*?"
                          rf"tolerance (?P<t>{_NUM})")
PARTITION_CLAUSE = re.compile(rf"(?P<x>{_NUM}) vs (?:[^\n]*? = )?(?P<y>{_NUM})(?: at flat index \d+)? "
                              rf"\(reference (?P<r>{_NUM}), allowed difference (?P<d>{_NUM})\)")
NONFINITE_WHERE_FINITE = re.compile(rf"engine (?P<e>nan|-?inf) where the reference[a-z ]* is finite")
#: :func:`rlconform.harness.core.impl_contract.rank_problem`: an input rank the implementation's docstring allows raised
RANK_CONTRACT = re.compile(r"contract: a rank-(?P<rank>\d+) input [^\n]*?\(its docstring allows ranks [^)]*\) raised "
                           r"(?P<t>[A-Za-z0-9_.]+)")
CRASH_TYPE = re.compile(r"(?:engine raised in [^:]*: )?(?P<t>[A-Z][A-Za-z0-9_.]*(?:Error|Exception|Warning))\b")


def _f(text: str) -> float:
    return float(text)


def value_clauses(message: str) -> list[tuple[float, float, float]]:
    """(engine, reference, tolerance) of every ``engine E vs reference R … tolerance T`` clause."""
    return [(_f(m["e"]), _f(m["r"]), _f(m["t"])) for m in VALUE_CLAUSE.finditer(message or "")]


def partition_clauses(message: str) -> list[tuple[float, float, float, float]]:
    """(x, y, reference, allowed difference) of every ``X vs Y … (reference R, allowed difference D)``."""
    return [(_f(m["x"]), _f(m["y"]), _f(m["r"]), _f(m["d"])) for m in PARTITION_CLAUSE.finditer(message or "")]


def crash_type(message: str) -> str:
    m = CRASH_TYPE.search(message or "")
    return m["t"].rsplit(".", 1)[-1] if m else "exception"


def contract_crash_type(message: str) -> str | None:
    """The exception type (``IndexError``) when ``message`` says an input rank the implementation's docstring
    allows raised (:data:`RANK_CONTRACT`), else None."""
    m = RANK_CONTRACT.search(message or "")
    return m["t"].rstrip(":").rsplit(".", 1)[-1] if m else None


def nonfinite_where_finite(finding: dict) -> str | None:
    """``"nan"`` / ``"inf"`` when the finding shows a NaN or ±inf engine value where the exact value is
    finite, else None."""
    msg = finding.get("message") or ""
    m = NONFINITE_WHERE_FINITE.search(msg)
    if m:
        return "nan" if m["e"] == "nan" else "inf"
    for e, r, _ in value_clauses(msg):
        if not math.isfinite(e) and math.isfinite(r):
            return "nan" if math.isnan(e) else "inf"
    for x, y, r, _ in partition_clauses(msg):
        if math.isfinite(r) and not (math.isfinite(x) and math.isfinite(y)):
            return "nan" if (math.isnan(x) or math.isnan(y)) else "inf"
    rel = finding.get("max_rel_err")
    if isinstance(rel, (int, float)) and math.isinf(rel):  # err = inf at a finite, nonzero reference
        return "nan/inf"
    return None


def classify(finding: dict) -> tuple[str | None, str]:
    """``(severity, reason)`` of one finding; ``(None, why)`` for ``pass`` and ``xpass`` findings."""
    status = finding.get("status")
    if status not in JUDGED:
        return None, ("listed in the ledger but passes" if status == "xpass" else "")
    msg = finding.get("message") or ""
    low = msg.lower()
    prop = finding.get("property")
    if status == "unavailable":
        return "wrong", "the op could not be loaded"
    if status == "crash":
        return "wrong", f"the engine raised {crash_type(msg)} on a legal input"
    m = RANK_CONTRACT.search(msg)
    if m:  # a documented input shape that cannot run is a crash on a legal input, whatever else failed
        return "wrong", f"the engine raised {contract_crash_type(msg)} on a rank-{m['rank']} input its docstring allows"
    if "no autograd graph" in low or "no gradient" in low:
        return "wrong", "a gradient the contract requires is missing"
    if "the engine returned shape" in msg or "nothing to compare" in msg:
        return "wrong", "an output is missing or has the wrong shape"
    if prop == "non_destructive":
        return "destructive", ("an input changed" if "mutated" in low
                               else "a tensor saved for backward was modified in place")
    if prop == "metric_integrity" or "missing from the final dict" in msg:
        return "wrong", "a metric is lost or malformed on its way to the final dict"
    nf = nonfinite_where_finite(finding)
    if nf:
        return "wrong", f"{nf} where the exact value is finite"
    ratio = finding.get("max_ratio")
    near = isinstance(ratio, (int, float)) and ratio < NEAR  # None: unbounded
    worst, why = 0.0, None
    for e, r, t in [] if near else value_clauses(msg):
        err = abs(e - r)
        if t > 0 and abs(r) > t and err > t:
            rel = err / abs(r)
            if rel >= WRONG_REL and rel > worst:
                worst, why = rel, f"rel err {rel:.3g} at reference {r:.6g} (tolerance {t:.3g})"
    agreement = prop == "implementations_agree"
    for x, y, r, d in [] if near else partition_clauses(msg):
        diff = abs(x - y)
        # two implementations: at the scale of their own values (the reference may be a convention's 0 or NaN)
        scale = max((abs(v) for v in (x, y, r) if math.isfinite(v)), default=0.0) if agreement else abs(r)
        if d > 0 and scale > d and diff > d:
            dep = diff / scale
            if dep > WRONG_PARTITION and dep > worst:
                worst, why = dep, (f"the implementations differ by {dep:.3g} of the value {max(abs(x), abs(y)):.6g} "
                                   f"(allowed difference {d:.3g})" if agreement else
                                   f"partition dependence {dep:.3g} of the value {r:.6g} (allowed difference {d:.3g})")
    if why:
        return "wrong", why + (f"; {ratio:.3g}× its tolerance at worst" if isinstance(ratio, (int, float)) else "")
    ratio_txt = f"{ratio:.3g}× its tolerance" if isinstance(ratio, (int, float)) else "beyond its tolerance"
    if near:
        return "imprecise", f"{ratio_txt}: within {NEAR:g}× of it, never wrong"
    return "imprecise", f"{ratio_txt}, below the thresholds of wrong"


def at_least(severity: str | None, fail_on: str) -> bool:
    """Whether ``severity`` turns the exit code red under ``--fail-on fail_on``."""
    if severity is None:
        return False
    if fail_on == "imprecise":
        return True
    if fail_on == "wrong":
        return severity in ("wrong", "destructive")
    raise ValueError(f"unknown --fail-on {fail_on!r}; choose from {', '.join(FAIL_ON)}")


def fails(finding: dict, fail_on: str = DEFAULT_FAIL_ON) -> bool:
    """Whether ``finding`` turns the exit code red: ``xpass`` / ``unavailable`` always, ``discrepancy`` /
    ``crash`` when their severity is at least ``fail_on``, ``xfail`` / ``pass`` never."""
    status = finding.get("status")
    if status in ("xpass", "unavailable"):
        return True
    if status not in ("discrepancy", "crash"):
        return False
    sev = finding.get("severity") or classify(finding)[0]
    return at_least(sev, fail_on)
