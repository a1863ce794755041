"""Rollout-correction rejection masks ``rollout_rejection_mask`` and their diagnostics.

Canonical form: a :class:`~rlconform.harness.core.contracts.Variants` registry, one callable per catalog
variant ``(log_prob [B, T], old_log_prob [B, T], mask [B, T] bool) -> (kept [B, T] 0/1, metrics: dict[str,
float])``: ``log_prob`` is the training policy's log-probs (verl ``old_log_prob``, SkyRL ``old_log_probs``),
``old_log_prob`` the rollout's (verl ``rollout_log_prob``, SkyRL ``rollout_logprobs``); ``kept`` is 1 at the
valid tokens the filter keeps and 0 at every other position (the mask the loss is then taken over). The
metrics are the diagnostics of :func:`rlconform.reference.rollout_correction_metrics` an engine logs with the
mask (canonical names; a binding maps its keys): rejected fractions (token-weighted / over rows with a valid
token), the token-level IS weight's mean, ESS and raw (before truncation) high / low fractions at cap 2,
KL, k3-KL, χ² and perplexities. The rejected fraction of the filter's level is required
(``rs_masked_fraction`` for token filters, ``rs_seq_masked_fraction`` for row filters); the others are
compared when logged.

==================  =====================================  =================================================
variant             reference options (level, k, lo, hi)   engines
==================  =====================================  =================================================
``token_k1``        token k1 [0.5, 2]                      verl rollout_rs="token_k1" ("2.0"); SkyRL
                                                           compute_token_mask (0.5, 2.0)
``token_k1_asym``   token k1 [0.5, 1.5]                    verl "token_k1" ("0.5_1.5"); SkyRL (0.5, 1.5)
``seq_sum_k1``      seq_sum k1 [0.2, 5] (sequence ratio)   verl "seq_sum_k1" ("0.2_5.0"); SkyRL product
``seq_mean_k1``     seq_mean k1 [0.8, 1.25] (geometric)    verl "seq_mean_k1" ("0.8_1.25"); SkyRL geometric
``seq_all_k1``      seq_all k1 [0.5, 2] (outlier rows)     SkyRL compute_outlier_token_mask (0.5, 2.0)
``token_k2``        token k2 ≤ 0.5                         verl "token_k2"
``token_k3``        token k3 ≤ 0.5                         verl "token_k3"
``seq_sum_k2``      seq_sum k2 ≤ 2                         verl "seq_sum_k2"
``seq_sum_k3``      seq_sum k3 ≤ 2                         verl "seq_sum_k3"
``seq_mean_k2``     seq_mean k2 ≤ 0.1                      verl "seq_mean_k2"
``seq_mean_k3``     seq_mean k3 ≤ 0.1                      verl "seq_mean_k3"
``seq_max_k2``      seq_max k2 ≤ 0.5                       verl "seq_max_k2"
``seq_max_k3``      seq_max k3 ≤ 0.5                       verl "seq_max_k3"
``chained``         token k1 [0.5, 2] AND seq_mean k3 ≤ 0.1 verl "token_k1,seq_mean_k3" ("2.0,0.1")
==================  =====================================  =================================================

Regimes ``<variant>@moderate`` (fp32, fp64): right-padded or multi-turn masks (interior masked spans, rows
with no valid token), |Δ| ≤ 1, and in most examples tokens (sequence levels: rows) drawn at each bound of
the variant — exactly at it (the nearest value the dtype holds), a few roundings below / above (either
decision passes there, see below), and just below / above beyond what rounding can move (64× that band,
1e-3): those must be decided exactly — plus overflow-range log-ratios (|Δ| ∈ [20.5, 25], beyond the
engines' ±20 clamp, e^25 ≈ 7e10 still finite in fp32), paired in sequence rows with an opposite one so the
row's exact sum stays ordinary. ``<variant>@underflow`` (fp32): every Δ ∈ [−30, −12] (every IS weight ≤ 6e-6,
clamped to e^−20 below −20): the metrics must stay finite and right (the ESS of equal weights is 1 at any
scale). ``mask_invariant`` writes NaN, ±inf or 1e30 at masked positions of both inputs.

Yardstick: a valid token's decision is *at the boundary* when the exact statistic is within
κ·ε·(scale + |bound|) of a bound (κ = 8, ε = 2⁻²⁴, 2⁻⁵³ for fp64; scale from
:func:`rlconform.reference.rejection_statistics`: what the fp32 roundings of the log-probs, the threshold and
exp can move it by); there either 0 or 1 passes (and the metrics are taken with the engine's decision),
everywhere else the mask must equal the reference exactly. Metrics are held to the reference at the
log-probs shifted by one fp32 rounding (the policy-loss yardstick) with the ``pipeline`` tolerance.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from hypothesis import strategies as st

import rlconform.reference as R
from rlconform.harness.core import strategies as S
from rlconform.harness.core.branches import Branch
from rlconform.harness.core.contracts import Variants
from rlconform.harness.core.evaluation import Compared, Evaluation, call_engine, shape_problem
from rlconform.harness.core.failure import problem as problem_clause
from rlconform.harness.core.opinfo import (
    FINITE,
    MASK_INVARIANT,
    MATCHES_REFERENCE,
    NON_DESTRUCTIVE,
    OpInfo,
    reference_function,
    split_regime,
    variant_regime,
)
from rlconform.harness.core.tensors import as_numpy, to_tensor
from rlconform.harness.core.triggers import failing_labels
from rlconform.harness.families import OpFamily
from rlconform.harness.families import _log_ratio as L

OP = "rollout_rejection_mask"
#: catalog variant -> the reference's options (level, estimator, lower, upper), ANDed
VARIANTS = {
    "token_k1": (("token", "k1", 0.5, 2.0),),
    "token_k1_asym": (("token", "k1", 0.5, 1.5),),
    "seq_sum_k1": (("seq_sum", "k1", 0.2, 5.0),),
    "seq_mean_k1": (("seq_mean", "k1", 0.8, 1.25),),
    "seq_all_k1": (("seq_all", "k1", 0.5, 2.0),),
    "token_k2": (("token", "k2", None, 0.5),),
    "token_k3": (("token", "k3", None, 0.5),),
    "seq_sum_k2": (("seq_sum", "k2", None, 2.0),),
    "seq_sum_k3": (("seq_sum", "k3", None, 2.0),),
    "seq_mean_k2": (("seq_mean", "k2", None, 0.1),),
    "seq_mean_k3": (("seq_mean", "k3", None, 0.1),),
    "seq_max_k2": (("seq_max", "k2", None, 0.5),),
    "seq_max_k3": (("seq_max", "k3", None, 0.5),),
    "chained": (("token", "k1", 0.5, 2.0), ("seq_mean", "k3", None, 0.1)),
}
#: the IS cap of the diagnostics (verl rollout_is_threshold 2.0, token level)
IS_CAP = 2.0
#: the rejected fraction an engine must log with the mask: token-level filters' token fraction, row-level
#: filters' row fraction (the others are compared when logged)
def required_metrics(variant: str) -> tuple[str, ...]:
    levels = {level for level, *_ in VARIANTS[variant]}
    return tuple(k for k, need in (("rs_masked_fraction", "token" in levels),
                                   ("rs_seq_masked_fraction", bool(levels - {"token"}))) if need)
GARBAGE = (np.nan, np.inf, -np.inf, 1e30)
COMPUTE_EPS = {"float64": 2.0**-53, "float32": 2.0**-24, "bfloat16": 2.0**-24, "float16": 2.0**-24}
KAPPA = 8.0
_MODERATE = tuple(variant_regime(v, "moderate") for v in VARIANTS)


def _parameters(variant: str) -> str:
    """The bounds of ``variant`` in words: ``token k1: kept for 0.5 ≤ r ≤ 1.5`` (r = π/π_old of the level's
    statistic; k2 / k3 bound the divergence from above), ANDed options joined with "; "."""
    parts = []
    for level, est, lower, upper in VARIANTS[variant]:
        stat = f"r{'' if level == 'token' else ' of the row'}" if est == "k1" else est
        kept = f"{lower:g} ≤ {stat} ≤ {upper:g}" if lower is not None else f"{stat} ≤ {upper:g}"
        parts.append(f"{level.replace('_', '-')} {est}: kept for {kept}")
    return "; ".join(parts)


OPS = (
    OpInfo(OP, "rejection_mask", None, (MATCHES_REFERENCE, NON_DESTRUCTIVE, FINITE, MASK_INVARIANT),
           {**{variant_regime(v, "moderate"): ("float32", "float64") for v in VARIANTS},
            **{variant_regime(v, "underflow"): ("float32",) for v in VARIANTS}},
           reference_function("rollout_rejection_mask"),
           source="verl rollout_corr_helper.compute_rollout_rejection_mask / compute_rs_metrics / compute_is_metrics / "
                  "compute_offpolicy_metrics; SkyRL off_policy_correction_utils.compute_token_mask / "
                  "compute_sequence_mask / compute_outlier_token_mask; ESS: Kong 1992",
           family="rejection_mask", variants=tuple(VARIANTS),
           property_regimes={NON_DESTRUCTIVE: _MODERATE, MASK_INVARIANT: _MODERATE},
           variant_parameters={v: _parameters(v) for v in VARIANTS}),
)


# ------------------------------------------------------------------------------------ statistics
def _k3_root(u: float, sign: int) -> float:
    """The Δ of sign ``sign`` with e^Δ − 1 − Δ = u (bisection, float64)."""
    lo, hi = (0.0, 50.0) if sign > 0 else (-50.0 - u, 0.0)
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        v = math.expm1(mid) - mid
        if (v < u) == (sign > 0):
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def _inverse(estimator: str, bound: float, sign: int) -> float:
    """A token log-ratio whose statistic equals ``bound`` (k1: bound is in log units already)."""
    if estimator == "k1":
        return bound
    if estimator == "k2":
        return sign * math.sqrt(2.0 * bound)
    return _k3_root(bound, sign)


def _log_bounds(estimator, lower, upper):
    return (math.log(lower), math.log(upper)) if estimator == "k1" else (None, upper)


def _stat(x, level, estimator):
    return R.rejection_statistics(x["log_prob"], x["old_log_prob"], x["mask"], level, estimator)[0]


def _branches(variant):
    out = []
    for level, est, lower, upper in VARIANTS[variant]:
        lo, hi = _log_bounds(est, lower, upper)
        tag = f"{level} {est}"

        def valid(x):
            return np.asarray(x["mask"], bool)

        def keep(x, level=level, est=est, lower=lower, upper=upper):
            return R.rollout_rejection_mask(x["log_prob"], x["old_log_prob"], x["mask"],
                                            ((level, est, lower, upper),)).astype(bool)

        out.append(Branch(f"{tag}: kept", keep))
        out.append(Branch(f"{tag}: above the upper bound (rejected)",
                          lambda x, level=level, est=est, hi=hi: valid(x) & (_stat(x, level, est) > hi)))
        if lo is not None:
            out.append(Branch(f"{tag}: below the lower bound (rejected)",
                              lambda x, level=level, est=est, lo=lo: valid(x) & (_stat(x, level, est) < lo)))
        if level == "seq_all":
            continue
        out.append(Branch(f"{tag}: within 1e-3 of a bound", lambda x, level=level, est=est, lo=lo, hi=hi: valid(x) & (
            (np.abs(_stat(x, level, est) - hi) <= 1e-3 * max(1.0, abs(hi)))
            | ((np.abs(_stat(x, level, est) - lo) <= 1e-3 * max(1.0, abs(lo))) if lo is not None else False))))
    out.append(Branch("log-ratio beyond the ±20 clamp", lambda x: np.asarray(x["mask"], bool) & (
        np.abs(np.asarray(x["log_prob"]) - np.asarray(x["old_log_prob"])) > 20)))
    return tuple(out)


#: variant -> the branches of its definition (each bound's both sides, the boundary band, the ±20 clamp):
#: the CI profile's moderate examples take each one (tests/test_branch_coverage.py)
BRANCHES = {v: _branches(v) for v in VARIANTS}


# ------------------------------------------------------------------------------------ strategy
def _place(rng, delta, mask, variant, dtype):
    """Move tokens / rows of ``delta`` onto the bounds of ``variant`` (module doc) and add overflow-range
    log-ratios. Returns the new delta."""
    delta = delta.copy()
    b, t = delta.shape
    eps = COMPUTE_EPS[dtype]
    level, est, lower, upper = VARIANTS[variant][int(rng.integers(0, len(VARIANTS[variant])))]
    lo, hi = _log_bounds(est, lower, upper)
    targets = [(hi, +1)] + ([(lo, -1)] if lo is not None else []) + ([(hi, -1)] if est != "k1" else [])
    band = KAPPA * eps * 8.0 * max(1.0, t if level == "seq_sum" else 1.0)
    offsets = (0.0, band / 64, -band / 64, 64 * band, -64 * band, 1e-3, -1e-3)
    rows = [i for i in range(b) if mask[i].any()]
    for i in rows:
        if rng.random() < 0.25:
            continue
        target, sign = targets[int(rng.integers(0, len(targets)))]
        off = offsets[int(rng.integers(0, len(offsets)))]
        valid = np.flatnonzero(mask[i])
        if level in ("token", "seq_all", "seq_max"):
            for j in rng.choice(valid, size=max(1, len(valid) // 3), replace=False):
                delta[i, j] = _inverse(est, target + off * max(1.0, abs(target)), sign)
            if level == "seq_max":  # the others below the max
                keep_small = [j for j in valid if abs(delta[i, j]) > abs(_inverse(est, target, sign)) * 1.01]
                for j in keep_small:
                    delta[i, j] *= 0.5
        else:
            goal = (target + off * max(1.0, abs(target))) * (len(valid) if level == "seq_mean" else 1.0)
            if est == "k1":
                delta[i, valid] += (goal - delta[i, valid].sum()) / len(valid)
            else:  # Σ s(c·Δ) = goal by bisection on c ≥ 0 (s convex, minimal at 0)
                base = np.where(np.abs(delta[i, valid]) < 1e-6, 1e-3, delta[i, valid])
                fn = (lambda d: 0.5 * d * d) if est == "k2" else (lambda d: np.expm1(d) - d)
                c_lo, c_hi = 0.0, 1.0
                while fn(c_hi * base).sum() < goal and c_hi < 1e6:
                    c_hi *= 2
                for _ in range(200):
                    c = 0.5 * (c_lo + c_hi)
                    c_lo, c_hi = (c, c_hi) if fn(c * base).sum() < goal else (c_lo, c)
                delta[i, valid] = 0.5 * (c_lo + c_hi) * base
    if rng.random() < 0.5:  # overflow-range log-ratios (beyond the ±20 clamp)
        for i in rows:
            valid = np.flatnonzero(mask[i])
            if rng.random() < 0.5 or len(valid) == 0:
                continue
            j = int(rng.choice(valid))
            x = rng.choice([-1.0, 1.0]) * rng.uniform(20.5, 25.0)
            delta[i, j] = x
            others = [k for k in valid if k != j]
            if others and level in ("seq_sum", "seq_mean"):  # an opposite one: the row's exact sum stays ordinary
                k = int(rng.choice(others))
                delta[i, k] = -x + rng.uniform(-3.0, 3.0)
    return delta


@st.composite
def inputs(draw, dtype: str, variant: str, data: str):
    """``{"log_prob", "old_log_prob": [B, T] float64 exact in dtype (≤ 0), "mask": [B, T] bool (right-padded
    or multi-turn rows, rows with no valid token allowed, at least one valid token), "garbage", "variant"}``,
    B ≤ 8, T ≤ 64 (module doc for the regimes)."""
    b = draw(st.integers(1, 8))
    t = draw(st.sampled_from([1, 4, 16, 64]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    lengths = rng.integers(0, t + 1, size=b)
    lengths[rng.integers(0, b)] = rng.integers(1, t + 1)
    # multi-turn rows in two examples of three (rows with no valid token matter to the metrics)
    mask = S.multi_turn_mask(rng, b, t) if draw(st.integers(0, 2)) else S.loss_masks(draw, rng, b, t, lengths)
    if not mask.any():
        mask[rng.integers(0, b), rng.integers(0, t)] = True
    old = np.log(rng.uniform(0.05, 1.0, (b, t)))
    if data == "underflow":
        delta = rng.uniform(-30.0, -12.0, (b, t))
    else:
        delta = rng.uniform(-1.0, 1.0, (b, t)) * draw(st.sampled_from([1e-3, 0.1, 1.0]))
        if draw(st.integers(0, 3)) > 0:
            delta = _place(rng, delta, mask, variant, dtype)
        else:  # the example shrinking prefers: every token ratio clear of the token bounds (NEAR_BOUND)
            delta = _clear_of_bounds(delta, variant)
    old = np.where(delta > 0, np.minimum(old, -delta - rng.uniform(0.05, 0.5, (b, t))), old)
    lp = old + delta
    return {"log_prob": S.round_to(lp, dtype), "old_log_prob": S.round_to(old, dtype), "mask": mask,
            "garbage": draw(st.sampled_from(GARBAGE)), "variant": variant}


def strategy(op: OpInfo, dtype: str, regime: str):
    variant, data = split_regime(regime)
    return inputs(dtype, variant, data)


# ------------------------------------------------------------------------------------ reference
def decided(variant: str, lp, old, mask, dtype: str):
    """(reference kept [B, T] float64, decided [B, T] bool): ``decided`` is False at the valid tokens whose
    decision lies within the rounding band of a bound (module doc), where either value passes."""
    eps = KAPPA * COMPUTE_EPS[dtype]
    m = np.asarray(mask, bool)
    keep = R.rollout_rejection_mask(lp, old, m, VARIANTS[variant])
    wide, narrow = m.copy(), m.copy()
    for level, est, lower, upper in VARIANTS[variant]:
        s, a = R.rejection_statistics(lp, old, m, level, est)
        lo, hi = _log_bounds(est, lower, upper)
        w_in = s <= hi + eps * (a + abs(hi))
        n_in = s <= hi - eps * (a + abs(hi))
        if lo is not None:
            w_in &= s >= lo - eps * (a + abs(lo))
            n_in &= s >= lo + eps * (a + abs(lo))
        if level == "seq_all":
            w_in = np.broadcast_to((w_in | ~m).all(-1, keepdims=True), m.shape)
            n_in = np.broadcast_to((n_in | ~m).all(-1, keepdims=True), m.shape)
        wide &= w_in
        narrow &= n_in
    return keep, (wide == narrow) | ~m


def reference_metrics(lp, old, mask, kept, **conventions) -> dict:
    """:func:`rlconform.reference.rollout_correction_metrics` at the IS cap :data:`IS_CAP`; ``conventions``: the
    reference keyword arguments of the binding's declared conventions (verl's ``log_ratio_clamp=20``)."""
    return R.rollout_correction_metrics(lp, old, mask, kept, is_cap=IS_CAP, **conventions)


def faithful(variant: str):
    """The reference engine's ``variant``: the float64 reference, the mask in the input dtype, metrics as
    Python floats."""

    def rollout_rejection_mask(log_prob, old_log_prob, mask):
        lp, old, m = as_numpy(log_prob), as_numpy(old_log_prob), mask.detach().cpu().numpy().astype(bool)
        kept = R.rollout_rejection_mask(lp, old, m, VARIANTS[variant])
        return torch.from_numpy(kept).to(log_prob.dtype), reference_metrics(lp, old, m, kept)

    rollout_rejection_mask.__qualname__ = f"reference.rollout_rejection_mask[{variant}]"
    return rollout_rejection_mask


def reference_variants() -> Variants:
    return Variants({v: faithful(v) for v in VARIANTS})


# ------------------------------------------------------------------------------------ evaluation
def _call(fn, lp64, old64, mask, dtype, ev, label):
    lp, old = to_tensor(lp64, dtype), to_tensor(old64, dtype)
    out = call_engine(OP, fn, lp, old, torch.from_numpy(mask.copy()))
    if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], dict)):
        ev.problems.append(problem_clause("missing output", f"{label}the engine returned {type(out).__name__}, expected (kept mask, metrics dict)"))
        return None
    kept = np.asarray(as_numpy(out[0]), dtype=np.float64)
    problem = shape_problem(f"{label}kept mask", kept, mask.shape)
    if problem:
        ev.problems.append(problem)
        return None
    return kept, dict(out[1])


def _compared(label, got, keep, ok, metrics_ref, metrics_fa, keys, ev, required=()) -> list[Compared]:
    kept, metrics = got
    res = [Compared(f"{label}kept mask", kept, keep, keep, "float64", "pipeline", only_where=ok)]
    for key in keys:
        if key not in metrics:
            if key in required:
                ev.problems.append(problem_clause("lost metric", f"{label}metric {key!r} missing: the engine logged "
                                                                  f"{sorted(metrics)}", key=f"metric {key}"))
            res.append(Compared(f"{label}metric {key}", np.float64(np.nan), np.float64(metrics_ref[key]),
                                np.float64(metrics_fa[key]), "float32", "pipeline", only_where=np.zeros(1, bool),
                                quantity="metric"))
            continue
        res.append(Compared(f"{label}metric {key}", np.float64(float(metrics[key])), np.float64(metrics_ref[key]),
                            S.round_to(np.float64(metrics_fa[key]), "float32"), "float32", "pipeline", quantity="metric"))
    return res


def evaluate(binding, case) -> Evaluation:
    fn, mask, lp64, old64, ev = L.prepare(binding, case, OP,
                                          "no valid token: nothing to keep or reject, no metric is defined")
    if ev.undefined:
        return ev
    if case.property == NON_DESTRUCTIVE:
        return L.guarded_call(OP, fn, lp64, old64, mask, case.dtype, ev, differentiable=False)
    variant = case.inputs["variant"]
    keep, ok = decided(variant, lp64, old64, mask, case.dtype)
    got = _call(fn, lp64, old64, mask, case.dtype, ev, "")
    if got is None:
        return ev
    kept = got[0]
    if not np.isin(kept[~ok], (0.0, 1.0)).all():
        odd = kept[~ok][~np.isin(kept[~ok], (0.0, 1.0))][0]
        ev.problems.append(problem_clause("missing output", f"kept mask: at a boundary token the engine returned "
                                                            f"{odd!r}, neither 0 nor 1"))
    effective = np.where(ok, keep, kept)  # at the boundary the engine's decision stands
    from rlconform.harness.core.declared import followed

    conv = followed(getattr(binding, "declared", ()), OP, case.regime)  # a declared clamp of the log-ratio
    ref_m = reference_metrics(lp64, old64, mask, effective, **conv)
    shift = COMPUTE_EPS[case.dtype] * (np.abs(np.where(mask, lp64, 0.0)) + np.abs(np.where(mask, old64, 0.0)))
    fa_m = dict(ref_m)
    for sign in (1.0, -1.0):
        moved = reference_metrics(np.where(mask, lp64 + sign * shift, lp64), old64, mask, effective, **conv)
        fa_m = {k: (moved[k] if abs(moved[k] - ref_m[k]) > abs(fa_m[k] - ref_m[k]) else fa_m[k]) for k in ref_m}
    required = required_metrics(variant)
    keys = sorted(k for k in ref_m if k in got[1] or k in required)
    ev.values = _compared("", got, keep, ok, ref_m, fa_m, keys, ev, required)
    if case.property == MASK_INVARIANT:
        prefix, label, lp_g, old_g = L.with_garbage(case, mask, lp64, old64)
        alt = _call(fn, lp_g, old_g, mask, case.dtype, ev, prefix)
        if alt is not None:
            ev.alternatives.append((label, _compared(prefix, alt, keep, ok, ref_m, fa_m, keys, ev, required)))
    return ev


#: the metrics compute_offpolicy_metrics-like code takes per row, then averages over the batch's rows
ROW_METRICS = ("chi2_seq", "training_ppl", "rollout_ppl", "log_ppl_diff", "ppl_ratio", "rs_seq_masked_fraction")
#: the epsilon masked_mean-style reductions add to the count (verl: ``mask.sum() + 1e-8``)
COUNT_EPS = 1e-8


def _mask_trigger(x, m, d) -> str | None:
    """Why a token's keep decision differs, read from the input: asymmetric k1 bounds, a clamped token
    before a sequence sum, a row statistic within the count's ε of a bound."""
    variant = x.get("variant")
    for level, est, lower, upper in VARIANTS.get(variant, ()):
        if est == "k1" and level in ("token", "seq_mean", "seq_sum") and abs(lower * upper - 1.0) > 1e-12:
            lo, hi = math.log(lower), math.log(upper)
            stat = _row_stat(d, m, level)
            flips = m & (((stat >= lo) & (stat <= hi)) != ((-stat >= lo) & (-stat <= hi)))
            if flips.any():
                r = np.exp(stat[flips])
                tie = _at_bound(r, (lower, upper))
                if tie:  # the flip is the last bits of a ratio on a bound, not the inverse reading
                    return tie
                return ("asymmetric k1 bounds (lower ≠ 1/upper) read as bounds of the inverse ratio"
                        + _near_bound(r, (lower, upper, 1.0 / upper, 1.0 / lower)))
        if level == "seq_sum" and (m & (np.abs(d) > 20)).any():
            return "a log-ratio beyond ±20 in a sequence sum (each token clamped before the sum)"
        if level == "seq_mean":
            stat = _row_stat(d, m, level)
            near = np.zeros_like(m)
            for bound in ((math.log(lower), math.log(upper)) if est == "k1" else (upper,)):
                for b in (bound, -bound) if est == "k1" else (bound,):
                    near |= m & (np.abs(stat - b) <= 2 * COUNT_EPS * abs(stat) + 1e-300)
            if near.any():
                return "a row mean within 1e-8 of a bound (masked_mean's count + 1e-8)"
    return None


