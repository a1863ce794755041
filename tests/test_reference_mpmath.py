"""Self-tests of rlconform.reference against mpmath at 50 digits and exact rationals (fractions.Fraction).

Every function and every closed-form gradient is checked on hypothesis-drawn small inputs (V ≤ 8, ≤ 3
rows) in the extreme regimes the harness feeds engines: offsets ±1e4, spreads up to 1e3, ``-inf``
entries, ties, fp16/fp32/fp64 inputs, float64 values up to ±1e300. Tolerances are stated in units of
eps = 2**-53 and match the accuracy promised in each docstring.
"""

from __future__ import annotations

import math
from fractions import Fraction

import mpmath
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import rlconform.reference as R

EPS = 2.0**-53
FLOOR = 1e-300  # results below this are subnormal-ish in float64: relative accuracy is not promised
DPS = 50

SETTINGS = settings(max_examples=50, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
NINF = float("-inf")
#: Σπ² = Σ e_v² / (1 + t)², relative error in units of EPS (= u, half an ulp): each e_v = exp(d_v)(1 + δ_v) is
#: within 3u (exp's ulp and the first-order correction), so e_v² within 7u, their extracted sum (2u) within 9u;
#: 1 + t within 6u, its square 13u, the quotient 1u more: 23u at worst. Typical errors are 2-4u; 4u was once
#: exceeded (4.0u at [0.68197375, 0, 0, 0, 0, 0, 0], a fresh-clone trial), so 16u, which a
#: wrong formula (errors ≫ 1e-15) still fails.
S2_EPS = 16


# --------------------------------------------------------------------------------------------------
# mpmath references (50 digits), written independently of the implementation


def mp_row(xs):
    """Statistics of one logits row (list of floats, -inf allowed) at DPS digits.

    Written with log1p around the row max: 50 digits are not enough for the textbook forms when
    exp(x − max) is below 1e-50 (e.g. logits [500, 0]: log p_0 = −7.1e-218, which log(Σ exp) rounds to 0).
    """
    with mpmath.workdps(DPS):
        fin = [(v, mpmath.mpf(x)) for v, x in enumerate(xs) if x != NINF]
        m = max(x for _, x in fin)
        jmax = next(v for v, x in fin if x == m)
        t = mpmath.fsum(mpmath.exp(x - m) for v, x in fin if v != jmax)
        logz = mpmath.log1p(t)
        logp = [None] * len(xs)
        for v, x in fin:
            logp[v] = (x - m) - logz
        p = [mpmath.mpf(0) if lp is None else mpmath.exp(lp) for lp in logp]
        h = logz + mpmath.fsum(p[v] * (m - x) for v, x in fin)
        s2 = mpmath.fsum(pi * pi for pi in p)
        one_minus_p = [t / (1 + t) if v == jmax else 1 - p[v] for v in range(len(xs))]
        return dict(m=m, logz=logz, lse=m + logz, p=p, logp=logp, h=h, s2=s2, one_minus_p=one_minus_p)


def mp_grads(st_, y):
    """Closed forms at DPS digits: d lse, d log p_y, dH, dΣπ²."""
    with mpmath.workdps(DPS):
        p, logp, h, s2 = st_["p"], st_["logp"], st_["h"], st_["s2"]
        g_lse = list(p)
        g_tlp = [st_["one_minus_p"][v] if v == y else -pv for v, pv in enumerate(p)]
        g_h = [mpmath.mpf(0) if lp is None else -pv * (lp + h) for pv, lp in zip(p, logp)]
        g_s2 = [2 * pv * (pv - s2) for pv in p]
        return g_lse, g_tlp, g_h, g_s2


def err(got: float, ref) -> float:
    """|got − ref| as a float (inf if got is not finite while ref is)."""
    if not math.isfinite(got):
        return math.inf
    with mpmath.workdps(DPS):
        return float(abs(mpmath.mpf(got) - ref))


# --------------------------------------------------------------------------------------------------
# strategies


@st.composite
def logits_rows(draw, max_rows=3, max_vocab=8):
    """(x: ndarray [rows, V] of a float dtype, labels [rows])."""
    rows = draw(st.integers(1, max_rows))
    vocab = draw(st.integers(1, max_vocab))
    regime = draw(st.sampled_from(["moderate", "offset", "spread", "peaked", "fp16_extreme", "wide", "ties"]))
    dtype = draw(st.sampled_from([np.float16, np.float32, np.float64]))
    unit = draw(hnp.arrays(np.float64, (rows, vocab), elements=st.floats(-1.0, 1.0)))
    if regime == "moderate":
        x = unit * draw(st.sampled_from([0.1, 1.0, 30.0]))
    elif regime == "offset":  # near-uniform at a huge offset
        x = draw(st.sampled_from([1e4, -1e4])) + unit * draw(st.sampled_from([1e-3, 1.0, 30.0]))
    elif regime == "spread":
        x = draw(st.sampled_from([0.0, 1e4, -1e4])) + unit * 1e3
    elif regime == "peaked":
        x = unit
        x[:, 0] += draw(st.sampled_from([20.0, 40.0, 100.0]))
    elif regime == "fp16_extreme":
        dtype = np.float16
        x = np.where(unit > 0, 65504.0, -65504.0) * (np.abs(unit) > 0.1) + unit
    elif regime == "wide":
        dtype = np.float64
        x = unit * 10.0 ** draw(st.integers(0, 300))
    else:  # ties: few distinct values
        x = np.round(unit * 2)
    x = x.astype(dtype)
    masked = draw(hnp.arrays(np.bool_, (rows, vocab), elements=st.booleans())) if draw(st.booleans()) else \
        np.zeros((rows, vocab), bool)
    for r in range(rows):
        if masked[r].all():
            masked[r, draw(st.integers(0, vocab - 1))] = False
    x = x.astype(np.float64)
    x[masked] = NINF
    x = x.astype(dtype)
    labels = np.array([draw(st.integers(0, vocab - 1)) for _ in range(rows)], dtype=np.int64)
    return x, labels


grad_outputs = st.floats(-1e3, 1e3, allow_nan=False)


# --------------------------------------------------------------------------------------------------
# softmax statistics


@SETTINGS
@given(case=logits_rows())
def test_softmax_stats_against_mpmath(case):
    x, labels = case
    before = x.copy()
    lse = R.logsumexp(x)
    tlp = R.token_logprobs(x, labels)
    h = R.entropy(x)
    s2 = R.sum_pi_squared(x)
    np.testing.assert_array_equal(x, before)  # never modified
    for out in (lse, tlp, h, s2):
        assert out.dtype == np.float64 and out.shape == x.shape[:-1]
    for r in range(x.shape[0]):
        ref = mp_row([float(v) for v in x[r]])
        scale = float(abs(ref["m"]) + abs(ref["logz"]))
        assert err(lse[r], ref["lse"]) <= 4 * EPS * scale + FLOOR, (x[r], lse[r], ref["lse"])
        y = int(labels[r])
        if ref["logp"][y] is None:
            assert tlp[r] == NINF
        else:
            assert err(tlp[r], ref["logp"][y]) <= 4 * EPS * float(abs(ref["logp"][y])) + FLOOR, (x[r], y)
        assert err(h[r], ref["h"]) <= 8 * EPS * float(ref["h"]) + FLOOR, (x[r], h[r], ref["h"])
        assert h[r] >= 0.0
        assert err(s2[r], ref["s2"]) <= S2_EPS * EPS * float(ref["s2"]), (x[r], s2[r], ref["s2"])


@SETTINGS
@given(case=logits_rows(), g=st.none() | grad_outputs)
def test_gradients_against_mpmath_closed_forms(case, g):
    x, labels = case
    before = x.copy()
    go = None if g is None else np.full(x.shape[:-1], g)
    got = (R.logsumexp_grad(x, go), R.token_logprobs_grad(x, labels, go), R.entropy_grad(x, go),
           R.sum_pi_squared_grad(x, go))
    np.testing.assert_array_equal(x, before)
    for out in got:
        assert out.dtype == np.float64 and out.shape == x.shape
        assert np.isfinite(out).all()
    gscale = 1.0 if g is None else abs(g)
    for r in range(x.shape[0]):
        ref = mp_row([float(v) for v in x[r]])
        y = int(labels[r])
        refs = mp_grads(ref, y)
        with mpmath.workdps(DPS):
            gm = mpmath.mpf(1 if g is None else g)
            h, s2 = ref["h"], ref["s2"]
            for v in range(x.shape[1]):
                p = ref["p"][v]
                absl = 0 if ref["logp"][v] is None else abs(ref["logp"][v])
                tols = (
                    4 * EPS * float(p) * gscale,
                    4 * EPS * float(abs(refs[1][v])) * gscale,
                    16 * EPS * float(p * (absl + h)) * gscale,
                    16 * EPS * float(2 * p * (p + s2)) * gscale,
                )
                for k in range(4):
                    e = err(got[k][r, v], gm * refs[k][v])
                    assert e <= tols[k] + FLOOR, (k, x[r], y, v, got[k][r, v], refs[k][v])
                if x[r, v] == NINF:
                    assert got[0][r, v] == 0 and got[2][r, v] == 0 and got[3][r, v] == 0


def _mp_stat_fns(y):
    def lse(*xs):
        return mpmath.log(mpmath.fsum(mpmath.exp(v) for v in xs))

    def tlp(*xs):
        return xs[y] - lse(*xs)

    def ent(*xs):
        z = lse(*xs)
        return -mpmath.fsum(mpmath.exp(v - z) * (v - z) for v in xs)

    def s2(*xs):
        z = lse(*xs)
        return mpmath.fsum(mpmath.exp(2 * (v - z)) for v in xs)

    return lse, tlp, ent, s2


@settings(max_examples=12, deadline=None, database=None)
@given(x=hnp.arrays(np.float64, st.integers(1, 4), elements=st.floats(-5, 5)), data=st.data())
def test_closed_form_gradients_match_mpmath_differentiation(x, data):
    """The closed forms are the true derivatives: compare with mpmath.diff at 50 digits."""
    y = data.draw(st.integers(0, x.size - 1))
    got = (R.logsumexp_grad(x), R.token_logprobs_grad(x, np.int64(y)), R.entropy_grad(x),
           R.sum_pi_squared_grad(x))
    with mpmath.workdps(DPS):
        pt = [mpmath.mpf(float(v)) for v in x]
        for k, fn in enumerate(_mp_stat_fns(y)):
            for v in range(x.size):
                order = tuple(1 if j == v else 0 for j in range(x.size))
                d = mpmath.diff(fn, pt, order)
                assert abs(got[k][v] - d) <= 32 * EPS * (1 + abs(d)), (k, x, y, v, got[k][v], d)


def test_peaked_rows_keep_relative_accuracy():
    # log p of the argmax and the entropy are ~1e-40: relative accuracy needs log1p, not log(1 + t)
    x = np.array([[100.0, 0.0, 0.0]])
    ref = mp_row([100.0, 0.0, 0.0])
    assert err(float(R.token_logprobs(x, np.array([0]))[0]), ref["logp"][0]) <= 2 * EPS * float(abs(ref["logp"][0]))
    assert err(float(R.entropy(x)[0]), ref["h"]) <= 4 * EPS * float(ref["h"])
    g = R.token_logprobs_grad(x, np.array([0]))
    assert err(float(g[0, 0]), ref["one_minus_p"][0]) <= 2 * EPS * float(ref["one_minus_p"][0])


def test_shapes_batch_dims_and_torch_input():
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(0).standard_normal((2, 3, 5)).astype(np.float32)
    lab = np.arange(6).reshape(2, 3) % 5
    assert R.entropy(x).shape == (2, 3) and R.entropy_grad(x).shape == (2, 3, 5)
    assert R.token_logprobs(x, lab).shape == (2, 3)
    assert R.logsumexp(x[0, 0]).shape == ()
    t = torch.from_numpy(x).to(torch.bfloat16).requires_grad_()
    xb = t.detach().float().numpy()
    np.testing.assert_array_equal(R.sum_pi_squared(t), R.sum_pi_squared(xb))
    np.testing.assert_array_equal(R.token_logprobs_grad(t, torch.from_numpy(lab)), R.token_logprobs_grad(xb, lab))
    # chunking does not change the result
    from rlconform.reference import softmax_stats as S

    big = np.random.default_rng(1).standard_normal((37, 11)).astype(np.float16)
    old = S._MAX_CHUNK_BYTES
    try:
        full = R.entropy_grad(big, np.arange(37.0))
        S._MAX_CHUNK_BYTES = 1
        np.testing.assert_array_equal(R.entropy_grad(big, np.arange(37.0)), full)
    finally:
        S._MAX_CHUNK_BYTES = old


# --------------------------------------------------------------------------------------------------
# reductions: exact against Fraction


def _values(max_len=12):
    return st.lists(st.floats(-1e100, 1e100).map(lambda v: 0.0 if abs(v) < 1e-100 else v), min_size=1,
                    max_size=max_len)


@st.composite
def values_mask(draw):
    vals = draw(_values())
    if draw(st.booleans()):  # catastrophic cancellation: big ± pairs around small values
        big = draw(st.sampled_from([1e16, 1e20, 3e30]))
        vals = vals + [big, -big, big * (1 + 2**-40)]
    n = len(vals)
    mask = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    cols = draw(st.sampled_from([c for c in range(1, n + 1) if n % c == 0]))
    return np.array(vals).reshape(-1, cols), np.array(mask).reshape(-1, cols)


def _exact(v, m):
    sel = [Fraction(float(x)) for x in v[m]]
    n = len(sel)
    s = sum(sel, Fraction(0))
    return sel, n, s


@SETTINGS
@given(vm=values_mask(), use_int_mask=st.booleans())
def test_reductions_exact(vm, use_int_mask):
    v, m = vm
    mm = m.astype(np.int64) if use_int_mask else m
    sel, n, s = _exact(v, m)
    assert R.masked_count(mm) == n and R.masked_count(v, mm) == n
    assert R.masked_sum(v, mm) == float(s)
    if n == 0:
        assert R.masked_sum(v, mm) == 0.0
        for fn in (R.masked_mean, R.masked_min, R.masked_max, R.masked_var, R.masked_std):
            assert math.isnan(fn(v, mm))
        return
    mean = s / n
    assert abs(R.masked_mean(v, mm) - float(mean)) <= math.ulp(float(mean))
    assert R.masked_min(v, mm) == float(min(sel)) and R.masked_max(v, mm) == float(max(sel))
    m2 = sum(((x - mean) ** 2 for x in sel), Fraction(0))
    biggest = max(abs(float(x)) for x in sel)
    for unbiased in (False, True):
        dof = n - (1 if unbiased else 0)
        if dof == 0:
            assert math.isnan(R.masked_var(v, mm, unbiased)) and math.isnan(R.masked_std(v, mm, unbiased))
            continue
        var = float(m2 / dof)
        tol = 8 * EPS * var + 8 * n * EPS**2 * biggest**2 / dof + FLOOR
        assert abs(R.masked_var(v, mm, unbiased) - var) <= tol, (v[m], unbiased)
        std = math.sqrt(var)
        assert abs(R.masked_std(v, mm, unbiased) - std) <= 4 * EPS * std + math.sqrt(tol)
    # partial moments: sums exactly rounded (x² split exactly); merges exact given the parts
    mo = R.moments(v, mm)
    assert mo == R.Moments(n, float(s), float(sum((x * x for x in sel), Fraction(0))))
    half = v.shape[0] // 2
    parts = [R.moments(v[:half], m[:half]), R.moments(v[half:], m[half:])]
    merged = R.merge_moments(parts)
    assert merged.nnz == n
    assert merged.sum == float(sum((Fraction(p.sum) for p in parts), Fraction(0)))
    mean_f, var_f = R.moments_to_mean_var(merged, unbiased=False)
    assert mean_f == float(Fraction(merged.sum) / n)
    exact_var = max(Fraction(merged.sumsq) - Fraction(merged.sum) ** 2 / n, Fraction(0)) / n
    assert var_f == float(exact_var)
    # Chan merge of two halves ≈ the whole (only roundings of the halves' means and M2 differ)
    a = R.chan_moments(v[:half], m[:half])
    b = R.chan_moments(v[half:], m[half:])
    c = R.chan_merge(a, b)
    assert c.n == n
    assert abs(c.mean - float(mean)) <= 4 * EPS * (abs(float(mean)) + biggest)
    # M2 inherits the rounding of the halves' means through δ² n_a n_b / n: 2|δ|·|Δmean|·n_a n_b / n
    delta_term = 4 * EPS * abs(b.mean - a.mean) * (abs(a.mean) + abs(b.mean)) * a.n * b.n / n
    assert abs(c.m2 - float(m2)) <= 16 * EPS * float(m2) + 16 * n * EPS**2 * biggest**2 + delta_term + FLOOR


def test_reductions_accept_torch():
    torch = pytest.importorskip("torch")
    v = torch.tensor([[1.0, 2.0, 3.5], [4.0, -1.0, 0.25]], dtype=torch.bfloat16)
    m = torch.tensor([[True, False, True], [True, True, False]])
    vn, mn = v.double().numpy(), m.numpy()
    assert R.masked_mean(v, m) == R.masked_mean(vn, mn)
    assert R.masked_var(v, m.int(), unbiased=False) == R.masked_var(vn, mn, unbiased=False)
    assert R.token_metrics(v, m.float()) == R.token_metrics(vn, mn)
    assert R.masked_count(m) == 4


# --------------------------------------------------------------------------------------------------
# agg_loss against exact rationals


@SETTINGS
@given(vm=values_mask(), mode=st.sampled_from(R.LOSS_AGG_MODES))
def test_agg_loss_exact_against_fraction(vm, mode):
    v, m = vm
    rows = [[Fraction(float(x)) for x, k in zip(v[i], m[i]) if k] for i in range(v.shape[0])]
    nonempty = [r for r in rows if r]
    total = sum((x for r in rows for x in r), Fraction(0))
    nnz = sum(len(r) for r in rows)
    got = R.agg_loss(v, m, mode)
    if mode == "token-sum":
        assert got == float(total)
        return
    if nnz == 0:
        assert math.isnan(got)
        return
    if mode == "token-mean":
        exact = total / nnz
    elif mode == "seq-mean-token-sum":
        exact = total / len(nonempty)
    elif mode == "seq-mean-token-sum-norm":
        exact = total / len(nonempty) / v.shape[1]
    else:
        exact = sum((sum(r, Fraction(0)) / len(r) for r in nonempty), Fraction(0)) / len(nonempty)
        scale = sum((abs(sum(r, Fraction(0)) / len(r)) for r in nonempty), Fraction(0)) / len(nonempty)
        assert abs(got - float(exact)) <= 4 * EPS * float(scale) + FLOOR
        return
    assert abs(got - float(exact)) <= math.ulp(float(exact))


# --------------------------------------------------------------------------------------------------
# optimal token baseline against an mpmath transcription of the formula


def mp_otb(rewards, mask, index, logp, s2, rho, handle_zero_tail):
    """Straight loops at 50 digits; returns (adv, ret, tolerance) as nested lists of mpf / floats."""
    b, t = rewards.shape
    with mpmath.workdps(DPS):
        mpf = mpmath.mpf
        r = [[mpf(float(rewards[i, j])) if mask[i, j] else mpf(0) for j in range(t)] for i in range(b)]
        ret = [[mpmath.fsum(r[i][j:]) for j in range(t)] for i in range(b)]
        gabs = [[mpmath.fsum(abs(v) for v in r[i][j:]) for j in range(t)] for i in range(b)]
        # 1 − 2π + Σπ² written with expm1: at 50 digits exp(−1e-308) is 1 and w would vanish
        w = [[(mpf(float(s2[i, j])) - 1 - 2 * mpmath.expm1(mpf(float(logp[i, j]))))
              * (1 if rho is None else mpf(float(rho[i, j])) ** 2) if mask[i, j] else mpf(0)
              for j in range(t)] for i in range(b)]
        big_w = [[mpmath.fsum(w[i][: j + 1]) for j in range(t)] for i in range(b)]
        # error scale of w: its terms, not |w| (w = (Σπ² − 1) − 2·expm1(log π) may cancel; the float64
        # expm1 is only good to an ulp of its own size)
        wsc = [[(abs(mpf(float(s2[i, j])) - 1) + 2 * abs(mpmath.expm1(mpf(float(logp[i, j])))))
                * (1 if rho is None else mpf(float(rho[i, j])) ** 2) if mask[i, j] else mpf(0)
                for j in range(t)] for i in range(b)]
        wabs = [[mpmath.fsum(wsc[i][: j + 1]) for j in range(t)] for i in range(b)]
        base = [[mpf(0)] * t for _ in range(b)]
        slack = [[mpf(0)] * t for _ in range(b)]  # error scale of the baseline
        groups = {}
        for i, g in enumerate(index):
            groups.setdefault(g, []).append(i)
        for members in groups.values():
            if len(members) < 2:
                continue
            for j in range(t):
                num = mpmath.fsum(ret[i][j] * big_w[i][j] for i in members if mask[i, j])
                den = mpmath.fsum(big_w[i][j] for i in members if mask[i, j])
                bj = num / den if den != 0 else mpf(0)
                sl = 0
                if den != 0:
                    sl = (mpmath.fsum((abs(ret[i][j]) + gabs[i][j]) * wabs[i][j] for i in members if mask[i, j])
                          + abs(bj) * mpmath.fsum(wabs[i][j] for i in members if mask[i, j])) / abs(den)
                for i in members:
                    base[i][j], slack[i][j] = bj, sl
            if handle_zero_tail:
                lens = sorted(int(mask[i].sum()) for i in members)
                longest = [i for i in members if int(mask[i].sum()) == lens[-1]]
                if len(longest) == 1 and lens[-1] > lens[-2]:
                    for j in range(lens[-2], t):
                        base[longest[0]][j], slack[longest[0]][j] = mpf(0), mpf(0)
        adv = [[(ret[i][j] - base[i][j]) if mask[i, j] else mpf(0) for j in range(t)] for i in range(b)]
        tol = [[float(64 * EPS * (abs(ret[i][j]) + gabs[i][j] + slack[i][j])) + FLOOR for j in range(t)]
               for i in range(b)]
        return adv, ret, tol


@st.composite
def otb_case(draw):
    b = draw(st.integers(1, 5))
    t = draw(st.integers(1, 5))
    fl = lambda lo, hi: hnp.arrays(np.float64, (b, t), elements=st.floats(lo, hi))  # noqa: E731
    rewards = draw(fl(-5, 5))
    if draw(st.booleans()):  # outcome rewards on the last valid token only
        rewards = np.zeros((b, t))
        rewards[:, -1] = draw(hnp.arrays(np.float64, b, elements=st.sampled_from([0.0, 1.0, -1.0])))
    lengths = draw(hnp.arrays(np.int64, b, elements=st.integers(0, t)))
    mask = np.arange(t)[None, :] < lengths[:, None]
    if draw(st.booleans()):
        mask = draw(hnp.arrays(np.bool_, (b, t), elements=st.booleans()))
    logp = draw(fl(-20, 0))
    pi = np.exp(logp)
    s2 = pi**2 + draw(fl(0, 1)) * (1 - pi**2)  # consistent Σπ² ≥ π² (w ≥ 0 as in exact math)
    # IS weights below ~1e-154 would underflow ρ² (documented limit); draw 0 or ≥ 1e-100
    rho = draw(st.none() | fl(0, 3).map(lambda a: np.where(a < 1e-100, 0.0, a)))
    index = draw(hnp.arrays(np.int64, b, elements=st.integers(0, 2)))
    # garbage in masked-out slots must not matter
    rewards = np.where(mask, rewards, np.nan)
    return rewards, mask, index, logp, s2, rho, draw(st.booleans())


@SETTINGS
@given(case=otb_case())
def test_optimal_token_baseline_against_mpmath(case):
    rewards, mask, index, logp, s2, rho, hzt = case
    adv, ret = R.optimal_token_baseline(rewards, mask.astype(np.float32), index, logp, s2, rho, hzt)
    assert adv.dtype == np.float64 and adv.shape == mask.shape and ret.shape == mask.shape
    assert np.isfinite(adv).all() and np.isfinite(ret).all()
    radv, rret, tol = mp_otb(rewards, mask, index.tolist(), logp, s2, rho, hzt)
    for i in range(mask.shape[0]):
        for j in range(mask.shape[1]):
            assert err(ret[i, j], rret[i][j]) <= tol[i][j], (i, j)
            assert err(adv[i, j], radv[i][j]) <= tol[i][j], (i, j, adv[i, j], radv[i][j])
            if not mask[i, j]:
                assert adv[i, j] == 0.0
