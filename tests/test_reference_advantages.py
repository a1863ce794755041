"""Self-tests of the advantage-estimator references (outcome_advantage, gae, masked_whiten).

Independent values come from mpmath at 700 digits (sums of float64s of any magnitude are then exact;
50 digits lose 1e-179 next to 2.0), written from each formula (not by calling the
reference), and from hand-computed small cases. Covered: every variant of ESTIMATORS, singleton and
constant groups, uneven groups, shuffled non-contiguous index, rewards at ±1e4 with 1e-7 differences,
0 and 1 valid tokens, masked positions holding NaN/±inf/1e30, NaN containment, whitening from merged
DP statistics, and the one-pass variance, degenerate-batch and NaN-reward cases.
"""

from __future__ import annotations

import math
from fractions import Fraction

import mpmath
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rlconform.reference as R

EPS = 2.0**-53
DPS = 700  # > the float64 exponent span (~632 digits): sums and differences of float64s are exact
SETTINGS = settings(max_examples=40, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
GARBAGE = [math.nan, math.inf, -math.inf, 1e30, -1e30]
GROUP_SCOPED = [e for e in R.ESTIMATORS if R.NAN_SCOPE[e][0] == "group"]
NEEDS_INDEX = [e for e in R.ESTIMATORS if e not in ("remax", "reinforce_plus_plus")]


def mpf(x):
    return mpmath.mpf(float(x))


def at_dps(fn):
    """Run an mpmath reference at DPS digits (mpmath's default is 15)."""
    def wrapped(*args, **kwargs):
        with mpmath.workdps(DPS):
            return fn(*args, **kwargs)
    return wrapped


# --------------------------------------------------------------------------------------------------
# mpmath references written from the formulas (50 digits)


def mp_groups(index):
    groups = {}
    for i, g in enumerate(index):
        groups.setdefault(g, []).append(i)
    return list(groups.values())


@at_dps
def mp_scores(r, m):
    """Outcome score: the sum of the unmasked rewards, rounded to the nearest float64 (S1)."""
    return [mpf(float(mpmath.fsum(mpf(x) for x, k in zip(row, mrow) if k))) for row, mrow in zip(r, m)]


@at_dps
def mp_whiten(x, m, shift_mean=True, eps=1e-8):
    """(x − μ)/sqrt(σ² + eps) over the unmasked entries of x (a list of rows of mpf); σ² unbiased, 0 for n = 1."""
    vals = [v for row, mrow in zip(x, m) for v, k in zip(row, mrow) if k]
    n = len(vals)
    if n == 0:
        return [[mpf(0)] * len(row) for row in x], None
    mu = mpmath.fsum(vals) / n
    var = mpmath.fsum((v - mu) ** 2 for v in vals) / (n - 1) if n > 1 else mpf(0)
    scale = mpmath.sqrt(var + mpf(eps))
    out = [[((v - mu) / scale + (0 if shift_mean else mu)) if k else mpf(0) for v, k in zip(row, mrow)]
           for row, mrow in zip(x, m)]
    return out, scale


@at_dps
def mp_group_adv(name, s, lengths, eps, norm, alpha):
    """Per-row outcome advantage of one group (list of mpf)."""
    n = len(s)
    if n == 1:
        return [mpf(0)]
    mu = mpmath.fsum(s) / n
    sd = mpmath.sqrt(mpmath.fsum((x - mu) ** 2 for x in s) / (n - 1))
    if name == "grpo":
        return [(x - mu) / (sd + mpf(eps)) if norm else x - mu for x in s]
    if name == "drgrpo":
        return [x - mu for x in s]
    if name == "rloo":
        return [x - (mpmath.fsum(s) - x) / (n - 1) for x in s]
    if name == "opo":
        tot = sum(lengths)
        if tot == 0:
            return [mpf(0)] * n
        b = mpmath.fsum(L * x for L, x in zip(lengths, s)) / tot
        return [x - b for x in s]
    if name == "gpg":
        return [alpha * (x - mu) for x in s]
    if name == "maxrl":
        return [(x - mu) / (mu + mpf(eps)) if x != mu else mpf(0) for x in s]
    if name == "grpo_passk":
        top = max(s)
        rest = sorted(s, reverse=True)[1]
        out = [mpf(0)] * n
        if top != rest:
            out[s.index(top)] = (top - rest) / (sd + mpf(eps)) if norm else top - rest
        return out
    raise AssertionError(name)


@at_dps
def mp_outcome(name, r, m, index, *, eps=1e-6, norm=True, gamma=1.0, baselines=None, comps=None, weights=None):
    """(advantages, returns, pre) as lists of rows of mpf; pre: (values before whitening, whitening scale) or None."""
    bsz, seqlen = len(r), len(r[0])
    lengths = [sum(1 for k in row if k) for row in m]
    if name in ("remax", "reinforce_plus_plus"):
        g = mpf(1) if name == "remax" else mpf(gamma)
        ret = [[mpf(0)] * seqlen for _ in range(bsz)]
        for i in range(bsz):
            run = mpf(0)
            for t in reversed(range(seqlen)):
                if m[i][t]:
                    run = mpf(r[i][t]) + g * run
                    ret[i][t] = run
        if name == "remax":
            adv = [[ret[i][t] - mpf(baselines[i]) if m[i][t] else mpf(0) for t in range(seqlen)] for i in range(bsz)]
            return adv, ret, None
        adv, scale = mp_whiten(ret, m)
        return adv, ret, (ret, scale)
    groups = mp_groups(index)
    if name in ("reinforce_plus_plus_baseline", "gdpo"):
        comps = [r] if comps is None else comps
        weights = [1.0] * len(comps) if weights is None else weights
        x = [mpf(0)] * bsz
        for comp, w in zip(comps, weights):
            s = mp_scores(comp, m)
            for members in groups:
                vals = mp_group_adv("grpo" if name == "gdpo" else "drgrpo", [s[i] for i in members],
                                    None, eps, norm, None)
                for i, v in zip(members, vals):
                    x[i] += mpf(w) * v
        pre = [[x[i] if m[i][t] else mpf(0) for t in range(seqlen)] for i in range(bsz)]
        adv, scale = mp_whiten(pre, m)
        return adv, adv, (pre, scale)
    s = mp_scores(r, m)
    alpha = mpf(bsz) / max(sum(1 for v in s if v != 0), 1) if name == "gpg" else None
    a = [mpf(0)] * bsz
    for members in groups:
        vals = mp_group_adv(name, [s[i] for i in members], [lengths[i] for i in members], eps, norm, alpha)
        for i, v in zip(members, vals):
            a[i] = v
    adv = [[a[i] if m[i][t] else mpf(0) for t in range(seqlen)] for i in range(bsz)]
    return adv, adv, None


@at_dps
def mp_gae(r, v, m, gamma, lam):
    """Unwhitened GAE over unmasked positions, returns, and a magnitude bound C for each position."""
    bsz, seqlen = len(r), len(r[0])
    g, gl = mpf(gamma), mpf(gamma) * mpf(lam)
    adv = [[mpf(0)] * seqlen for _ in range(bsz)]
    ret = [[mpf(0)] * seqlen for _ in range(bsz)]
    mag = [[mpf(0)] * seqlen for _ in range(bsz)]
    for i in range(bsz):
        a = c = vnext = mpf(0)
        for t in reversed(range(seqlen)):
            if not m[i][t]:
                continue
            vt = mpf(v[i][t])
            a = mpf(r[i][t]) + g * vnext - vt + gl * a
            c = abs(mpf(r[i][t])) + abs(g * vnext) + abs(vt) + abs(gl) * c
            vnext = vt
            adv[i][t], ret[i][t], mag[i][t] = a, a + vt, c + abs(vt)
    return adv, ret, mag


@at_dps
def assert_close(got, ref, tol_rel, tol_abs=0.0, what=""):
    """|got − ref| ≤ tol_rel·|ref| + tol_abs elementwise (got: ndarray, ref: rows of mpf)."""
    got = np.asarray(got)
    for i, row in enumerate(ref):
        for t, x in enumerate(row):
            g = float(got[i, t])
            assert math.isfinite(g), f"{what}[{i},{t}] = {g}, expected {x}"
            err = float(abs(mpf(g) - x))
            assert err <= tol_rel * float(abs(x)) + tol_abs, f"{what}[{i},{t}]: {g} vs {mpmath.nstr(x, 20)} (err {err:.3e})"


# --------------------------------------------------------------------------------------------------
# strategies


@st.composite
def batches(draw, regime=None):
    """(rewards [B, T] with garbage at masked positions, mask, index, clean rewards) as NumPy arrays."""
    bsz = draw(st.integers(1, 8))
    seqlen = draw(st.integers(1, 5))
    mask = np.array(draw(st.lists(st.lists(st.booleans(), min_size=seqlen, max_size=seqlen),
                                  min_size=bsz, max_size=bsz)))
    regime = regime or draw(st.sampled_from(["small_ints", "floats", "offset_1e4", "one_hot"]))
    if regime == "small_ints":
        el = st.integers(-3, 3).map(float)
    elif regime == "floats":
        el = st.floats(-10, 10, allow_nan=False, width=64)
    elif regime == "offset_1e4":
        el = st.integers(-3, 3).map(lambda k: 1e4 + k * 1e-7)
    else:
        el = st.sampled_from([0.0, 0.0, 1.0, 0.5])
    r = np.array(draw(st.lists(st.lists(el, min_size=seqlen, max_size=seqlen), min_size=bsz, max_size=bsz)))
    if regime == "offset_1e4" or regime == "one_hot":  # outcome rewards: one token per row
        last = np.zeros_like(r)
        last[:, -1] = r[:, -1]
        r = last
        mask[:, -1] = True if regime == "offset_1e4" else mask[:, -1]
    labels = draw(st.lists(st.sampled_from(["p", "q", "r", "s"]), min_size=bsz, max_size=bsz))
    dirty = r.copy()
    junk = draw(st.lists(st.sampled_from(GARBAGE), min_size=bsz * seqlen, max_size=bsz * seqlen))
    dirty[~mask] = np.array(junk).reshape(bsz, seqlen)[~mask]
    return dirty, mask, np.array(labels, dtype=object), np.where(mask, r, 0.0)


def _kwargs(name, bsz, draw_baselines=None):
    kw = {}
    if name == "remax":
        kw["reward_baselines"] = draw_baselines if draw_baselines is not None else np.linspace(-1, 1, bsz)
    if name == "reinforce_plus_plus":
        kw["gamma"] = 0.75
    return kw


# --------------------------------------------------------------------------------------------------
# every variant against mpmath


@pytest.mark.parametrize("name", R.ESTIMATORS)
@SETTINGS
@given(data=batches(), norm=st.booleans())
def test_outcome_advantage_matches_mpmath(name, data, norm):
    dirty, mask, index, clean = data
    bsz = mask.shape[0]
    kw = _kwargs(name, bsz)
    adv, ret = R.outcome_advantage(dirty, mask, index, estimator=name, norm_adv_by_std=norm, **kw)
    assert adv.dtype == np.float64 and adv.shape == mask.shape and ret.shape == mask.shape
    assert (adv[~mask] == 0).all() and (ret[~mask] == 0).all()
    rm, mm = clean.tolist(), mask.tolist()
    madv, mret, pre = mp_outcome(name, rm, mm, index.tolist(), norm=norm, gamma=kw.get("gamma", 1.0),
                                 baselines=kw.get("reward_baselines"))
    # recurrences run in double-double: error ~ eps²·Σ|terms| besides the final rounding
    mag = float(np.abs(clean).sum()) + float(np.abs(kw.get("reward_baselines", 0.0)).max(initial=0.0))
    if name in ("remax", "reinforce_plus_plus"):
        assert_close(ret, mret, 2 * EPS, 16 * EPS * EPS * mag, "returns")
    if pre is None:  # group statistics exact but for the rounding of σ: a few ulps relative
        tol_abs = 16 * EPS * EPS * mag if name == "remax" else 0.0
        assert_close(adv, madv, 4 * EPS, tol_abs, "advantages")
    else:  # whitened: the values before whitening carry ~1 ulp (σ or the returns rounded), scaled by 1/scale
        values, scale = pre
        if scale is None:
            np.testing.assert_array_equal(adv, 0.0)
            return
        xmax = float(max((abs(x) for row in values for x in row), default=0))
        assert_close(adv, madv, 4 * EPS, 8 * EPS * xmax / float(scale), "advantages")


# --------------------------------------------------------------------------------------------------
# hand-computed values


def _hand_batch():
    """Group u = rows {0, 2} with scores [3, 1]; group v = rows {1, 3, 4} with [2, 2, 5]; singleton w = row 5
    with 7. Rewards spread over tokens; lengths L = [2, 3, 1, 2, 1, 2]."""
    r = np.array([[1.0, 2.0, 0.0], [0.5, 0.5, 1.0], [1.0, 0.0, 0.0], [0.0, 2.0, 0.0], [5.0, 0.0, 0.0], [3.0, 4.0, 0.0]])
    m = np.array([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 0, 0], [1, 1, 0]], dtype=bool)
    return r, m, np.array(["u", "v", "u", "v", "v", "w"], dtype=object)


