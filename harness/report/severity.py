"""Severity of a failing finding by its impact on training: ``training``,
``destructive``, ``logging``, ``robustness`` or ``precision``.

Operates on a finding of ``report.json`` (a dict), from the fields it carries: the clauses of its failure
record (:mod:`rlconform.harness.report.failure_fields`: ``value`` clauses, engine E vs exact R with
tolerance T; ``difference`` clauses, X vs Y of two runs with the exact R and the allowed difference D and
the run's layout; ``nonfinite`` clauses; the quantity, value / gradient / metric), ``max_ratio``, ``max_rel_err``,
its ``status``, ``property`` and ``op``, and the dtypes the engine calls the op with (the binding's
``engine_dtypes``, recorded as ``report.json`` ``engine.engine_dtypes``). The thresholds of a wrong value
and the reason for each are in the severity table of :mod:`rlconform.harness.core.tolerance`
(``WRONG_REL``, ``WRONG_PARTITION``, ``NEAR``).

============  ======================================================================================
severity      when (the first that applies)
============  ======================================================================================
robustness    a crash (the engine raised, or a documented input rank raised), an op that could not be
              loaded, NaN / ±inf where the exact value is finite: a legal edge input breaks the step
destructive   ``non_destructive``: a caller's tensor or a tensor saved for backward changed (as severe
              as ``training``)
logging       a wrong value of a metric: ops ``metric_pipeline`` / ``metric_statistics`` /
              ``dp_metric_all_reduce``, property ``metric_integrity``, or a failing clause that names a
              metric (``metric ppo_kl = …``): the loss is right, what is logged is not
training      a wrong value (beyond the thresholds of ``wrong`` of the tolerance table), a missing
              gradient or output of a loss, gradient, advantage, log-prob or importance weight — in a
              dtype the engine calls the op with and on a realistic regime (below)
precision     every other failure (rounding-sized); a wrong value in bf16 / fp16 on an extreme input
              that rounding of the inputs to that dtype explains (:func:`rounding_of_extreme_input`);
              any other wrong value on a regime no trainer produces (:func:`extreme_input`:
              :data:`rlconform.harness.core.regimes.EXTREME_REGIMES`, |logit| of 256 or ±1e4);
              a wrong value within 4 float32 ulps of the input's magnitude (:func:`ulp_level`);
              and any of the above (but ``destructive`` and a crash, :func:`is_crash`) in a dtype the
              engine never calls the op with
============  ======================================================================================

The failure record describes the shrunk example (the simplest failing input hypothesis found), ``max_ratio``
the worst example: relative errors are read from the record's clauses (``max_rel_err`` is a maximum
over every element, dominated by near-zero references), and a finding whose worst example is within
``NEAR``× of its tolerance is never more than ``precision``.

``--fail-on S`` (:func:`fails`): a finding turns the exit code red when its severity is ``S`` or more
severe (:data:`SEVERITIES` order; ``training`` and ``destructive`` rank together). The default,
``robustness``, fails on ``training``, ``destructive``, ``logging`` and ``robustness``; ``precision``
fails on every failing finding. The earlier names are read as aliases (``wrong`` = ``robustness``,
``imprecise`` = ``precision``: what they selected before). ``xpass`` and ``unavailable`` always fail:
the ledger works as before, and an op that cannot be loaded is never fine — save an op its binding declares
to need CUDA, on a run of another device (``unavailable: needs CUDA``): listed in every report,
red on none (a CPU CI of an engine with a Triton kernel stays green; ``--device cuda`` checks the kernel).
"""

from __future__ import annotations

import math
import re

from rlconform.harness.core.regimes import EXTREME_REGIMES, extreme
from rlconform.harness.core.tolerance import NEAR, WRONG_PARTITION, WRONG_REL
from rlconform.harness.report import failure_fields as F