#: a ratio within this relative distance of a bound reads like a rounding tie: the row says so
NEAR_BOUND = 0.1


#: a ratio this close (relative) to a bound is decided by its last bits: float32 against float64 rounding
AT_BOUND = 1e-6


def _at_bound(r, bounds) -> str | None:
    """``"a ratio on a bound (r = 1.5 vs 1.5): decided by its rounding"`` when every deciding ratio ``r`` lies
    within :data:`AT_BOUND` (relative) of one of ``bounds``, else None."""
    b = np.asarray(bounds, dtype=np.float64)
    dist = np.min(np.abs(np.asarray(r, dtype=np.float64)[:, None] - b) / b, axis=1)
    if not (dist < AT_BOUND).all():
        return None
    nearest = b[int(np.argmin(np.abs(r[0] - b) / b))]
    return f"a ratio on a bound (r = {r[0]:.9g} vs {nearest:.4g}): decided by its rounding"


def _near_bound(r, bounds) -> str:
    """``", near a bound: r = 0.7998 vs 0.8"`` when every deciding ratio ``r`` lies within :data:`NEAR_BOUND`
    (relative) of one of ``bounds`` (the declared ones and their inverses), else nothing."""
    b = np.asarray(bounds, dtype=np.float64)
    dist = np.min(np.abs(np.asarray(r, dtype=np.float64)[:, None] - b) / b, axis=1)
    i = int(np.argmax(dist))
    if dist[i] >= NEAR_BOUND:
        return ""
    nearest = b[int(np.argmin(np.abs(r[i] - b) / b))]
    return f", near a bound: r = {r[i]:.4g} vs {nearest:.4g}"