@pytest.mark.parametrize("name, expected", [
    ("drgrpo", [1, -1, -1, -1, 2, 0]),
    ("rloo", [2, -1.5, -2, -1.5, 3, 0]),                    # 3 − 1/1; 2 − (2 + 5)/2; 5 − (2 + 2)/2
    ("opo", [2 / 3, -0.5, -4 / 3, -0.5, 2.5, 0]),            # b_u = (2·3 + 1·1)/3 = 7/3; b_v = (3·2 + 2·2 + 1·5)/6
    ("gpg", [1, -1, -1, -1, 2, 0]),                         # every score non-zero: α = 6/6
    ("grpo", [1 / (math.sqrt(2) + 1e-6), -1 / (math.sqrt(3) + 1e-6), -1 / (math.sqrt(2) + 1e-6),
              -1 / (math.sqrt(3) + 1e-6), 2 / (math.sqrt(3) + 1e-6), 0]),
    ("maxrl", [1 / (2 + 1e-6), -1 / (3 + 1e-6), -1 / (2 + 1e-6), -1 / (3 + 1e-6), 2 / (3 + 1e-6), 0]),
    ("grpo_passk", [2 / (math.sqrt(2) + 1e-6), 0, 0, 0, 3 / (math.sqrt(3) + 1e-6), 0]),
])
def test_hand_computed_group_estimators(name, expected):
    r, m, idx = _hand_batch()
    adv, ret = R.outcome_advantage(r, m, idx, estimator=name)
    for i, e in enumerate(expected):
        assert adv[i, m[i]] == pytest.approx(e, rel=1e-15, abs=1e-15), (name, i)
        assert (adv[i, ~m[i]] == 0).all()
    np.testing.assert_array_equal(ret, adv)