SEVERITIES = ("training", "destructive", "logging", "robustness", "precision")  # most severe first
#: rank for ordering and --fail-on (training and destructive are as severe)
RANK = {"training": 0, "destructive": 0, "logging": 1, "robustness": 2, "precision": 3}
#: the earlier names, still accepted by --fail-on
LEGACY = {"wrong": "robustness", "imprecise": "precision"}
FAIL_ON = SEVERITIES + tuple(LEGACY)
DEFAULT_FAIL_ON = "robustness"
#: statuses whose findings get a severity (an engine failure, listed in the ledger or not)
JUDGED = ("discrepancy", "crash", "xfail", "unavailable")
#: ops whose values are logged metrics, not what the optimiser sees
METRIC_OPS = ("metric_pipeline", "metric_statistics", "dp_metric_all_reduce")


def value_clauses(finding: dict) -> list[tuple[float, float, float]]:
    """(engine, exact, tolerance) of every ``value`` clause of the finding's failure record."""
    return F.value_clauses(finding)


def partition_clauses(finding: dict) -> list[tuple[float, float, float, float]]:
    """(x, y, exact, allowed difference) of every ``difference`` clause (two runs of the same data)."""
    return F.difference_clauses(finding)


def crash_type(finding: dict) -> str:
    """The engine's exception type of a crash finding (``exception`` when unknown)."""
    return F.crash_type(finding)


def contract_crash_type(finding: dict) -> str | None:
    """The exception type (``IndexError``) when an input rank the implementation's docstring allows raised (a
    ``contract`` clause), else None."""
    c = F.contract(finding)
    return (c.error_type or "exception") if c is not None else None


def nonfinite_where_finite(finding: dict) -> str | None:
    """``"nan"`` / ``"inf"`` when the finding shows a NaN or ±inf engine value where the exact value is
    finite, else None."""
    found = F.nonfinite(finding)
    if found:
        return found
    rel = finding.get("max_rel_err")
    if isinstance(rel, (int, float)) and math.isinf(rel):  # err = inf at a finite, nonzero reference
        return "nan/inf"
    return None


def _op_wrong_rel(op) -> float:
    """The op's threshold of a wrong value (:attr:`~rlconform.harness.core.opinfo.OpInfo.wrong_rel`), else
    ``WRONG_REL``."""
    from rlconform.harness.catalog.ops import OPS

    info = OPS.get(op) if isinstance(op, str) else None
    return info.wrong_rel if info is not None and info.wrong_rel is not None else WRONG_REL


def _wrong_value(finding: dict) -> str | None:
    """Why the finding's values are wrong beyond rounding (the tolerance table's thresholds), else None."""
    ratio = finding.get("max_ratio")
    near = isinstance(ratio, (int, float)) and ratio < NEAR  # None: unbounded
    if near:
        return None
    worst, why = 0.0, None
    wrong_rel = _op_wrong_rel(finding.get("op"))
    for e, r, t in value_clauses(finding):
        err = abs(e - r)
        if t > 0 and abs(r) > t and err > t:
            rel = err / abs(r)
            if rel >= wrong_rel and rel > worst:
                worst, why = rel, f"rel err {rel:.3g} at reference {r:.6g} (tolerance {t:.3g})"
        elif abs(r) <= t < err and err >= WRONG_REL and err > worst:
            # an exact value at (or below) the absolute floor: no relative error exists, so the absolute one
            # is read at unit scale (verl's vectorized GRPO gives 0.0119 where the exact advantage is 0)
            worst, why = err, f"abs err {err:.3g} where the exact value is {r:.3g} (tolerance {t:.3g})"
    agreement = finding.get("property") == "implementations_agree"
    for x, y, r, d in partition_clauses(finding):
        diff = abs(x - y)
        # two implementations: at the scale of their own values (the reference may be a convention's 0 or NaN)
        scale = max((abs(v) for v in (x, y, r) if math.isfinite(v)), default=0.0) if agreement else abs(r)
        if d > 0 and scale > d and diff > d:
            dep = diff / scale
            if dep > min(WRONG_PARTITION, wrong_rel) and dep > worst:
                worst, why = dep, (f"the implementations differ by {dep:.3g} of the value {max(abs(x), abs(y)):.6g} "
                                   f"(allowed difference {d:.3g})" if agreement else
                                   f"partition dependence {dep:.3g} of the value {r:.6g} (allowed difference {d:.3g})")
    if why and isinstance(ratio, (int, float)):
        why += f"; {ratio:.3g}× its tolerance at worst"
    return why