def _clear_of_bounds(delta, variant: str):
    """``delta`` with every token log-ratio whose ratio lies within :data:`NEAR_BOUND` (relative) of a token k1
    bound of ``variant`` or of its inverse moved just past that band: an example that needs no token on a bound
    (the asymmetric-bounds flip: r = 1.75 kept against [0.5, 1.5]) reads as what it is, not as a rounding tie."""
    out = np.array(delta, dtype=np.float64)
    for level, est, lower, upper in VARIANTS.get(variant, ()):
        if level != "token" or est != "k1":
            continue
        for b in {lower, upper, 1.0 / lower, 1.0 / upper}:
            lo, hi = math.log(b * (1 - NEAR_BOUND)), math.log(b * (1 + NEAR_BOUND))
            inside = (out > lo) & (out < hi)
            out = np.where(inside, np.where(out >= math.log(b), hi + 1e-3, lo - 1e-3), out)
    return out


def _row_stat(d, m, level):
    if level == "token":
        return d
    n = np.maximum(m.sum(-1, keepdims=True), 1)
    s = np.where(m, d, 0.0).sum(-1, keepdims=True)
    return np.broadcast_to(s / n if level == "seq_mean" else s, d.shape)


def trigger(case, clauses, kind: str):
    """The shrunk input's feature a maintainer reads, for the output that fails first (the kept mask, then
    the per-row metrics, then the IS metrics): asymmetric k1 bounds, a clamped token in a sequence sum, a row
    mean at masked_mean's ε from a bound; a row with no valid token (per-row metrics averaged over every
    row); IS weights at the scale of ESS's + 1e-8; an overflow-range log-ratio."""
    x = case.inputs
    m = np.asarray(x["mask"], bool)
    d = np.where(m, np.asarray(x["log_prob"], np.float64) - np.asarray(x["old_log_prob"], np.float64), 0.0)
    failing = failing_labels(clauses)
    if "kept mask" in failing:
        found = _mask_trigger(x, m, d)
        if found:
            return found
    if any(f.removeprefix("metric ") in ROW_METRICS for f in failing) and (~m.any(-1)).any():
        return "a row with no valid token (e.g. a multi-turn row of observation tokens only)"
    if "metric is_ess" in failing:
        w = np.minimum(np.exp(np.clip(d[m], -20.0, 20.0)), IS_CAP)
        if w.size and w.mean() < 1e3 * COUNT_EPS:
            return "IS weights within 1000× of ESS's + 1e-8 (every |log-ratio| ≳ 11)"
    if any(c.quantity == "metric" or c.kind == "metric" for c in clauses) and (~m.any(-1)).any():
        return "a row with no valid token (e.g. a multi-turn row of observation tokens only)"
    if (np.abs(d) > 20).any():
        return "a log-ratio beyond the engines' ±20 clamp"
    return None


FAMILY = OpFamily("rejection_mask", OPS, strategy, evaluate, order=58, trigger=trigger,
                  doc="rollout-correction rejection masks (token / sequence / geometric / k2 / k3 bounds) and "
                      "their IS / off-policy diagnostics")