def test_hand_computed_whitened_and_sequence_estimators():
    r, m, idx = _hand_batch()
    L = m.sum(axis=1)
    # rf++-baseline: x = s − μ_g = [1, −1, −1, −1, 2, 0] on each row's tokens, whitened over all 11 tokens
    x = [1, -1, -1, -1, 2, 0]
    n = int(L.sum())
    mu = Fraction(sum(int(li) * xi for li, xi in zip(L, x)), n)  # (2 − 3 − 1 − 2 + 2 + 0)/11 = −2/11
    assert mu == Fraction(-2, 11)
    var = sum(int(li) * (xi - mu) ** 2 for li, xi in zip(L, x)) / (n - 1)
    want = [float(xi - mu) / math.sqrt(float(var) + 1e-8) for xi in x]
    adv, ret = R.outcome_advantage(r, m, idx, estimator="reinforce_plus_plus_baseline")
    for i in range(6):
        assert adv[i, m[i]] == pytest.approx(want[i], rel=1e-14)
    # remax, baselines b = [1, 0, 0, 0, 0, 10]: returns = undiscounted reward to go
    adv, ret = R.outcome_advantage(r, m, estimator="remax", reward_baselines=[1, 0, 0, 0, 0, 10])
    np.testing.assert_array_equal(ret[0], [3, 2, 0])
    np.testing.assert_array_equal(adv[0], [2, 1, 0])
    np.testing.assert_array_equal(ret[1], [2, 1.5, 1])
    np.testing.assert_array_equal(adv[5], [-3, -6, 0])
    # rf++ with γ = 0.5: row 1 returns [0.5 + 0.5·(0.5 + 0.5·1), 0.5 + 0.5, 1] = [1, 1, 1]
    adv, ret = R.outcome_advantage(r, m, estimator="reinforce_plus_plus", gamma=0.5)
    np.testing.assert_array_equal(ret[1], [1, 1, 1])
    np.testing.assert_array_equal(ret[0], [2, 2, 0])
    vals = ret[m]
    want = (vals - vals.mean()) / math.sqrt(vals.var(ddof=1) + 1e-8)
    np.testing.assert_allclose(adv[m], want, rtol=1e-13)