#: unit roundoff of the low precisions (half an ulp at 1: 2⁻⁸ for bf16's 8-bit significand, 2⁻¹¹ for fp16)
UNIT_ROUNDOFF = {"bfloat16": 2.0 ** -8, "float16": 2.0 ** -11}
#: data regimes whose inputs sit at the edge of a low precision: log-ratios of ±20 (exp(20) ≈ 4.9e8, one bf16
#: rounding of the log-ratio moves exp by up to 20·2⁻⁸ ≈ 8 %), value errors of 1e9 (a clipped and an
#: unclipped branch that differ below the dtype's resolution round to a tie)
EXTREME_INPUT_REGIMES = {k: v for k, v in EXTREME_REGIMES.items() if k in ("extreme_log_ratios", "large_errors")}
#: |log π − log π_old| of the extreme_log_ratios regime in bf16 (the condition number of exp there)
EXTREME_LOG_RATIO = 20.0


def rounding_of_extreme_input(finding: dict) -> str | None:
    """Why a wrong value in bf16 / fp16 is the rounding of an extreme input to that dtype (``precision``),
    else None. Decided from the numbers: on an extreme-input regime (:data:`EXTREME_INPUT_REGIMES`), every
    failing value clause's relative error is within what one rounding of the inputs gives there — for a
    log-ratio Δ, exp(Δ) moves by |Δ|·u (u the unit roundoff, :data:`UNIT_ROUNDOFF`: 20·2⁻⁸ ≈ 0.078 in
    bf16; verl's geo_mean / clip_cov / kl_cov bf16: 2.60e8 vs 2.46e8, 5.8 %); for large value errors, two
    loss branches rounded to a tie, whose max() splits the gradient (``torch.maximum`` gives each tied
    branch half: a gradient ×½ or ×¾ of the exact one, verl's bf16 value_loss 4.69e7 vs 6.26e7). A NaN /
    inf is never rounding; a value wrong beyond these bounds stays a wrong value."""
    from rlconform.harness.core.opinfo import split_regime

    u = UNIT_ROUNDOFF.get(finding.get("dtype") or "")
    data = split_regime(finding.get("regime") or "")[1]
    if u is None or data not in EXTREME_INPUT_REGIMES or nonfinite_where_finite(finding):
        return None
    bound = EXTREME_LOG_RATIO * u if data == "extreme_log_ratios" else 0.5 + 1e-2
    rels = [abs(e - r) / abs(r) for e, r, t in value_clauses(finding)
            if math.isfinite(e) and math.isfinite(r) and r and abs(e - r) > t]
    if not rels or max(rels) > bound:
        return None
    how = (f"≤ |Δ|·u = {EXTREME_LOG_RATIO:g}·{u:.3g} = {bound:.3g}, what one rounding of the log-ratio to "
           f"{finding['dtype']} moves exp(Δ) by" if data == "extreme_log_ratios" else
           "a gradient split between two loss branches that round to a tie (≤ ½ of it)")
    return (f"rounding of an extreme input ({EXTREME_INPUT_REGIMES[data]}) in {finding['dtype']}: rel err "
            f"{max(rels):.3g} {how}")


def extreme_input(finding: dict) -> str | None:
    """Why a wrong value is no training defect because its regime is extreme (``precision``), else None: the
    finding's data regime is one no trainer produces (:data:`rlconform.harness.core.regimes.EXTREME_REGIMES`:
    logits offset by ±1e4, bf16 logits of 256, fp16 logits near ±65504, log-ratios of ±20). A NaN / inf or a
    crash there is decided before (``robustness``); a wrong value seen on a realistic regime too is
    ``training`` through that finding (a defect takes its most severe member's severity)."""
    what = extreme(finding.get("regime") or "")
    return f"a wrong value only on an extreme input ({what}), no input a trainer produces" if what else None


_INPUT_VALUES = re.compile(r"(?P<name>[A-Za-z_][A-Za-z0-9_]*)\[[^\]]*\]=\[(?P<vals>[^\]]*)\]")
#: an error within this many float32 ulps of the input's magnitude is rounding of a float32 computation
ULP_LEVEL = 4.0


