"""Self-tests of the policy-loss family of rlconform.reference: kl_estimator, importance_ratio,
policy_loss (every variant), value_loss, and their closed-form gradients.

Values are checked against mpmath at 50 digits, written here from the formulas (the module docs and
the engines' source), never by calling the reference; gradients against mpmath central differences
(``mpmath.diff``) of those formulas, with stop-gradient quantities frozen at the evaluation point as
the engines' ``detach()`` does. Inputs: small batches (B ≤ 3, T ≤ 4) drawn by hypothesis in three
regimes — moderate log-ratios, log-ratios up to ±100 (fp32 values, where exp overflows fp32), and
log-ratios within 1e-7 of 0 — with masked positions holding garbage. Hand-computed cases and the masked-numerator
and NaN·0 rows of docs/bug-kinds.md close the file. Tolerances are in units of eps = 2**-53 times the scale of the
terms that are summed (the condition of the sum), far below any formula error.
"""

from __future__ import annotations

import inspect
import math

import mpmath
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rlconform.reference as R

EPS = 2.0**-53
DPS = 50
SETTINGS = settings(max_examples=30, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
GARBAGE = (math.nan, math.inf, -math.inf, 1e30, -1e30)

mp = mpmath.mp
mp.dps = DPS


def M(x):
    return mpmath.mpf(float(x))


# --------------------------------------------------------------------------------------------------
# inputs


@st.composite
def batches(draw, max_b=3, max_t=4):
    """(old, lp, A, mask) float64 [B, T] with garbage at masked positions, and the regime name."""
    b = draw(st.integers(1, max_b))
    t = draw(st.integers(1, max_t))
    regime = draw(st.sampled_from(["moderate", "extreme", "tiny"]))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    if regime == "moderate":
        lp = -rng.random((b, t)) * 3.0
        old = np.minimum(lp + rng.normal(0.0, 0.4, (b, t)), 0.0)
    elif regime == "extreme":  # fp32 log-probs in [-100, 0]: log-ratios up to ±100
        lp = -(rng.random((b, t)) * 100.0).astype(np.float32).astype(np.float64)
        old = -(rng.random((b, t)) * 100.0).astype(np.float32).astype(np.float64)
    else:  # log-ratios within ~1e-7 of 0
        lp = -rng.random((b, t)) * 3.0 - 1e-3
        old = lp + rng.normal(0.0, 1e-7, (b, t))
    A = rng.normal(0.0, 1.0, (b, t))
    A[rng.random((b, t)) < 0.15] = 0.0
    mask = rng.random((b, t)) < 0.75
    if draw(st.booleans()):
        mask[0, :] = True
    for arr in (old, lp, A):
        arr[~mask] = rng.choice(GARBAGE, size=int((~mask).sum()))
    return old, lp, A, mask, regime


# --------------------------------------------------------------------------------------------------
# mpmath formulas, written from the module docs / engine source


def mp_clamp(x, lo, hi):
    return min(max(x, lo), hi)


def mp_sign(x):
    return int(x > 0) - int(x < 0)


def mp_agg(L, mask, mode, scale=None):
    """agg_loss at DPS digits from a dict {(i, t): mpf} over the valid tokens."""
    b, t = mask.shape
    rows = [[L[(i, j)] for j in range(t) if mask[i, j]] for i in range(b)]
    nnz = sum(len(r) for r in rows)
    n_seq = sum(1 for r in rows if r)
    total = mpmath.fsum(x for r in rows for x in r)
    if mode == "token-sum":
        return total
    if nnz == 0:
        return mpmath.mpf("nan")
    if mode == "token-mean":
        return total / nnz
    if mode == "seq-mean-token-sum":
        return total / n_seq
    if mode == "seq-mean-token-mean":
        return mpmath.fsum(mpmath.fsum(r) / len(r) for r in rows if r) / n_seq
    return total / (n_seq * M(t if scale is None else scale))


def mp_agg_weight(mask, mode, i, scale=None):
    b, t = mask.shape
    nnz = int(mask.sum())
    n_seq = int((mask.sum(axis=1) > 0).sum())
    return {"token-mean": M(1) / nnz, "token-sum": M(1), "seq-mean-token-sum": M(1) / n_seq,
            "seq-mean-token-mean": M(1) / (n_seq * int(mask[i].sum())),
            "seq-mean-token-sum-norm": M(1) / (n_seq * M(t if scale is None else scale))}[mode]


class P:
    """The variant's parameters with the reference's defaults (verl's)."""

    def __init__(self, **kw):
        self.el = kw.get("clip_ratio_low", 0.2)
        self.eh = kw.get("clip_ratio_high", 0.2)
        self.c = kw.get("clip_ratio_c", 3.0)
        self.clamp = kw.get("log_ratio_clamp", None)
        self.tau_pos = kw.get("tau_pos", 1.0)
        self.tau_neg = kw.get("tau_neg", 1.05)
        self.cc_ratio = kw.get("clip_cov_ratio", 0.0002)
        self.cc_lb = kw.get("clip_cov_lb", 1.0)
        self.cc_ub = kw.get("clip_cov_ub", 5.0)
        self.kc_ratio = kw.get("kl_cov_ratio", 0.0002)
        self.kl_coef = kw.get("ppo_kl_coef", 0.1)
        self.beta = kw.get("dro_beta", None)
        self.eta = kw.get("dppo_eps", 1e-8)
        self.sel = kw.get("cov_selected", None)


def mp_clamp_pair(p):
    if p.clamp is None:
        return -mpmath.inf, mpmath.inf
    if isinstance(p.clamp, tuple):
        lo, hi = p.clamp
        return (-mpmath.inf if lo is None else M(lo)), (mpmath.inf if hi is None else M(hi))
    return -M(p.clamp), M(p.clamp)


def mp_cov(A, lp0, mask):
    idx = [tuple(ij) for ij in np.argwhere(mask)]
    n = len(idx)
    ma = mpmath.fsum(M(A[ij]) for ij in idx) / n
    ml = mpmath.fsum(M(lp0[ij]) for ij in idx) / n
    return {ij: (M(A[ij]) - ma) * (M(lp0[ij]) - ml) for ij in idx}


def mp_binary_kl(l, o, eta):
    p, po = mpmath.exp(l), mpmath.exp(o)
    return po * (o - l) + (1 - po) * mpmath.log((1 - po + M(eta)) / (1 - p + M(eta)))


def mp_policy_loss(variant, old, lp, A, mask, lp0, p, mode, scale=None, perturb=None):
    """The aggregated loss at DPS digits (see mp_policy_terms)."""
    terms = mp_policy_terms(variant, old, lp, A, mask, lp0, p, perturb)
    if variant == "geo_mean":
        return mpmath.fsum(terms.values()) / mask.shape[0]
    return mp_agg(terms, mask, mode, scale)


def mp_policy_terms(variant, old, lp, A, mask, lp0, p, perturb=None):
    """{(i, t): per-token loss} at DPS digits ({i: row loss} for geo_mean), with log_prob[perturb[0]]
    = the mpf perturb[1] (for mpmath.diff); stop-gradient quantities and selections are evaluated
    at lp0 (the unperturbed point)."""
    b, t = mask.shape
    lo, hi = mp_clamp_pair(p)
    idx = [tuple(ij) for ij in np.argwhere(mask)]

    def L_(ij):
        return perturb[1] if perturb is not None and ij == perturb[0] else M(lp[ij])

    one = M(1)
    el, eh = M(p.el), M(p.eh)
    terms = {}
    if variant == "geo_mean":
        rows = {}
        for i in range(b):
            row = [ij for ij in idx if ij[0] == i]
            if not row:
                continue
            ms = []
            for ij in row:
                d = mp_clamp(L_(ij) - M(old[ij]), lo, hi)
                s = mp_sign(A[ij])
                ms.append(s * min(s * d, s * mp_clamp(d, -el, eh)))
            rho = mpmath.exp(mpmath.fsum(ms) / len(row))
            adv = mpmath.fsum(M(A[ij]) for ij in row) / len(row)
            rows[i] = -adv * rho
        return rows
    sel = set()
    if variant in ("clip_cov", "kl_cov") and idx:
        cov = mp_cov(A, lp0, mask)
        if p.sel is not None:
            sel = {tuple(ij) for ij in np.argwhere(p.sel)}
        elif variant == "clip_cov":
            cand = []
            for ij in idx:
                r0 = mpmath.exp(mp_clamp(M(lp0[ij]) - M(old[ij]), lo, hi))
                a = M(A[ij])
                clipped = -a * mp_clamp(r0, one - el, one + eh) > -a * r0
                if not clipped and M(p.cc_lb) < cov[ij] < M(p.cc_ub):
                    cand.append(ij)
            assert len(cand) <= max(int(p.cc_ratio * len(idx)), 1)
            sel = set(cand)
        else:
            k = min(max(1, int(len(idx) * p.kc_ratio)), len(idx))
            sel = set(sorted(idx, key=lambda ij: -cov[ij])[:k])
    if variant == "gspo":
        dbar = {}
        for i in range(b):
            row = [ij for ij in idx if ij[0] == i]
            if row:
                dbar[i] = mpmath.fsum(M(lp0[ij]) - M(old[ij]) for ij in row) / len(row)
    for ij in idx:
        l, o, a = L_(ij), M(old[ij]), M(A[ij])
        l0 = M(lp0[ij])
        if variant == "gspo":
            r = mpmath.exp(mp_clamp(dbar[ij[0]] + (l - l0), lo, hi))
        else:
            r = mpmath.exp(mp_clamp(l - o, lo, hi))
        r0 = mpmath.exp(mp_clamp(l0 - o, lo, hi))
        if variant in ("vanilla", "gspo", "clip_cov"):
            L = max(-a * r, -a * mp_clamp(r, one - el, one + eh))
            if variant == "vanilla" and p.c is not None and a < 0:
                L = min(-a * M(p.c), L)
            if variant == "clip_cov" and ij in sel:
                L = M(0)
        elif variant == "sapo":
            tau = M(p.tau_pos) if a > 0 else M(p.tau_neg)
            L = -a * (4 / tau) / (1 + mpmath.exp(-tau * (r - 1)))
        elif variant == "gpg":
            L = -a * l
        elif variant == "cross_entropy":
            L = -l
        elif variant == "importance_sampling":
            L = -a * r
        elif variant == "kl_cov":
            L = -a * r + (M(p.kl_coef) * abs(mp_clamp(l - o, lo, hi)) if ij in sel else 0)
        elif variant == "dro":
            d = mp_clamp(l - o, lo, hi)
            L = -(a * l - M(p.beta) / 2 * d * d)
        elif variant == "cispo":
            L = -mp_clamp(r0, one - el, one + eh) * a * l
        elif variant == "rollout_is":
            cr = r0 if (one - el < r0 < one + eh) else M(0)
            L = -cr * a * l
        elif variant.startswith("dppo"):
            pr, po = mpmath.exp(l0), mpmath.exp(o)
            diff = pr - po
            if variant == "dppo_tv":
                v = (diff <= eh) if a > 0 else (diff >= -el)
            elif variant == "dppo_kl":
                D = mp_binary_kl(l0, o, p.eta)
                v = (D <= eh or pr <= po) if a > 0 else (D <= el or pr >= po)
            elif variant == "dppo_binary_tv":
                v = not ((a > 0 and diff > eh) or (a < 0 and -diff > el))
            else:
                D = mp_binary_kl(l0, o, p.eta)
                v = not ((a > 0 and diff > 0 and D > eh) or (a < 0 and diff < 0 and D > el))
            if variant in ("dppo_tv", "dppo_kl"):
                tr = r0 if p.c is None else min(r0, M(p.c))
                L = -a * tr * l * int(v)
            else:
                L = -r * a * int(v)
        else:
            raise AssertionError(variant)
        terms[ij] = L
    return terms


# --------------------------------------------------------------------------------------------------
# comparison helpers


def close(got, ref, scale, ulps, what):
    """|got − ref| ≤ ulps·eps·scale (scale ≥ |ref|); ref an mpf."""
    ref_f = float(ref)
    if math.isnan(ref_f):
        assert math.isnan(got), f"{what}: got {got!r}, expected nan"
        return
    assert math.isfinite(got), f"{what}: got {got!r}, expected {ref_f!r}"
    e = abs(M(got) - ref)
    # below float64's normal range ulps count subnormal quanta (2**-1074 each): a value there carries fewer digits
    bound = max(ulps * EPS * max(float(scale), abs(ref_f)), ulps * 2.0**-1074)
    assert e <= bound, f"{what}: got {got!r}, expected {mpmath.nstr(ref, 20)} (err {float(e):.3g} > {bound:.3g})"


VARIANT_KW = {
    "vanilla": [dict(), dict(clip_ratio_c=None), dict(log_ratio_clamp=20.0)],
    "gspo": [dict(), dict(log_ratio_clamp=(None, 10.0))],
    "sapo": [dict(), dict(log_ratio_clamp=20.0, tau_pos=2.0, tau_neg=0.5)],
    "gpg": [dict()],
    "cross_entropy": [dict()],
    "importance_sampling": [dict()],
    "clip_cov": [dict(clip_cov_ratio=1.0, clip_cov_lb=-1.0, clip_cov_ub=1.0)],
    "kl_cov": [dict(kl_cov_ratio=0.3), dict(kl_cov_ratio=0.5, ppo_kl_coef=1.0)],
    "geo_mean": [dict(), dict(clip_ratio_low=0.4, clip_ratio_high=0.3)],
    "dro": [dict(dro_beta=0.7)],
    "cispo": [dict(log_ratio_clamp=20.0), dict(clip_ratio_low=1.0, clip_ratio_high=4.0)],
    "dppo_tv": [dict(clip_ratio_low=0.05, clip_ratio_high=0.05, log_ratio_clamp=20.0), dict(clip_ratio_c=None)],
    "dppo_kl": [dict(clip_ratio_low=0.01, clip_ratio_high=0.02, clip_ratio_c=1.5)],
    "dppo_binary_tv": [dict(clip_ratio_low=0.05, clip_ratio_high=0.05)],
    "dppo_binary_kl": [dict(clip_ratio_low=0.01, clip_ratio_high=0.02, log_ratio_clamp=20.0)],
    "rollout_is": [dict(log_ratio_clamp=20.0)],
}


def test_every_variant_has_cases():
    assert set(VARIANT_KW) == set(R.POLICY_LOSS_VARIANTS)


def cond_factor(old, lp, mask, ij):
    """2 + |Δ_t| + |Δ̄_i|: exp amplifies the rounding of a log-ratio by its size (the row mean Δ̄_i
    for gspo and geo_mean is rounded once before exp)."""
    row = [tuple(kl) for kl in np.argwhere(mask) if kl[0] == ij[0]]
    dbar = mpmath.fsum(M(lp[kl]) - M(old[kl]) for kl in row) / len(row)
    return 2 + abs(M(lp[ij]) - M(old[ij])) + abs(dbar)


def addend_scales(variant, old, lp, A, mask, p, ij, term):
    """(Σ|addends| of the per-token term, Σ|addends| of its derivative or None for a product, whose
    rounding is relative to itself). geo_mean: the row term, with Ā's addends in absolute value."""
    a, l = M(A[ij]), M(lp[ij])
    lo, hi = mp_clamp_pair(p)
    d = mp_clamp(l - M(old[ij]), lo, hi)
    if variant == "kl_cov":
        r = mpmath.exp(d)
        return abs(a) * r + M(p.kl_coef) * abs(d), abs(a) * r + M(p.kl_coef)
    if variant == "dro":
        return abs(a * l) + M(p.beta) / 2 * d * d, abs(a) + M(p.beta) * abs(d)
    if variant == "geo_mean":
        row = [tuple(kl) for kl in np.argwhere(mask) if kl[0] == ij[0]]
        adv = mpmath.fsum(M(A[kl]) for kl in row) / len(row)
        abs_adv = mpmath.fsum(abs(M(A[kl])) for kl in row) / len(row)
        scale = abs(term) * abs_adv / abs(adv) if adv != 0 else abs_adv * mpmath.exp(
            mpmath.fsum(abs(M(lp[kl]) - M(old[kl])) for kl in row) / len(row))
        return scale, scale / len(row)
    return abs(term), None


@pytest.mark.parametrize("variant", R.POLICY_LOSS_VARIANTS)
@SETTINGS
@given(data=batches(), mode=st.sampled_from(MODES), pick=st.integers(0, 9))
def test_policy_loss_value_grad_metrics_vs_mpmath(variant, data, mode, pick):
    old, lp, A, mask, regime = data
    kw = VARIANT_KW[variant][pick % len(VARIANT_KW[variant])]
    if variant == "kl_cov" and mask.any():
        # make the top-k unambiguous: ties of the covariance would leave the engine's pick open
        cov = mp_cov(A, lp, mask)
        vals = sorted(cov.values(), reverse=True)
        k = min(max(1, int(len(vals) * kw["kl_cov_ratio"])), len(vals))
        if k < len(vals) and vals[k - 1] == vals[k]:
            return
    p = P(**kw)
    ok_mode = mode if variant != "geo_mean" else "token-mean"
    loss, metrics = R.policy_loss(old, lp, A, mask, variant=variant, loss_agg_mode=ok_mode, **kw)
    grad = R.policy_loss_grad(old, lp, A, mask, variant=variant, loss_agg_mode=ok_mode, **kw)
    ref = mp_policy_loss(variant, old, lp, A, mask, lp, p, ok_mode)
    base_terms = mp_policy_terms(variant, old, lp, A, mask, lp, p)
    idx = [tuple(ij) for ij in np.argwhere(mask)]
    if variant == "geo_mean":
        firsts = {ij[0]: ij for ij in reversed(idx)}
        scale = mpmath.fsum(addend_scales(variant, old, lp, A, mask, p, ij, base_terms[i])[0]
                            * cond_factor(old, lp, mask, ij) for i, ij in firsts.items()) / mask.shape[0]
    else:
        scale = mpmath.fsum(mp_agg_weight(mask, ok_mode, ij[0]) * addend_scales(variant, old, lp, A, mask, p, ij,
                                                                                base_terms[ij])[0]
                            * cond_factor(old, lp, mask, ij) for ij in idx)
    close(loss, ref, scale, 64, f"{variant} {ok_mode} loss")

    assert grad.shape == mask.shape and grad.dtype == np.float64
    assert (grad[~mask] == 0).all(), "masked positions must get gradient exactly 0"
    for ij in idx:
        # only the perturbed token's term (its row's, for geo_mean) depends on it: differentiate that
        # term alone (a batch sum of 1e43-sized terms would drown a 1e-44 derivative at 50 digits)
        key = ij[0] if variant == "geo_mean" else ij
        w = M(1) / mask.shape[0] if variant == "geo_mean" else mp_agg_weight(mask, ok_mode, ij[0])
        # sapo's gate σ(τ(r − 1)) is 1 − 1e-300 for large r: its derivative needs ~330 digits to resolve
        with mpmath.workdps(360 if variant == "sapo" else DPS):
            dref = w * mpmath.diff(lambda x: mp_policy_terms(variant, old, lp, A, mask, lp, p, perturb=(ij, x))[key],
                                   M(lp[ij]))
        _, addends = addend_scales(variant, old, lp, A, mask, p, ij, base_terms[key])
        gscale = (abs(dref) if addends is None else w * addends) * cond_factor(old, lp, mask, ij)
        close(float(grad[ij]), dref, float(gscale), 64, f"{variant} {ok_mode} grad{ij}")

    # metrics: totals over valid tokens, counts = nnz
    nnz = int(mask.sum())
    for key, sc in metrics.items():
        assert isinstance(sc, R.SumCount) and sc.count == nnz, (key, sc)
    d = np.where(mask, lp, 0.0) - np.where(mask, old, 0.0)
    lo, hi = mp_clamp_pair(p)
    dc = [mp_clamp(M(d[ij]), lo, hi) for ij in map(tuple, np.argwhere(mask))]
    if "ppo_kl" in metrics:
        raw = variant in ("gspo", "geo_mean")
        vals = [M(-d[ij]) for ij in map(tuple, np.argwhere(mask))] if raw else [-x for x in dc]
        close(metrics["ppo_kl"].total, mpmath.fsum(vals), sum(abs(float(v)) for v in vals) + 1, 8, "ppo_kl")
    if "ppo_kl_abs" in metrics:
        close(metrics["ppo_kl_abs"].total, mpmath.fsum(abs(x) for x in dc), 1, 8, "ppo_kl_abs")
    if variant == "vanilla":
        el, eh = M(p.el), M(p.eh)
        n_clip = n_low = 0
        for ij, x in zip(map(tuple, np.argwhere(mask)), dc):
            r, a = mpmath.exp(x), M(A[ij])
            l1, l2 = -a * r, -a * mp_clamp(r, 1 - el, 1 + eh)
            n_clip += l2 > l1
            n_low += a < 0 and max(l1, l2) > -a * M(p.c) if p.c is not None else 0
        assert metrics["pg_clipfrac"].total == n_clip
        if p.c is not None:
            assert metrics["pg_clipfrac_lower"].total == n_low
        else:
            assert "pg_clipfrac_lower" not in metrics
    if variant in ("cispo", "importance_sampling"):
        close(metrics["ratio_mean"].total, mpmath.fsum(mpmath.exp(x) for x in dc),
              float(mpmath.fsum(mpmath.exp(x) for x in dc)), 8, "ratio_mean")


# --------------------------------------------------------------------------------------------------
# masked garbage: nothing at a masked position reaches a value, a metric or a gradient


def _clean_copy(x, mask, fill):
    y = np.array(x, dtype=np.float64, copy=True)
    y[~mask] = fill
    return y


@pytest.mark.parametrize("variant", R.POLICY_LOSS_VARIANTS)
@pytest.mark.parametrize("garbage", GARBAGE)
def test_policy_loss_ignores_masked_garbage(variant, garbage):
    rng = np.random.default_rng(7)
    lp = -rng.random((3, 5)) * 2
    old = np.minimum(lp + rng.normal(0, 0.3, (3, 5)), 0)
    A = rng.normal(0, 1, (3, 5))
    mask = rng.random((3, 5)) < 0.6
    mask[2] = False  # an empty row
    mask[0, 0] = True
    kw = dict(VARIANT_KW[variant][0])
    if variant == "clip_cov":
        kw.update(clip_cov_ratio=1.0)
    clean = [_clean_copy(x, mask, -0.5) for x in (old, lp, A)]
    dirty = [_clean_copy(x, mask, garbage) for x in (old, lp, A)]
    weights_clean = _clean_copy(np.full((3, 5), 0.7), mask, 0.5)
    weights_dirty = _clean_copy(np.full((3, 5), 0.7), mask, garbage)
    for mode in ("token-mean", "seq-mean-token-mean"):
        a = R.policy_loss(*clean, mask, variant=variant, loss_agg_mode=mode, rollout_is_weights=weights_clean, **kw)
        b = R.policy_loss(*dirty, mask, variant=variant, loss_agg_mode=mode, rollout_is_weights=weights_dirty, **kw)
        assert a[0] == b[0] and math.isfinite(a[0])
        assert a[1] == b[1]
        ga = R.policy_loss_grad(*clean, mask, variant=variant, loss_agg_mode=mode,
                                rollout_is_weights=weights_clean, **kw)
        gb = R.policy_loss_grad(*dirty, mask, variant=variant, loss_agg_mode=mode,
                                rollout_is_weights=weights_dirty, **kw)
        assert np.array_equal(ga, gb) and (gb[~mask] == 0).all() and np.isfinite(gb).all()


@pytest.mark.parametrize("garbage", GARBAGE)
def test_kl_importance_value_ignore_masked_garbage(garbage):
    rng = np.random.default_rng(3)
    lp, ref, v3 = (-rng.random((2, 4)) for _ in range(3))
    mask = np.array([[1, 1, 0, 1], [0, 0, 0, 0]], bool)
    c = [_clean_copy(x, mask, -0.25) for x in (lp, ref, v3)]
    d = [_clean_copy(x, mask, garbage) for x in (lp, ref, v3)]
    for mode in R.KL_ESTIMATORS:
        for fn in (R.kl_estimator, R.kl_estimator_grad):
            x, y = fn(c[0], c[1], mode, mask=mask), fn(d[0], d[1], mode, mask=mask)
            assert np.array_equal(x, y) and (y[~mask] == 0).all()
    for level in R.IMPORTANCE_LEVELS:
        for fn in (R.importance_ratio, R.importance_ratio_grad):
            x, y = fn(c[0], c[1], mask, level=level, cap=1.5), fn(d[0], d[1], mask, level=level, cap=1.5)
            assert np.array_equal(x, y) and (y[~mask] == 0).all()
    x, y = R.value_loss(*c, mask, 0.1), R.value_loss(*d, mask, 0.1)
    assert x == y
    gx, gy = R.value_loss_grad(*c, mask, 0.1), R.value_loss_grad(*d, mask, 0.1)
    assert np.array_equal(gx, gy) and (gy[~mask] == 0).all()


def test_unmasked_non_finite_raises():
    mask = np.ones((1, 2), bool)
    with pytest.raises(ValueError, match="non-finite unmasked"):
        R.policy_loss([[0.0, math.nan]], [[0.0, 0.0]], [[1.0, 1.0]], mask)
    with pytest.raises(ValueError, match="non-finite"):
        R.kl_estimator([[0.0, math.inf]], [[0.0, 0.0]], "k3")


# --------------------------------------------------------------------------------------------------
# KL estimators


def mp_kl(l, r, mode, clamp=True):
    base = mode.rstrip("+")
    d = l - r
    if base in ("k1", "kl"):
        return d
    if base == "abs":
        return abs(d)
    if base in ("k2", "mse"):
        return d * d / 2
    x = -d
    if clamp:
        x = mp_clamp(x, -20, 20)
    v = mpmath.exp(x) - x - 1
    return min(v, M(10)) if clamp else v


@SETTINGS
@given(data=batches(), mode=st.sampled_from(R.KL_ESTIMATORS), clamp=st.booleans(), go=st.floats(-10, 10))
def test_kl_estimator_vs_mpmath(data, mode, clamp, go):
    _, lp, ref, mask, _ = data
    ref = np.where(mask, np.where(np.isfinite(ref), ref, 0.0) - 0.5, ref)  # ref log-probs near lp
    val = R.kl_estimator(lp, ref, mode, mask=mask, clamp=clamp)
    grad = R.kl_estimator_grad(lp, ref, mode, go, mask=mask, clamp=clamp)
    for ij in map(tuple, np.argwhere(mask)):
        l, r = M(lp[ij]), M(ref[ij])
        want = mp_kl(l, r, mode, clamp)
        close(float(val[ij]), want, abs(float(l - r)) + 1e-300, 8, f"{mode} value")
        if mode.endswith("+"):
            dwant = mpmath.diff(lambda x: (x - r) ** 2 / 2, l)
        elif mode.rstrip("+") == "abs" and l == r:
            dwant = M(0)
        else:
            dwant = mpmath.diff(lambda x: mp_kl(x, r, mode, clamp), l)
        close(float(grad[ij]), dwant * M(go), abs(float(dwant * M(go))) + 1e-300, 8, f"{mode} grad")
    assert (val[~mask] == 0).all() and (grad[~mask] == 0).all()


def test_kl_k3_clamp_and_straight_through_by_hand():
    lp = np.array([[0.0, -1.0, -5.0, -30.0, 0.0]])
    ref = np.array([[0.0, 0.0, 0.0, 0.0, -12.0]])
    k3 = R.kl_estimator(lp, ref, "low_var_kl")
    # Δ = 0, −1, −5, −30, 12: e^{−Δ} − 1 + Δ = 0, e − 2, e⁵ − 6 → 10, 10 (inner clamp 20 → 10),
    # e^{−12} + 11 → 10
    assert k3[0, 0] == 0.0 and abs(k3[0, 1] - (math.e - 2)) < 4 * EPS and (k3[0, 2:] == 10.0).all()
    g = R.kl_estimator_grad(lp, ref, "k3")
    assert g[0, 0] == 0.0 and abs(g[0, 1] - (1 - math.e)) < 8 * EPS and (g[0, 2:] == 0).all()
    unclamped = R.kl_estimator(lp, ref, "k3", clamp=False)
    assert abs(unclamped[0, 3] / (math.exp(30) - 31) - 1) < 4 * EPS
    # straight-through: value of the base mode, gradient Δ
    for base in ("k1", "abs", "k3", "low_var_kl", "kl", "mse"):
        assert np.array_equal(R.kl_estimator(lp, ref, base + "+"), R.kl_estimator(lp, ref, base))
        assert np.array_equal(R.kl_estimator_grad(lp, ref, base + "+"), lp - ref)
    assert R.kl_estimator_grad([[0.0]], [[0.0]], "abs")[0, 0] == 0.0
    # tiny Δ: k3 ≈ Δ²/2 with full relative accuracy (expm1-based forms lose it)
    v = R.kl_estimator([[-1e-9]], [[0.0]], "k3")[0, 0]
    assert abs(v / (0.5e-18 + 1e-27 / 6) - 1) < 4 * EPS
    with pytest.raises(ValueError, match="unknown KL estimator"):
        R.kl_estimator(lp, ref, "full")


# --------------------------------------------------------------------------------------------------
# importance ratios


@SETTINGS
@given(data=batches(), level=st.sampled_from(R.IMPORTANCE_LEVELS),
       cap=st.sampled_from([None, 0.5, 2.0, 1e10]), clamp=st.sampled_from([None, 20.0, (None, 10.0)]))
def test_importance_ratio_vs_mpmath(data, level, cap, clamp):
    old, lp, _, mask, _ = data
    go = np.linspace(-1.0, 2.0, mask.size).reshape(mask.shape)
    val = R.importance_ratio(lp, old, mask, level=level, cap=cap, log_ratio_clamp=clamp)
    grad = R.importance_ratio_grad(lp, old, mask, level=level, cap=cap, log_ratio_clamp=clamp, grad_output=go)
    p = P(log_ratio_clamp=clamp)
    lo, hi = mp_clamp_pair(p)
    idx = [tuple(ij) for ij in np.argwhere(mask)]

    def ratios(pert=None):
        def l_(ij):
            return pert[1] if pert is not None and ij == pert[0] else M(lp[ij])
        out = {}
        for ij in idx:
            row = [kl for kl in idx if kl[0] == ij[0]]
            if level == "token":
                x = l_(ij) - M(old[ij])
            else:
                x = mpmath.fsum(l_(kl) - M(old[kl]) for kl in row)
                if level == "sequence_geometric":
                    x /= len(row)
            rr = mpmath.exp(mp_clamp(x, lo, hi))
            out[ij] = rr if cap is None else min(rr, M(cap))
        return out

    want = ratios()
    for ij in idx:
        close(float(val[ij]), want[ij], 0, 700 * 4, f"{level} ratio")  # ≤ (1 + |log-ratio|) ulps
        dref = mpmath.diff(lambda x: mpmath.fsum(M(go[kl]) * v for kl, v in ratios((ij, x)).items()), M(lp[ij]))
        gscale = float(mpmath.fsum(abs(M(go[kl])) * v for kl, v in want.items()))
        close(float(grad[ij]), dref, gscale, 700 * 4, f"{level} ratio grad")
    assert (val[~mask] == 0).all() and (grad[~mask] == 0).all()


def test_importance_ratio_levels_by_hand():
    lp = np.array([[-1.0, -2.0, 9.0]])
    old = np.array([[-2.0, -1.0, 0.0]])
    mask = np.array([[1, 1, 0]], bool)
    assert np.allclose(R.importance_ratio(lp, old, mask), [[math.e, 1 / math.e, 0]], rtol=4 * EPS, atol=0)
    assert np.array_equal(R.importance_ratio(lp, old, mask, level="sequence_geometric"), [[1.0, 1.0, 0.0]])
    assert np.array_equal(R.importance_ratio(lp, old, mask, level="sequence_product"), [[1.0, 1.0, 0.0]])
    g = R.importance_ratio_grad(lp, old, mask, level="sequence_geometric")
    assert np.array_equal(g, [[1.0, 1.0, 0.0]])  # (Σ g)·s/n = 2·1/2
    assert np.array_equal(R.importance_ratio([[0.0]], [[-100.0]], [[1]], cap=2.0), [[2.0]])
    assert R.importance_ratio_grad([[0.0]], [[-100.0]], [[1]], cap=2.0)[0, 0] == 0.0
    assert R.importance_ratio([[0.0]], [[-100.0]], [[1]])[0, 0] == math.exp(100.0)  # finite in float64
    with pytest.raises(ValueError, match="ambiguous"):
        R.importance_ratio(lp, old, mask, level="sequence")


# --------------------------------------------------------------------------------------------------
# value loss


@SETTINGS
@given(data=batches(), mode=st.sampled_from(MODES), eps=st.sampled_from([None, 0.0, 0.2, 5.0]))
def test_value_loss_vs_mpmath(data, mode, eps):
    values, vpreds, returns, mask, _ = data
    loss, metrics = R.value_loss(vpreds, values, returns, mask, eps, mode)
    grad = R.value_loss_grad(vpreds, values, returns, mask, eps, mode, grad_output=3.0)
    idx = [tuple(ij) for ij in np.argwhere(mask)]

    def total(pert=None):
        terms = {}
        for ij in idx:
            v = pert[1] if pert is not None and ij == pert[0] else M(vpreds[ij])
            old, R_ = M(values[ij]), M(returns[ij])
            t = (v - R_) ** 2
            if eps is not None:
                t = max(t, (mp_clamp(v, old - M(eps), old + M(eps)) - R_) ** 2)
            terms[ij] = t
        return mp_agg(terms, mask, mode) / 2

    scale = float(sum((abs(vpreds[ij]) + abs(values[ij]) + abs(returns[ij]) + 1) ** 2 for ij in idx)) + 1
    close(loss, total(), scale, 64, "value loss")
    for ij in idx:
        close(float(grad[ij]), 3 * mpmath.diff(lambda x: total((ij, x)), M(vpreds[ij])), scale, 64, "value grad")
    assert (grad[~mask] == 0).all()
    if eps is None:
        assert metrics == {}
    else:
        n = sum(1 for ij in idx if (mp_clamp(M(vpreds[ij]), M(values[ij]) - M(eps), M(values[ij]) + M(eps))
                                    - M(returns[ij])) ** 2 > (M(vpreds[ij]) - M(returns[ij])) ** 2)
        assert metrics["vf_clipfrac"] == R.SumCount(float(n), len(idx))


def test_value_loss_by_hand():
    # v = 2, v_old = 0, R = 0, ε = 0.5: unclipped 4 > clipped 0.25 → L = 4, grad 2(v − R) = 4
    # v = −1, v_old = 0, R = 1, ε = 0.5: unclipped 4 < clipped 2.25? no: (−0.5 − 1)² = 2.25 < 4 → L = 4
    # v = 1, v_old = 0, R = −1, ε = 0.5: (1+1)² = 4 vs (0.5+1)² = 2.25 → 4
    # v = 1, v_old = 0, R = 3, ε = 0.5: (1−3)² = 4 vs (0.5−3)² = 6.25 → clipped, grad 0
    vp = np.array([[2.0, -1.0, 1.0, 1.0]])
    vo = np.zeros((1, 4))
    ret = np.array([[0.0, 1.0, -1.0, 3.0]])
    mask = np.ones((1, 4), bool)
    loss, met = R.value_loss(vp, vo, ret, mask, 0.5, "token-sum")
    assert loss == 0.5 * (4 + 4 + 4 + 6.25)
    assert met["vf_clipfrac"] == R.SumCount(1.0, 4)
    assert np.array_equal(R.value_loss_grad(vp, vo, ret, mask, 0.5, "token-sum"), [[2.0, -2.0, 2.0, 0.0]])


# --------------------------------------------------------------------------------------------------
# hand-computed policy losses and the masked-numerator and NaN·0 rows


def test_cases_row15_masked_tokens_never_in_the_numerator():
    # loss [[1, 100], [1, −50]] as gpg's −A·ℓ with ℓ = −1; mask [[1, 0], [1, 0]]; token-mean → 1.0
    # (faulty 26.0)
    A = np.array([[1.0, 100.0], [1.0, -50.0]])
    lp = np.full((2, 2), -1.0)
    mask = np.array([[1, 0], [1, 0]], bool)
    loss, _ = R.policy_loss(np.zeros((2, 2)), lp, A, mask, variant="gpg", loss_agg_mode="token-mean")
    assert loss == 1.0
    g = R.policy_loss_grad(np.zeros((2, 2)), lp, A, mask, variant="gpg")
    assert np.array_equal(g, [[-0.5, 0.0], [-0.5, 0.0]])  # masked tokens' gradient exactly 0 (faulty: 0.5)


def test_cases_row17_nan_at_masked_old_log_prob():
    # old log-prob [[0, NaN]], mask [[1, 0]], PPO ratio loss, advantage 1 → −1.0 (faulty NaN)
    loss, met = R.policy_loss([[0.0, math.nan]], [[0.0, 0.0]], [[1.0, 1.0]], [[1, 0]], variant="vanilla")
    assert loss == -1.0
    assert met["ppo_kl"] == R.SumCount(0.0, 1) and met["pg_clipfrac"] == R.SumCount(0.0, 1)
    g = R.policy_loss_grad([[0.0, math.nan]], [[0.0, 0.0]], [[1.0, 1.0]], [[1, 0]], variant="vanilla")
    assert np.array_equal(g, [[-1.0, 0.0]])


def test_vanilla_dual_clip_by_hand():
    # r = 4, A = −1: max(4, 1.2) = 4 > c = 3 → dual clip: L = 3, grad 0, clipfrac_lower 1
    # r = 1/2, A = 1: max(−0.5, −0.8) = −0.5 (unclipped), grad −A·r = −0.5
    # r = 2, A = 1: max(−2, −1.2) = −1.2 (clipped), grad 0, clipfrac 1
    # r = 2, A = −1: max(2, 1.2) = 2 < 3: L = 2, grad −A·r = 2
    lp = np.log(np.array([[4.0, 0.5, 2.0, 2.0]]))
    old = np.zeros((1, 4))
    A = np.array([[-1.0, 1.0, 1.0, -1.0]])
    mask = np.ones((1, 4), bool)
    loss, met = R.policy_loss(old, lp, A, mask, loss_agg_mode="token-sum")
    assert abs(loss - (3 - 0.5 - 1.2 + 2)) < 16 * EPS
    assert met["pg_clipfrac"] == R.SumCount(1.0, 4) and met["pg_clipfrac_lower"] == R.SumCount(1.0, 4)
    g = R.policy_loss_grad(old, lp, A, mask, loss_agg_mode="token-sum")
    assert np.allclose(g, [[0.0, -0.5, 0.0, 2.0]], rtol=4 * EPS, atol=0)
    # without dual clip (SkyRL "regular") the first token costs r·|A| = 4 with gradient 4
    loss2, met2 = R.policy_loss(old, lp, A, mask, loss_agg_mode="token-sum", clip_ratio_c=None)
    assert abs(loss2 - (4 - 0.5 - 1.2 + 2)) < 16 * EPS and "pg_clipfrac_lower" not in met2


def test_extreme_log_ratios_are_exact_and_clipped_branches_have_zero_gradient():
    # Δ = ±100 (fp32 log-probs): the exact values are finite in float64
    lp = np.array([[0.0, -100.0, 0.0, -100.0, 0.0]], dtype=np.float32)
    old = np.array([[-100.0, 0.0, -100.0, 0.0, -100.0]], dtype=np.float32)
    A = np.array([[1.0, 1.0, -1.0, -1.0, 0.0]])
    mask = np.ones((1, 5), bool)
    t = R.policy_loss(old, lp, A, mask, loss_agg_mode="token-sum", clip_ratio_c=None)[0]
    # clipped (−1.2), unclipped −e^{−100}, unclipped e^{100}, clipped 0.8, A = 0 → exactly 0 (no 0·inf)
    assert t == math.fsum([-1.2, -math.exp(-100), math.exp(100), 0.8, 0.0])
    g = R.policy_loss_grad(old, lp, A, mask, loss_agg_mode="token-sum", clip_ratio_c=None)
    assert g[0, 0] == 0 and g[0, 3] == 0 and g[0, 4] == 0
    assert g[0, 1] == -math.exp(-100) and g[0, 2] == math.exp(100)
    # with verl's clamp at ±20 the exploding token costs e^{20} and its gradient is 0
    g20 = R.policy_loss_grad(old, lp, A, mask, loss_agg_mode="token-sum", clip_ratio_c=None, log_ratio_clamp=20)
    assert g20[0, 2] == 0 and g20[0, 1] == 0
    # GSPO: log s clamped at 10 → A < 0 costs e^{10}·|A|, gradient 0
    lg, _ = R.policy_loss([[-100.0]], [[0.0]], [[-1.0]], [[1]], variant="gspo", log_ratio_clamp=(None, 10))
    assert lg == math.exp(10)


def test_rollout_is_weights_by_hand():
    # gpg, token-sum: Σ −w·A·ℓ; geo_mean: the row loss times the geometric mean of the row's weights
    lp = np.array([[-1.0, -2.0], [-0.5, -4.0]])
    A = np.array([[1.0, -2.0], [3.0, 1.0]])
    w = np.array([[4.0, 1.0], [0.5, 9.0]])
    mask = np.array([[1, 1], [1, 0]], bool)
    loss, _ = R.policy_loss(lp, lp, A, mask, variant="gpg", loss_agg_mode="token-sum", rollout_is_weights=w)
    assert loss == 4.0 * 1.0 + 1.0 * -4.0 + 0.5 * 1.5
    g = R.policy_loss_grad(lp, lp, A, mask, variant="gpg", loss_agg_mode="token-sum", rollout_is_weights=w)
    assert np.array_equal(g, [[-4.0, 2.0], [-1.5, 0.0]])
    lg, _ = R.policy_loss(lp, lp, A, mask, variant="geo_mean", rollout_is_weights=w)
    # row 0: Ā = −0.5, ρ = 1, weights (4·1)^½ = 2 → 1.0; row 1: Ā = 3, weight 0.5 → −1.5; mean over 2 rows
    assert lg == (1.0 - 1.5) / 2
    with pytest.raises(ValueError, match=">= 0"):
        R.policy_loss(lp, lp, A, mask, variant="gpg", rollout_is_weights=-w)


def test_geo_mean_empty_rows_count_in_the_batch_mean():
    lp = np.array([[-1.0, -1.0], [0.0, 0.0]])
    old = np.array([[-1.0, -1.0], [0.0, 0.0]])
    A = np.array([[2.0, 2.0], [5.0, 5.0]])
    mask = np.array([[1, 1], [0, 0]], bool)
    loss, _ = R.policy_loss(old, lp, A, mask, variant="geo_mean")
    assert loss == -1.0  # row 0: −2·1, row 1 empty: 0; mean over B = 2 rows
    g = R.policy_loss_grad(old, lp, A, mask, variant="geo_mean")
    assert np.array_equal(g, [[-0.5, -0.5], [0.0, 0.0]])  # −Ā·ρ·(1/n)/B


def test_cov_selection_that_the_inputs_leave_open_raises_or_takes_the_engines_choice():
    lp = np.array([[-1.0, -2.0, -3.0, -4.0]])
    old = lp.copy()
    A = np.array([[3.0, -3.0, -3.0, 3.0]])
    mask = np.ones((1, 4), bool)
    # cov = (A − 0)(ℓ + 2.5) = 4.5, −1.5, 1.5, −4.5: candidates in (1, 5): tokens 0 and 2; clip_num 1
    with pytest.raises(ValueError, match="not determined"):
        R.policy_loss(old, lp, A, mask, variant="clip_cov")
    sel = np.array([[0, 0, 1, 0]], bool)
    loss, met = R.policy_loss(old, lp, A, mask, variant="clip_cov", cov_selected=sel, loss_agg_mode="token-sum")
    assert loss == -3.0 + 3.0 - 3.0 and met["pg_clipfrac"] == R.SumCount(1.0, 4)
    with pytest.raises(ValueError, match="not a clip_cov candidate"):
        R.policy_loss(old, lp, A, mask, variant="clip_cov", cov_selected=np.array([[0, 1, 0, 0]], bool))
    # kl_cov with tied covariances at the k-th place
    A2 = np.array([[1.0, -1.0, 1.0, -1.0]])
    lp2 = np.array([[-1.0, -2.0, -1.0, -2.0]])
    with pytest.raises(ValueError, match="not determined"):
        R.policy_loss(lp2, lp2, A2, mask, variant="kl_cov", kl_cov_ratio=0.25)


def test_sum_count_metrics_are_partition_invariant():
    rng = np.random.default_rng(11)
    lp = -rng.random((6, 5)) * 2
    old = np.minimum(lp + rng.normal(0, 0.5, (6, 5)), 0)
    A = rng.normal(0, 1, (6, 5))
    mask = rng.random((6, 5)) < 0.7
    for variant in ("vanilla", "cispo", "dppo_tv", "sapo", "dro", "gspo"):
        kw = {"dro_beta": 0.5} if variant == "dro" else {}
        whole = R.policy_loss(old, lp, A, mask, variant=variant, **kw)[1]
        parts = [R.policy_loss(old[s], lp[s], A[s], mask[s], variant=variant, **kw)[1]
                 for s in (slice(0, 1), slice(1, 4), slice(4, 6))]
        for key, sc in whole.items():
            assert sc.count == sum(p[key].count for p in parts)
            assert abs(sc.total - math.fsum(p[key].total for p in parts)) <= 4 * EPS * (1 + abs(sc.total))


def test_argument_validation():
    z = np.zeros((1, 1))
    with pytest.raises(ValueError, match="unknown policy-loss variant"):
        R.policy_loss(z, z, z, [[1]], variant="ppo")
    with pytest.raises(ValueError, match="clip_ratio_c must be > 1"):
        R.policy_loss(z, z, z, [[1]], clip_ratio_c=1.0)
    with pytest.raises(ValueError, match="dro_beta"):
        R.policy_loss(z, z, z, [[1]], variant="dro")
    with pytest.raises(ValueError, match="log-probability"):
        R.policy_loss(z, z + 0.5, z, [[1]], variant="dppo_kl")
    with pytest.raises(ValueError, match="unknown loss_agg_mode"):
        R.policy_loss(z, z, z, [[1]], loss_agg_mode="mean")
    grad_params = list(inspect.signature(R.policy_loss_grad).parameters)
    assert grad_params[:-1] == list(inspect.signature(R.policy_loss).parameters) and grad_params[-1] == "grad_output"


def test_the_mpmath_check_can_fail():
    """The comparison used above rejects a value one part in 1e12 off, and a wrong-branch gradient."""
    old, lp, A = np.array([[0.0]]), np.array([[-0.1]]), np.array([[1.0]])
    mask = np.ones((1, 1), bool)
    loss, _ = R.policy_loss(old, lp, A, mask)
    ref = mp_policy_loss("vanilla", old, lp, A, mask, lp, P(), "token-mean")
    close(loss, ref, 1.0, 64, "exact")
    with pytest.raises(AssertionError):
        close(loss * (1 + 1e-12), ref, 1.0, 64, "perturbed")
    dref = mpmath.diff(lambda x: mp_policy_loss("vanilla", old, lp, A, mask, lp, P(), "token-mean",
                                                perturb=((0, 0), x)), M(-0.1))
    close(float(R.policy_loss_grad(old, lp, A, mask)[0, 0]), dref, 1.0, 64, "exact gradient")
    with pytest.raises(AssertionError):
        close(0.0, dref, 1.0, 64, "zero gradient where the branch is unclipped")