def test_interior_masked_span_is_skipped_with_discount_counted_on_valid_tokens():
    # rf++ (verl semantics): [1, 0, (masked 7), 4], γ = 0.5 -> G = [1 + 0.5·2, 0 + 0.5·4, 0, 4]
    r = np.array([[1.0, 0.0, 7.0, 4.0]])
    m = np.array([[1, 1, 0, 1]])
    _, ret = R.outcome_advantage(r, m, estimator="reinforce_plus_plus", gamma=0.5)
    np.testing.assert_array_equal(ret, [[2.0, 2.0, 0.0, 4.0]])


def test_gae_hand_computed_with_interior_gap():
    # row 0: r = [1, 0, ·, 4], V = [.5, .25, ·, 1], m = [1, 1, 0, 1]; γ = .9, λ = .8
    #   t=3: δ = 4 − 1 = 3, A = 3;  t=1: δ = 0 + .9·1 − .25 = .65, A = .65 + .72·3 = 2.81
    #   t=0: δ = 1 + .9·.25 − .5 = .725, A = .725 + .72·2.81 = 2.7482; returns = A + V
    # row 1: r = [0, 2, 0, ·], V = [1, 2, 3, ·]: A = [1.1888, .54, −3], returns [2.1888, 2.54, 0]
    r = np.array([[1.0, 0.0, 123.0, 4.0], [0.0, 2.0, 0.0, math.nan]])
    v = np.array([[0.5, 0.25, math.inf, 1.0], [1.0, 2.0, 3.0, 1e30]])
    m = np.array([[1, 1, 0, 1], [1, 1, 1, 0]])
    adv, ret = R.gae(r, v, m, 0.9, 0.8, whiten=False)
    np.testing.assert_allclose(adv, [[2.7482, 2.81, 0, 3], [1.1888, 0.54, -3, 0]], rtol=1e-15, atol=0)
    np.testing.assert_allclose(ret, [[3.2482, 3.06, 0, 4], [2.1888, 2.54, 0, 0]], rtol=1e-15, atol=0)
    wadv, wret = R.gae(r, v, m, 0.9, 0.8)
    np.testing.assert_array_equal(wret, ret)
    a = adv[m.astype(bool)]
    np.testing.assert_allclose(wadv[m.astype(bool)], (a - a.mean()) / math.sqrt(a.var(ddof=1) + 1e-8), rtol=1e-13)
    assert (wadv[~m.astype(bool)] == 0).all()


@SETTINGS
@given(data=batches(), gamma=st.sampled_from([1.0, 0.99, 0.5, 0.0]), lam=st.sampled_from([1.0, 0.95, 0.0]),
       vscale=st.sampled_from([1.0, 1e4]))