def input_scale(finding: dict) -> float:
    """The scale of a finding's failing input: its ``input_scale`` field
    (:func:`rlconform.harness.core.input_scale.leading_scale`); a finding written before it had one reads the same
    number off its ``worst_input`` summary (the first values of each tensor)."""
    scale = finding.get("input_scale")
    if isinstance(scale, (int, float)) and not isinstance(scale, bool) and math.isfinite(scale):
        return float(scale)
    return _summary_scale(finding.get("worst_input") or "")


def _summary_scale(worst_input: str) -> float:
    from rlconform.harness.core.input_scale import NOT_SCALE

    best = 0.0
    for m in _INPUT_VALUES.finditer(worst_input or ""):
        if m["name"] in NOT_SCALE:
            continue
        for tok in m["vals"].split(","):
            try:
                v = abs(float(tok))
            except ValueError:
                continue
            if math.isfinite(v):
                best = max(best, v)
    return best


def ulp_level(finding: dict) -> str | None:
    """Why a wrong value is ulp-level at the scale of its input (``precision``), else None: every failing
    value clause's absolute error is at most :data:`ULP_LEVEL` float32 ulps of the largest input magnitude
    (|E − R| ≤ 4·2⁻²³·max|x|; float64 ulps for a float64 finding, whose faithful path is float64). A float32 computation of the formula (an upcast included) cannot resolve
    less: verl's chunked entropy upcasts bf16 logits of 266 and gives 0 where the exact entropy is 1.4e-5,
    below the 3e-5 spacing of float32 there. A partition or agreement clause, a NaN / inf, or a value off
    by more than that stays what it is; a low-precision computation (bf16 logits of 256 giving entropy 0
    instead of 0.69) is far beyond float32's resolution and stays a wrong value."""
    if nonfinite_where_finite(finding) or partition_clauses(finding):
        return None
    scale = input_scale(finding)
    wide = finding.get("dtype") == "float64"  # computed in float64 (a float32 engine path is module rounding)
    bound = ULP_LEVEL * (2.0 ** -52 if wide else 2.0 ** -23) * scale
    errs = [abs(e - r) for e, r, t in value_clauses(finding) if math.isfinite(e) and math.isfinite(r) and abs(e - r) > t]
    if not errs or not scale or max(errs) > bound:
        return None
    kind = "float64" if wide else "float32"
    return (f"ulp-level: abs err {max(errs):.3g} ≤ {ULP_LEVEL:g} {kind} ulps of the input's magnitude "
            f"{scale:.3g} ({bound:.3g}), what any {kind} computation of it may give")


def scaled_by_micro_batches(clause) -> bool:
    """Whether a ``difference`` clause of a run split into k ≥ 2 micro-batches (its ``layout``) shows a value
    k× (or 1/k×) the exact one: an error that grows with the configuration (verl's
    ``compute_policy_loss_geo_mean`` sums micro-batch means), unbounded."""
    if clause.kind != "difference" or (clause.layout or {}).get("parts") != "micro-batches":
        return False
    k = F.parts_of(clause)
    if k < 2:
        return False
    r = clause.exact
    for v in (clause.engine, clause.other):
        if v is not None and r and math.isfinite(v) and math.isfinite(r) and v * r > 0:
            q = abs(v / r)
            if abs(q - k) <= 1e-3 * k or abs(q * k - 1) <= 1e-3:
                return True
    return False


def outcome(finding: dict) -> str | None:
    """The finding's own verdict: its ``status``, but for an ``xfail`` (a finding the ledger lists) what it
    was before the ledger matched it (``xfail_of``: ``crash``, ``discrepancy``, ``marginal``), so that a
    report's severities and defects do not depend on the ledger it was checked with."""
    status = finding.get("status")
    return (finding.get("xfail_of") or status) if status == "xfail" else status


def effect(finding: dict) -> float:
    """The size of a failing finding's effect, for ordering within a severity: inf for a crash, a
    mutation, a NaN / inf, or a value scaled by the number of micro-batches (:func:`scaled_by_micro_batches`:
    it grows with the configuration), else the largest relative error or partition dependence of its
    clauses, else ``max_ratio`` × 1e-6 (a rounding-sized failure ranks below any wrong value)."""
    if outcome(finding) in ("crash", "unavailable") or finding.get("property") == "non_destructive" \
            or F.contract(finding) or nonfinite_where_finite(finding):
        return math.inf
    if any(scaled_by_micro_batches(c) for c in F.of_kind(finding, "difference")):
        return math.inf
    agreement = finding.get("property") == "implementations_agree"
    best = max((clause_effect(c, agreement) for c in F.of_kind(finding, "value", "difference")), default=0.0)
    ratio = finding.get("max_ratio")
    if not best and isinstance(ratio, (int, float)):
        best = ratio * 1e-6
    return best


def clause_effect(c, agreement: bool = False) -> float:
    """The size of one failing clause's effect: inf for a NaN / inf where the exact value is finite; a
    ``value`` clause's relative error (its absolute error, at unit scale, where the exact value is at or below
    the absolute floor); a ``difference`` clause's difference over the exact value (over the larger of the two
    values and the exact one for two implementations, whose reference may be a convention's 0; at unit scale
    where that is at the floor: a kept mask 1 where the exact one is 0); 0 for a clause within its tolerance or
    without numbers."""
    if c.kind == "nonfinite":
        return math.inf
    if c.kind == "value" and None not in (c.engine, c.exact, c.tolerance):
        e, r, t = c.engine, c.exact, c.tolerance
        if not math.isfinite(e) and math.isfinite(r):
            return math.inf
        if abs(r) > t:
            return abs(e - r) / abs(r)
        return abs(e - r) if abs(e - r) > t else 0.0
    if c.kind == "difference" and None not in (c.engine, c.other, c.exact, c.tolerance):
        x, y, r, d = c.engine, c.other, c.exact, c.tolerance
        if math.isfinite(r) and not (math.isfinite(x) and math.isfinite(y)):
            return math.inf
        scale = max((abs(v) for v in (x, y, r) if math.isfinite(v)), default=0.0) if agreement else abs(r)
        if scale > d:
            return abs(x - y) / scale
        return abs(x - y) if abs(x - y) > d else 0.0  # at an exact value at the floor: at unit scale (a 0/1 mask)
    return 0.0


def is_metric(finding: dict) -> bool:
    """Whether the failing values are a logged metric (see the module table, ``logging``)."""
    if finding.get("op") in METRIC_OPS or finding.get("property") == "metric_integrity":
        return True
    if "lost metric" in F.problems(finding):
        return True
    compared = F.of_kind(finding, "value", "difference")
    return bool(compared) and all(c.quantity == "metric" for c in compared)


def _impact(finding: dict) -> tuple[str | None, str]:
    """Severity by impact before the dtype gate."""
    status = outcome(finding)
    prop = finding.get("property")
    if status == "unavailable":
        return "robustness", "the op could not be loaded"
    if status == "crash":
        return "robustness", f"the engine raised {crash_type(finding)} on a legal input"
    contract = F.contract(finding)
    if contract is not None:  # a documented input shape that cannot run is a crash on a legal input, whatever else failed
        return "robustness", (f"the engine raised {contract_crash_type(finding)} on a rank-{contract.rank} input "
                              "its docstring allows")
    if prop == "non_destructive":
        return "destructive", ("an input changed" if F.changed_input(finding)
                               else "a tensor saved for backward was modified in place")
    nf = nonfinite_where_finite(finding)
    if nf:
        return "robustness", f"{nf} where the exact value is finite"
    metric = is_metric(finding)
    target = "logging" if metric else "training"
    absent = F.problems(finding)
    if "missing gradient" in absent:
        return "training", "a gradient the contract requires is missing"
    if "unexpected gradient" in absent:
        return "training", "a gradient flows through a weight the engine declares detached"
    if "missing output" in absent:
        return target, "an output is missing or has the wrong shape"
    if prop == "metric_integrity" or "lost metric" in absent:
        return "logging", "a metric is lost or malformed on its way to the final dict"
    why = _wrong_value(finding)
    if why:
        rounding = rounding_of_extreme_input(finding) or ulp_level(finding)
        if rounding:
            return "precision", rounding
        contrived = extreme_input(finding)
        if contrived:
            return "precision", contrived + ": " + why
        return target, ("a logged metric: " if metric else "") + why
    ratio = finding.get("max_ratio")
    ratio_txt = f"{ratio:.3g}× its tolerance" if isinstance(ratio, (int, float)) else "beyond its tolerance"
    near = isinstance(ratio, (int, float)) and ratio < NEAR
    if near:
        return "precision", f"{ratio_txt}: within {NEAR:g}× of it, rounding-sized"
    return "precision", f"{ratio_txt}, below the thresholds of a wrong value"