def test_gae_matches_mpmath(data, gamma, lam, vscale):
    dirty, mask, _, clean = data
    rng = np.random.default_rng(abs(hash((dirty.shape, gamma, lam))) % 2**32)
    v = rng.standard_normal(mask.shape) * vscale
    vd = np.where(mask, v, np.array(GARBAGE * (v.size // len(GARBAGE) + 1))[: v.size].reshape(v.shape))
    adv, ret = R.gae(dirty, vd, mask, gamma, lam, whiten=False)
    madv, mret, mag = mp_gae(clean.tolist(), np.where(mask, v, 0).tolist(), mask.tolist(), gamma, lam)
    for got, want in ((adv, madv), (ret, mret)):
        for i, row in enumerate(want):
            for t, x in enumerate(row):
                err = float(abs(mpf(got[i, t]) - x))
                assert err <= 2 * EPS * float(abs(x)) + 64 * EPS * EPS * float(mag[i][t]), (i, t, got[i, t], x)
    wadv, _ = R.gae(dirty, vd, mask, gamma, lam)
    mw, scale = mp_whiten(madv, mask.tolist())
    if scale is not None:
        amax = max(abs(x) for row in madv for x in row)
        cmax = max(x for row in mag for x in row)
        assert_close(wadv, mw, 8 * EPS, float((8 * EPS * amax + 64 * EPS * EPS * cmax) / scale), "whitened")


# --------------------------------------------------------------------------------------------------
# degenerate groups, shuffled and uneven groups, extreme rewards


@pytest.mark.parametrize("name", NEEDS_INDEX)
def test_singleton_and_constant_groups_get_zero(name):
    # rows 0, 3: singletons (scores 7, −2); rows 1, 2, 4, 5: constant group of 0.95; rows 6, 7: group [1e4, 1e4]
    r = np.zeros((8, 2))
    r[:, 1] = [7.0, 0.95, 0.95, -2.0, 0.95, 0.95, 1e4, 1e4]
    m = np.ones((8, 2), dtype=bool)
    idx = np.array([10, 11, 11, 12, 11, 11, 13, 13])
    adv, ret = R.outcome_advantage(r, m, idx, estimator=name)
    # (rf++-baseline, gdpo: the group stage is all zeros, so the batch whitening sees a constant batch)
    np.testing.assert_array_equal(adv, 0.0)
    # the faulty engines' singleton rule would give s/(1 + ε) or s: make sure we do not
    assert adv[0, 0] == 0.0 and adv[3, 0] == 0.0


def test_constant_group_in_a_batch_with_spread_is_zero_before_whitening_only():
    r = np.array([[1.0], [1.0], [0.0], [2.0]])
    m = np.ones((4, 1))
    idx = np.array([0, 0, 1, 1])
    adv, _ = R.outcome_advantage(r, m, idx, estimator="reinforce_plus_plus_baseline")
    # x = [0, 0, −1, 1]: batch mean 0, so the constant group stays exactly 0 after whitening
    assert adv[0, 0] == 0.0 and adv[1, 0] == 0.0
    assert adv[3, 0] == pytest.approx(1 / math.sqrt(2 / 3 + 1e-8), rel=1e-15)


@pytest.mark.parametrize("name", NEEDS_INDEX + ["remax", "reinforce_plus_plus"])
def test_shuffled_index_permutes_outputs_exactly(name):
    rng = np.random.default_rng(7)
    sizes = [1, 2, 3, 4, 5, 6]  # uneven groups, a singleton among them
    idx = np.repeat(np.arange(len(sizes)), sizes)
    bsz = idx.size
    r = np.zeros((bsz, 4))
    r[:, 3] = rng.integers(-2, 3, bsz) * 0.5
    m = np.ones((bsz, 4), dtype=bool)
    m[rng.random((bsz, 4)) < 0.3] = False
    kw = _kwargs(name, bsz, rng.standard_normal(bsz))
    perm = rng.permutation(bsz)
    labels = np.array([f"uid-{g}" for g in idx], dtype=object)
    a0, r0 = R.outcome_advantage(r, m, idx, estimator=name, **kw)
    kw_p = dict(kw)
    if "reward_baselines" in kw:
        kw_p["reward_baselines"] = kw["reward_baselines"][perm]
    a1, r1 = R.outcome_advantage(r[perm], m[perm], labels[perm], estimator=name, **kw_p)
    np.testing.assert_array_equal(a1, a0[perm])
    np.testing.assert_array_equal(r1, r0[perm])


@pytest.mark.parametrize("name", ["grpo", "rloo", "drgrpo", "maxrl", "opo"])
def test_rewards_at_1e4_with_1e7_differences(name):
    # fp32 cannot even hold these; E[x²] − μ² in float64 loses ~8 of its 16 digits here
    s = [1e4, 1e4 + 1e-7, 1e4 + 2e-7, 1e4 + 3e-7, -1e4, -1e4 - 1e-7]
    r = np.array(s)[:, None]
    m = np.ones_like(r, dtype=bool)
    idx = np.array([0, 0, 0, 0, 1, 1])
    adv, _ = R.outcome_advantage(r, m, idx, estimator=name)
    madv, _, _ = mp_outcome(name, r.tolist(), m.tolist(), idx.tolist())
    assert_close(adv, madv, 4 * EPS, 0.0, name)
    if name == "grpo":  # the textbook one-pass variance gives visibly different values
        x = np.array(s[:4])
        bad = (x - x.mean()) / (math.sqrt(max((x * x).mean() - x.mean() ** 2, 0) * 4 / 3) + 1e-6)
        assert np.abs(bad - adv[:4, 0]).max() > 1e-3


def test_empty_rows_are_group_members_with_score_zero():
    r = np.array([[5.0, 1.0], [9.0, 9.0], [2.0, 0.0]])
    m = np.array([[1, 1], [0, 0], [1, 0]])
    adv, _ = R.outcome_advantage(r, m, np.zeros(3), estimator="rloo")
    # scores [6, 0, 2]: 6 − 1 = 5, (row 1 fully masked -> outputs 0), 2 − 3 = −1
    np.testing.assert_array_equal(adv, [[5, 5], [0, 0], [-1, 0]])
    adv, _ = R.outcome_advantage(r, m, np.zeros(3), estimator="opo")  # L = [2, 0, 1]: b = (12 + 2)/3
    np.testing.assert_allclose(adv[m.astype(bool)], [6 - 14 / 3, 6 - 14 / 3, 2 - 14 / 3], rtol=1e-15)


def test_all_masked_batch_gives_zeros_for_every_variant():
    r = np.full((3, 2), math.nan)
    m = np.zeros((3, 2))
    for name in R.ESTIMATORS:
        kw = _kwargs(name, 3)
        adv, ret = R.outcome_advantage(r, m, np.array([0, 0, 1]), estimator=name, **kw)
        np.testing.assert_array_equal(adv, 0.0)
        np.testing.assert_array_equal(ret, 0.0)
    adv, ret = R.gae(r, r, m, 0.9, 0.9)
    np.testing.assert_array_equal(adv, 0.0)


def test_passk_ties_and_maxrl_zero_denominator():
    r = np.array([[3.0], [3.0], [1.0]])
    m = np.ones((3, 1))
    adv, _ = R.outcome_advantage(r, m, np.zeros(3), estimator="grpo_passk")
    np.testing.assert_array_equal(adv, 0.0)  # tie for the maximum: nobody is the unique best
    # maxrl: μ + ε = 0 exactly -> ±inf by the sign of s − μ
    r = np.array([[-1e-6 + 1.0], [-1e-6 - 1.0]])
    fr = [Fraction(float(x)) for x in r[:, 0]]
    if sum(fr) / 2 + Fraction(1e-6) == 0:
        adv, _ = R.outcome_advantage(r, np.ones((2, 1)), np.zeros(2), estimator="maxrl")
        assert adv[0, 0] == math.inf and adv[1, 0] == -math.inf


def test_gpg_alpha_is_a_batch_statistic():
    # scores [1, 0 | 0, 0 | 2, 4]: M = 3 non-zero of B = 6 -> α = 2
    r = np.array([[1.0], [0.0], [0.0], [0.0], [2.0], [4.0]])
    adv, _ = R.outcome_advantage(r, np.ones((6, 1)), np.array([0, 0, 1, 1, 2, 2]), estimator="gpg")
    np.testing.assert_array_equal(adv[:, 0], [1, -1, 0, 0, -2, 2])


def test_gdpo_components_and_weights():
    r, m, idx = _hand_batch()
    c2 = np.zeros_like(r)
    c2[:, 0] = [0.0, 1.0, 1.0, 0.0, 3.0, 2.0]
    w = [1.0, 0.5]
    adv, ret = R.outcome_advantage(np.zeros_like(r), m, idx, estimator="gdpo", reward_components=[r, c2], reward_weights=w)
    madv, _, _ = mp_outcome("gdpo", r.tolist(), m.tolist(), idx.tolist(), comps=[r.tolist(), c2.tolist()], weights=w)
    assert_close(adv, madv, 8 * EPS, 64 * EPS, "gdpo")
    np.testing.assert_array_equal(ret, adv)
    stacked, _ = R.outcome_advantage(r, m, idx, estimator="gdpo", reward_components=np.stack([r, c2]), reward_weights=w)
    np.testing.assert_array_equal(stacked, adv)
    one, _ = R.outcome_advantage(r, m, idx, estimator="gdpo")
    alone, _ = R.outcome_advantage(np.zeros_like(r), m, idx, estimator="gdpo", reward_components=[r])
    np.testing.assert_array_equal(one, alone)


# --------------------------------------------------------------------------------------------------
# masked inputs, NaN containment, torch inputs


@pytest.mark.parametrize("name", R.ESTIMATORS)
@pytest.mark.parametrize("junk", GARBAGE)
def test_masked_positions_are_ignored_whatever_they_hold(name, junk):
    r, m, idx = _hand_batch()
    kw = _kwargs(name, 6)
    a0, r0 = R.outcome_advantage(np.where(m, r, 0.0), m, idx, estimator=name, **kw)
    a1, r1 = R.outcome_advantage(np.where(m, r, junk), m, idx, estimator=name, **kw)
    np.testing.assert_array_equal(a1, a0)
    np.testing.assert_array_equal(r1, r0)
    assert (a1[~m] == 0).all() and (r1[~m] == 0).all()


@pytest.mark.parametrize("name", R.ESTIMATORS)
@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_cases_md_row_18_nan_reward_stays_in_its_unit(name, bad):
    # 2 prompts × 3 samples (interleaved rows), one non-finite reward in prompt "p1"
    r = np.zeros((6, 2))
    r[:, 1] = [1.0, 0.0, 0.5, 1.0, 0.0, 0.25]
    m = np.ones((6, 2), dtype=bool)
    idx = np.array(["p1", "p2", "p1", "p2", "p1", "p2"], dtype=object)
    kw = _kwargs(name, 6)
    clean_adv, clean_ret = R.outcome_advantage(r, m, idx, estimator=name, **kw)
    r[2, 1] = bad
    adv, ret = R.outcome_advantage(r, m, idx, estimator=name, **kw)
    p1 = idx == "p1"
    scope_adv, scope_ret = R.NAN_SCOPE[name]
    for out, clean, scope in ((adv, clean_adv, scope_adv), (ret, clean_ret, scope_ret)):
        unit = {"group": p1, "row": np.arange(6) == 2, "batch": np.ones(6, dtype=bool)}[scope]
        assert np.isnan(out[unit]).all(), (name, scope)
        # outside the unit: exactly the values without the bad reward (gpg: NaN counts as non-zero,
        # and 0.5 is non-zero too, so α is unchanged)
        np.testing.assert_array_equal(out[~unit], clean[~unit])
    if scope_adv == "group":
        assert np.isfinite(adv[~p1]).all()  # the row's right value: prompt 2 finite


def test_remax_nan_baseline_poisons_its_row_only():
    r = np.array([[1.0, 2.0], [3.0, 4.0]])
    adv, ret = R.outcome_advantage(r, np.ones((2, 2)), estimator="remax", reward_baselines=[math.nan, 1.0])
    assert np.isnan(adv[0]).all() and np.isnan(ret[0]).all()
    np.testing.assert_array_equal(adv[1], [6.0, 3.0])


def test_gae_nan_value_poisons_row_then_batch_through_whitening():
    r = np.zeros((2, 2))
    v = np.array([[1.0, math.nan], [1.0, 2.0]])
    m = np.ones((2, 2))
    adv, ret = R.gae(r, v, m, 1.0, 1.0, whiten=False)
    assert np.isnan(adv[0]).all() and np.isnan(ret[0]).all() and np.isfinite(adv[1]).all()
    adv, _ = R.gae(r, v, m, 1.0, 1.0)
    assert np.isnan(adv).all()


def test_torch_inputs_match_numpy():
    torch = pytest.importorskip("torch")
    r, m, idx = _hand_batch()
    for dtype in (torch.float32, torch.bfloat16, torch.float64):
        rt = torch.tensor(r, dtype=dtype)
        widened = rt.double().numpy()
        for name in ("grpo", "rloo", "reinforce_plus_plus_baseline"):
            got = R.outcome_advantage(rt, torch.tensor(m), torch.tensor([0, 1, 0, 1, 1, 2]), estimator=name)[0]
            want = R.outcome_advantage(widened, m, np.array([0, 1, 0, 1, 1, 2]), estimator=name)[0]
            np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(R.masked_whiten(torch.tensor(r), torch.tensor(m)), R.masked_whiten(r, m))


# --------------------------------------------------------------------------------------------------
# masked_whiten: degenerate cases, mpmath, DP merges


def test_cases_md_row_16_whitening_one_valid_token_is_defined():
    v = np.array([[3.0, 5.0], [math.nan, 1e30]])
    m = np.array([[1, 0], [0, 0]])
    np.testing.assert_array_equal(R.masked_whiten(v, m), [[0.0, 0.0], [0.0, 0.0]])
    np.testing.assert_array_equal(R.masked_whiten(v, m, shift_mean=False), [[3.0, 0.0], [0.0, 0.0]])
    np.testing.assert_array_equal(R.masked_whiten(v, np.zeros((2, 2))), 0.0)  # 0 valid tokens
    # composites with one valid token in the batch do not raise (verl and SkyRL raise ValueError there)
    r = np.array([[1.0, 0.0], [0.0, 0.0]])
    for name in ("reinforce_plus_plus", "reinforce_plus_plus_baseline", "gdpo"):
        adv, _ = R.outcome_advantage(r, m, np.array([0, 1]), estimator=name)
        np.testing.assert_array_equal(adv, 0.0)
    adv, _ = R.gae(r, r, m, 1.0, 1.0)
    np.testing.assert_array_equal(adv, 0.0)


def test_masked_whiten_constant_and_nonfinite():
    v = np.array([[2.0, 2.0, 9.0]])
    m = np.array([[1, 1, 0]])
    np.testing.assert_array_equal(R.masked_whiten(v, m), [[0.0, 0.0, 0.0]])  # engines: 7e4 at the masked one
    v = np.array([[1.0, math.nan, 9.0]])
    out = R.masked_whiten(v, np.array([[1, 1, 0]]))
    assert np.isnan(out[0, :2]).all() and out[0, 2] == 0.0


@SETTINGS
@given(data=batches(), shift=st.booleans())
def test_masked_whiten_matches_mpmath(data, shift):
    dirty, mask, _, clean = data
    x = clean + np.arange(clean.size).reshape(clean.shape) * 0.125  # token-varying values
    x = np.where(mask, x, dirty)
    got = R.masked_whiten(x, mask, shift_mean=shift)
    want, scale = mp_whiten([[mpf(a) for a in row] for row in np.where(mask, x, 0).tolist()], mask.tolist(), shift)
    if scale is None:
        np.testing.assert_array_equal(got, 0.0)
        return
    vals = np.where(mask, x, 0)
    mu = abs(mpmath.fsum(mpf(a) for a in vals[mask])) / max(int(mask.sum()), 1)
    assert_close(got, want, 4 * EPS, 4 * EPS * float(mu) * (0 if shift else 1), "whiten")


@SETTINGS
@given(data=batches(), cuts=st.lists(st.integers(0, 8), max_size=4))
def test_masked_whiten_from_merged_dp_statistics_is_bit_identical(data, cuts):
    dirty, mask, _, clean = data
    x = np.where(mask, clean + np.linspace(-3, 3, clean.size).reshape(clean.shape), dirty)
    bsz = mask.shape[0]
    bounds = sorted({0, bsz, *[min(c, bsz) for c in cuts]})  # imbalanced, possibly empty shards
    shards = [(x[a:b], mask[a:b]) for a, b in zip(bounds[:-1], bounds[1:])] + [(x[:0], mask[:0])]
    merged = R.merge_exact_moments(R.exact_moments(xs, ms) for xs, ms in shards)
    full = R.masked_whiten(x, mask)
    for (xs, ms), a in zip(shards, bounds[:-1] + [bsz]):
        part = R.masked_whiten(xs, ms, moments=merged)
        np.testing.assert_array_equal(part, full[a:a + xs.shape[0]])


def test_masked_whiten_accepts_float_moments_and_chan_moments():
    x = np.array([[1.0, 2.0, 4.0], [8.0, 16.0, 0.0]])
    m = np.array([[1, 1, 1], [1, 1, 0]], dtype=bool)
    full = R.masked_whiten(x, m)
    parts = [(x[:1], m[:1]), (x[1:], m[1:])]
    chan = R.ChanMoments(0, 0.0, 0.0)
    for xs, ms in parts:
        chan = R.chan_merge(chan, R.chan_moments(xs, ms))
    floats = R.merge_moments(R.moments(xs, ms) for xs, ms in parts)
    for mo in (chan, floats):
        np.testing.assert_allclose(R.masked_whiten(x, m, moments=mo), full, rtol=8 * EPS, atol=0)
    em = R.exact_moments(x, m)
    assert em.nnz == 5 and em.sum == 31 and em.sumsq == 1 + 4 + 16 + 64 + 256 and em.nonfinite == 0


@pytest.mark.parametrize("offset", [1e4, -1e4, 3.0])
def test_masked_whiten_large_offset_tiny_spread(offset):
    # 7 values 1e-7 apart at ±1e4: μ is not a float64 (÷7), and x − fl(μ) would be off by up to
    # ulp(1e4)/2 ≈ 9e-13, i.e. 1e-5 relative to the 1e-7 deviations; the reference must stay at ~ulps
    x = np.array([[offset + k * 1e-7 for k in range(7)]])
    m = np.ones_like(x, dtype=bool)
    for shift in (True, False):
        got = R.masked_whiten(x, m, shift_mean=shift)
        want, _ = mp_whiten([[mpf(a) for a in x[0]]], m.tolist(), shift)
        assert_close(got, want, 4 * EPS, 0.0 if shift else 2 * EPS * abs(offset), "whiten")


def test_masked_whiten_unbiased_variance_and_eps_hand_value():
    # values [1, 2, 3, 4]: μ = 2.5, unbiased σ² = 5/3; out = (x − 2.5)/sqrt(5/3 + 1e-8)
    x = np.array([[1.0, 2.0], [3.0, 4.0]])
    out = R.masked_whiten(x, np.ones((2, 2)))
    np.testing.assert_allclose(out, (x - 2.5) / math.sqrt(5 / 3 + 1e-8), rtol=2 * EPS)
    # population variance (σ² = 5/4) would give a different value: the test can fail
    assert abs(out[0, 0] - (-1.5 / math.sqrt(5 / 4 + 1e-8))) > 1e-2


# --------------------------------------------------------------------------------------------------
# “one-pass variance E[x²] − μ²”


def test_cases_md_row_14_leave_one_out_with_constant_others():
    """Group rewards [0, 0.95 × 7], sample 0. The row is about rloo: the 7 others are constant, so their
    (leave-one-out) variance is 0 and sample 0's advantage is 0 − 0.95 = −0.95. The faulty value
    −2075.39 of the row is (0 − μ₋₀)/(σ₋₀ + 1e-6) with σ₋₀² = (E[x²] − μ²)·7/6 in fp32 = 2.09e-7."""
    r = np.zeros((8, 2))
    r[1:, 1] = 0.95
    m = np.ones((8, 2))
    adv, _ = R.outcome_advantage(r, m, np.zeros(8), estimator="rloo")
    assert adv[0, 0] == -0.95  # exactly −fl(0.95): the mean of 7 copies of a float is that float
    assert adv[1, 0] == pytest.approx(0.95 / 7, rel=2 * EPS)  # 0.95 − 6·0.95/7
    # the faulty computation of the row, reproduced in fp32
    f = np.float32
    others = np.full(7, f(0.95), dtype=f)
    mu = others.mean(dtype=f)
    var = ((others * others).mean(dtype=f) - mu * mu) * f(7) / f(6)
    assert f"{var:.3g}" == "2.09e-07"
    assert round(float((f(0) - mu) / (np.sqrt(var) + f(1e-6))), 2) == -2075.39
    assert adv[0, 0] != pytest.approx(-2075.39, abs=1)
    # and grpo on the same constant others (group of 7 × 0.95): exactly 0, not (μ_fp32 error)/ε
    adv7, _ = R.outcome_advantage(r[1:], m[1:], np.zeros(7), estimator="grpo")
    np.testing.assert_array_equal(adv7, 0.0)
    # grpo on the full group: (0 − 0.83125)/(σ + ε), σ = 0.95·sqrt(8/7·7/64) = 0.95/sqrt(8)
    adv, _ = R.outcome_advantage(r, m, np.zeros(8), estimator="grpo")
    assert adv[0, 0] == pytest.approx(-0.83125 / (0.95 / math.sqrt(8) + 1e-6), rel=1e-14)


# --------------------------------------------------------------------------------------------------
# API surface and errors


def test_tables_cover_every_variant():
    assert set(R.NAN_SCOPE) == set(R.ESTIMATORS) == set(R.ESTIMATOR_DOCS)
    assert len(set(R.ESTIMATORS)) == len(R.ESTIMATORS) == 11
    for name in R.ESTIMATORS:
        assert "Source" in R.ESTIMATOR_DOCS[name] and "arXiv" in R.ESTIMATOR_DOCS[name] or name == "maxrl"


@pytest.mark.parametrize("call, err", [
    (lambda r, m, i: R.outcome_advantage(r, m, i, estimator="ppo"), ValueError),
    (lambda r, m, i: R.outcome_advantage(r, m, i[:2], estimator="grpo"), ValueError),
    (lambda r, m, i: R.outcome_advantage(r, m, None, estimator="rloo"), ValueError),
    (lambda r, m, i: R.outcome_advantage(r, m[:, :1], i, estimator="grpo"), ValueError),
    (lambda r, m, i: R.outcome_advantage(r, m * 2, i, estimator="grpo"), ValueError),
    (lambda r, m, i: R.outcome_advantage(r, m, i, estimator="grpo", epsilon=-1e-6), ValueError),
    (lambda r, m, i: R.outcome_advantage(r, m, i, estimator="remax"), ValueError),
    (lambda r, m, i: R.outcome_advantage(r, m, i, estimator="grpo", reward_baselines=np.zeros(3)), ValueError),
    (lambda r, m, i: R.outcome_advantage(r, m, i, estimator="rloo", reward_components=[r]), ValueError),
    (lambda r, m, i: R.outcome_advantage(r, m, i, estimator="gpg", f_norm=0.0), ValueError),
    (lambda r, m, i: R.outcome_advantage(r[0], m[0], i, estimator="grpo"), ValueError),
    (lambda r, m, i: R.gae(r, r[:, :1], m, 1.0, 1.0), ValueError),
    (lambda r, m, i: R.masked_whiten(r, m[:, :1]), ValueError),
])
def test_errors(call, err):
    r = np.ones((3, 2))
    m = np.ones((3, 2), dtype=int)
    with pytest.raises(err):
        call(r, m, np.array([0, 0, 1]))