def classify(finding: dict, engine_dtypes: dict | None = None) -> tuple[str | None, str]:
    """``(severity, reason)`` of one finding; ``(None, why)`` for ``pass`` and ``xpass`` findings, and for an
    ``xfail`` whose :func:`outcome` is ``marginal`` (listed in the ledger, inside the margin band: on a run without
    the ledger it is a ``marginal`` finding, no defect; the report's defects do not depend on the ledger).
    ``engine_dtypes``: op -> the dtypes the engine calls it with (an op not listed: every dtype)."""
    status = finding.get("status")
    if status not in JUDGED:
        return None, ("listed in the ledger but passes" if status == "xpass" else "")
    if outcome(finding) == "marginal":  # xfail only because the ledger lists it: a marginal finding, no defect
        return None, "marginal: inside the margin band (listed in the ledger)"
    sev, why = _impact(finding)
    used = (engine_dtypes or {}).get(finding.get("op"))
    dtype = finding.get("dtype")
    if sev not in ("precision", "destructive") and used and dtype and dtype not in used and not is_crash(finding):
        return "precision", f"{sev} in {dtype}, a dtype the engine never calls {finding.get('op')} with " \
                            f"(it uses {', '.join(used)}): {why}"
    return sev, why


def is_crash(finding: dict) -> bool:
    """Whether the finding is an uncontrolled exception (status ``crash``, or a documented input rank that
    raised). The dtype gate of :func:`classify` never demotes one: a dtype outside ``engine_dtypes`` explains
    a value's rounding or range, not an exception — a caller in that dtype (verl's fp16 mixed precision)
    loses the step, so the crash stays ``robustness`` in every dtype (verl's ``compute_is_metrics``
    ZeroDivisionError on fp16 weights that underflow to 0). A declared guard is no finding at all."""
    return outcome(finding) == "crash" or F.contract(finding) is not None


def normalise(fail_on: str) -> str:
    """``fail_on`` as one of :data:`SEVERITIES` (legacy names mapped); raises ValueError otherwise."""
    name = LEGACY.get(fail_on, fail_on)
    if name not in RANK:
        raise ValueError(f"unknown --fail-on {fail_on!r}; choose from {', '.join(SEVERITIES)}")
    return name


def at_least(severity: str | None, fail_on: str) -> bool:
    """Whether ``severity`` turns the exit code red under ``--fail-on fail_on``. A severity of an older
    report (``wrong``, ``imprecise``) is read as its alias."""
    if severity is None:
        return False
    threshold = RANK[normalise(fail_on)]
    return RANK[normalise(severity)] <= threshold


def fails(finding: dict, fail_on: str = DEFAULT_FAIL_ON) -> bool:
    """Whether ``finding`` turns the exit code red: ``xpass`` / ``unavailable`` always — except an op the
    binding declares to need CUDA on a run of another device (``"needs": "cuda"``: reported
    ``unavailable: needs CUDA``, not a fault of the engine nor of its binding) — ``discrepancy`` / ``crash``
    (but a ``declared_write``, the engine's declared write checked as declared: never)
    when their severity is at least ``fail_on``, ``xfail`` / ``pass`` never."""
    status = finding.get("status")
    if status == "unavailable" and finding.get("needs"):
        return False
    if finding.get("declared_write"):  # a declared write, checked as declared (triage.annotate)
        return False
    if status in ("xpass", "unavailable"):
        return True
    if status not in ("discrepancy", "crash"):
        return False
    sev = finding.get("severity") or classify(finding)[0]
    return at_least(sev, fail_on)
