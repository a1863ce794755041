"""Policy-gradient losses of RL trainers (PPO and its successors), their metrics, and the exact
gradient of the aggregated loss w.r.t. the current log-probs.

Notation, per token (i, t) of a ``[B, T]`` batch: ℓ = log_prob (log π_θ of the sampled token), o =
old_log_prob (log π_old, or the behaviour policy's), A = advantages, Δ = ℓ − o, r = e^Δ, εl / εh =
clip_ratio_low / clip_ratio_high, c = clip_ratio_c, clip(x) = min(max(x, 1 − εl), 1 + εh), sg(·) =
stop-gradient (a constant for the gradient), [·] = 1 if true else 0. Each variant defines a per-token
loss L_{i,t}; the batch loss is ``agg_loss(L, response_mask, loss_agg_mode)`` unless said otherwise.

==========================  ==============================================================  ===========
variant                     per-token loss L (metrics besides ppo_kl = Σ −Δ)                engine
==========================  ==============================================================  ===========
``vanilla``                 L' = max(−A·r, −A·clip(r)); dual clip (c not None): L =         verl vanilla,
                            min(−A·c, L') where A < 0, else L' (Schulman et al. 2017,       SkyRL regular
                            arXiv:1707.06347; Ye et al. 2020, arXiv:1912.09729).            (c=None) and
                            pg_clipfrac [−A·clip(r) > −A·r]; pg_clipfrac_lower [A<0 ∧       dual_clip
                            L' > −A·c] (only with dual clip)
``gspo``                    s = exp(sg(Δ̄_i)) · ℓ/sg(ℓ) (GSPO-token; value exp(Δ̄_i),         verl, SkyRL
                            Δ̄_i = mean of Δ over row i's valid tokens; ∂s/∂ℓ_{i,t} = s);   gspo
                            L = max(−A·s, −A·clip(s)) (Zheng et al. 2025, arXiv:2507.18071,
                            eq. 14-15); pg_clipfrac. log_ratio_clamp applies to log s
``sapo``                    L = −A·(4/τ)·σ(τ(r − 1)), τ = τ_pos if A > 0 else τ_neg        verl, SkyRL
                            (Gao et al. 2025, arXiv:2511.20347)                             sapo
``gpg``                     L = −A·ℓ (Chu et al. 2025, GPG); no metrics (not even ppo_kl)   verl gpg
``cross_entropy``           L = −ℓ (SFT); no metrics                                        SkyRL
``importance_sampling``     L = −A·r; ratio_mean Σ r                                        SkyRL
``clip_cov``                L = max(−A·r, −A·clip(r))·(1 − sel); sel: up to                 verl, SkyRL
                            max(⌊clip_cov_ratio·nnz⌋, 1) tokens drawn at random among the   clip_cov
                            candidates: valid, unclipped ([−A·clip(r) > −A·r] false),
                            clip_cov_lb < cov < clip_cov_ub with cov = (A − Ā)(ℓ − ℓ̄), means
                            over the valid tokens of the batch (Cui et al. 2025,
                            arXiv:2505.22617); pg_clipfrac = Σ sel
``kl_cov``                  L = −A·r + sel·ppo_kl_coef·|Δ|; sel: the k = max(⌊kl_cov_ratio  verl, SkyRL
                            ·nnz⌋, 1) valid tokens of largest cov (as clip_cov); metric     kl_cov
                            ppo_kl_abs = Σ |Δ| instead of ppo_kl (Cui et al. 2025)
``geo_mean``                row ratio ρ_i = exp(Σ_t m_t / n_i), m = sign(A)·min(sign(A)·Δ,  verl
                            sign(A)·clamp(Δ, −εl, εh)) (clip in log space), row advantage   geo_mean
                            Ā_i = Σ_t A / n_i; loss = (1/B)·Σ_i −Ā_i·ρ_i (B = all rows,
                            empty ones count 0; loss_agg_mode is ignored, as in verl).
                            pg_clipfrac [Δ clipped ∧ A > 0], pg_clipfrac_lower [… ∧ A < 0]
                            (Zhao et al. 2025, GMPO, arXiv:2507.20673)
``dro``                     L = −(A·ℓ − ½·dro_beta·Δ²) (Richemond et al. 2024, DRO)         verl dro
``cispo``                   L = −sg(clip(r))·A·ℓ (MiniMax 2025, arXiv:2506.13585);          verl, SkyRL
                            pg_clipfrac [r ∉ [1−εl, 1+εh]]; ratio_mean Σ r;                 cispo
                            ratio_clamped_mean Σ clip(r)
``dppo_tv``, ``dppo_kl``    L = −A·sg(min(r, c))·ℓ·v (c None: no truncation); v = [p − p_o  verl
                            ≤ εh] if A > 0 else [p − p_o ≥ −εl] (tv), or                   dppo_tv,
                            [D ≤ εh ∨ p ≤ p_o] if A > 0 else [D ≤ εl ∨ p ≥ p_o] (kl), p =  dppo_kl
                            e^ℓ, p_o = e^o, D = p_o·(o − ℓ) + (1 − p_o)·log((1 − p_o + η)
                            /(1 − p + η)), η = dppo_eps (Qi et al. 2026, arXiv:2602.04879);
                            pg_clipfrac Σ (1 − v); pg_clipfrac_lower Σ [r > c]·v
``dppo_binary_tv``,         L = −r·A·v; v = 1 − [A > 0 ∧ p − p_o > εh] − [A < 0 ∧ p_o − p   SkyRL dppo
``dppo_binary_kl``          > εl] (tv) or 1 − [A > 0 ∧ p > p_o ∧ D > εh] − [A < 0 ∧ p <
                            p_o ∧ D > εl] (kl); pg_clipfrac Σ (1 − v). (Differs from verl's
                            dppo_*: no truncation, −r·A instead of −sg(r)·A·ℓ, and A = 0
                            tokens are never counted as clipped.)
``rollout_is``              L = −sg(r·[1−εl < r < 1+εh])·A·ℓ with o = the rollout (behaviour) SkyRL
                            log-probs; pg_clipfrac Σ [r ∉ (1−εl, 1+εh)]                     rollout_is
==========================  ==============================================================  ===========

Gradients: ∂loss/∂ℓ is exact for the formula as written, with torch's conventions at kinks (clamp
passes the gradient at its bounds; maximum/minimum split it at ties; |x|' = sign(x), 0 at 0) and with
``sg`` and the selections (sel, v, the clip decisions) constant. All variants but geo_mean have a
diagonal gradient w_{i,t}·∂L_{i,t}/∂ℓ_{i,t}, w the agg_loss weights (1/nnz for token-mean, ...).

Engines' numerical guards are parameters, not silently built in, so a binding states what it
binds: ``log_ratio_clamp`` (verl clamps Δ to ±20 in vanilla, sapo, cispo, dppo_*; SkyRL in every
ratio it exponentiates except clip_cov, kl_cov, importance_sampling; both clamp log s ≤ 10 in gspo;
verl leaves clip_cov, kl_cov, geo_mean, dro unclamped) and ``dppo_eps`` (the engines' 1e-8).

Extreme log-ratios. Without a clamp the exact value is returned: r = e^Δ is finite in float64 for
Δ ≤ 709.78 (so Δ = ±100 is exact here), although e^Δ·|A| > 3.40e38 is beyond fp32 — an fp32
engine's +inf (of the right sign) is then the correctly rounded value, NaN never is (A = 0 tokens
contribute exactly 0 here, where an unguarded fp32 −A·e^Δ gives 0·inf = NaN). Clipped branches
have gradient 0 exactly. A value or gradient beyond the float64 range raises ValueError (agg_loss
refuses non-finite terms) or is ±inf (gradients). Examples in the module's tests and in
docs/engines/policy-losses.md.

Masked positions are ignored whatever they hold (NaN, ±inf, 1e30) in any input: they get loss 0
and gradient exactly 0, and the unmasked result is unchanged. NaN or ±inf at a valid position
raises ValueError.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from ._convert import as_mask
from ._policy_common import (
    SumCount,
    agg_weights,
    clamp_with_pass,
    exp_dd,
    fsum_rows,
    log_ratio,
    masked_inputs,
    max_with_grad,
    min_with_grad,
    parse_clamp,
    sigmoid_pair,
    sum_count,
)
from .exact_sum import exact_sum
from .loss_agg import agg_loss

__all__ = ["POLICY_LOSS_VARIANTS", "SumCount", "policy_loss", "policy_loss_grad"]

#: The variants :func:`policy_loss` defines (see the module doc for the engine each one mirrors).
POLICY_LOSS_VARIANTS = (
    "vanilla",
    "gspo",
    "sapo",
    "gpg",
    "cross_entropy",
    "importance_sampling",
    "clip_cov",
    "kl_cov",
    "geo_mean",
    "dro",
    "cispo",
    "dppo_tv",
    "dppo_kl",
    "dppo_binary_tv",
    "dppo_binary_kl",
    "rollout_is",
)


class _Params(NamedTuple):
    variant: str
    loss_agg_mode: str
    eps_low: float
    eps_high: float
    clip_c: float | None
    clamp: tuple
    loss_scale_factor: object
    tau_pos: float
    tau_neg: float
    clip_cov_ratio: float
    clip_cov_lb: float
    clip_cov_ub: float
    kl_cov_ratio: float
    ppo_kl_coef: float
    dro_beta: float | None
    dppo_eps: float
    selected: object  # cov_selected (or None)


class _Result(NamedTuple):
    loss: float
    grad: np.ndarray  # d loss / d log_prob (grad_output = 1)
    metrics: dict


def _neg_a_times(a, x):
    """−a·x with an exact 0 where a == 0 (x may be huge or +inf there)."""
    with np.errstate(invalid="ignore", over="ignore"):
        return np.where(a == 0, 0.0, -a * x)


def _token_ratio(s, e, clamp):
    """(Δc, its low part, r = e^Δc, pass) for Δ = s + e exactly; the low part is 0 where clamped."""
    lo, hi = clamp
    dc, k = clamp_with_pass(s, lo, hi)
    e = np.where(k > 0, e, 0.0)
    return dc, e, exp_dd(dc, e), k


def _ppo_clip(A, r, k, eps_low, eps_high):
    """L1 = −A·r, L2 = −A·clip(r) and their gradients w.r.t. ℓ (r' = r·k)."""
    L1 = _neg_a_times(A, r)
    g1 = _neg_a_times(A, r) * k
    cr, kc = clamp_with_pass(r, 1.0 - eps_low, 1.0 + eps_high)
    L2 = _neg_a_times(A, cr)
    g2 = g1 * kc
    return L1, g1, L2, g2


def _cov(A, lp, m):
    """cov = (A − Ā)(ℓ − ℓ̄) with means over the valid tokens (0 where masked)."""
    nnz = int(m.sum())
    if nnz == 0:
        return np.zeros(A.shape)
    mean_a = exact_sum(A[m].tolist()) / nnz
    mean_l = exact_sum(lp[m].tolist()) / nnz
    return np.where(m, (A - mean_a) * (lp - mean_l), 0.0)


def _binary_kl(lp, old, eps):
    """D = p_o·(o − ℓ) + (1 − p_o)·log((1 − p_o + η)/(1 − p + η)), with 1 − p = −expm1(ℓ)."""
    po = np.exp(old)
    q_old = -np.expm1(old)
    q_new = -np.expm1(lp)
    with np.errstate(divide="ignore"):
        log_ratio = np.log(q_old + eps) - np.log(q_new + eps)
    # 0·(−inf) at p_o = 1 with η = 0: the term is 0 (its limit); keep it finite
    second = np.where(q_old == 0, 0.0, q_old * log_ratio)
    return po * (old - lp) + second


def _selected(p, cand, k, selected, what):
    """The engine's selection among ``cand``: all of them if there are at most k, else ``selected``."""
    n_cand = int(cand.sum())
    if selected is not None:
        sel = as_mask(selected, cand.shape, "cov_selected")
        if (sel & ~cand).any():
            pos = tuple(int(i) for i in np.argwhere(sel & ~cand)[0])
            raise ValueError(f"cov_selected marks {pos}, which is not a {what} candidate")
        if int(sel.sum()) != min(k, n_cand):
            raise ValueError(f"cov_selected marks {int(sel.sum())} tokens; the engine selects {min(k, n_cand)}")
        return sel
    if n_cand <= k:
        return cand
    raise ValueError(
        f"{p.variant}: {n_cand} candidates for {k} selections: the engine's choice is not determined "
        "by the inputs (clip_cov draws at random; kl_cov has tied covariances at the k-th place); "
        "pass cov_selected=<the engine's selection> to evaluate the loss for it")


def _diag(p, old, lp, A, m):
    """(L, dL/dℓ, metrics) for the variants with a per-token (diagonal) loss."""
    v = p.variant
    delta, low = log_ratio(lp, old)  # Δ = delta + low exactly
    metrics = {}
    if v in ("gpg", "cross_entropy"):
        if v == "gpg":
            return _neg_a_times(A, lp), -A, metrics
        return -lp, -np.ones_like(lp), metrics

    if v == "gspo":
        counts = m.sum(axis=1)
        mean = fsum_rows(delta, m, low) / np.maximum(counts, 1)
        lr = np.broadcast_to(mean[:, None], delta.shape)
        _, _, r, k = _token_ratio(lr, np.zeros(lr.shape), p.clamp)
        L1, g1, L2, g2 = _ppo_clip(A, r, k, p.eps_low, p.eps_high)
        L, g = max_with_grad(L1, L2, g1, g2)
        metrics["pg_clipfrac"] = sum_count((L2 > L1).astype(float), m)
        metrics["ppo_kl"] = sum_count(-delta, m, -low)
        return L, g, metrics

    dc, dlow, r, k = _token_ratio(delta, low, p.clamp)
    if v != "kl_cov":
        metrics["ppo_kl"] = sum_count(-dc, m, -dlow)

    if v == "vanilla":
        L1, g1, L2, g2 = _ppo_clip(A, r, k, p.eps_low, p.eps_high)
        Lc, gc = max_with_grad(L1, L2, g1, g2)
        metrics["pg_clipfrac"] = sum_count((L2 > L1).astype(float), m)
        if p.clip_c is None:
            return Lc, gc, metrics
        L3 = _neg_a_times(A, np.full_like(A, p.clip_c))
        Ld, gd = min_with_grad(L3, Lc, np.zeros_like(gc), gc)
        neg = A < 0
        metrics["pg_clipfrac_lower"] = sum_count(((Lc > L3) & neg).astype(float), m)
        return np.where(neg, Ld, Lc), np.where(neg, gd, gc), metrics

    if v == "importance_sampling":
        metrics["ratio_mean"] = sum_count(r, m)
        return _neg_a_times(A, r), _neg_a_times(A, r) * k, metrics

    if v == "sapo":
        tau = np.where(A > 0, p.tau_pos, p.tau_neg)
        with np.errstate(over="ignore", invalid="ignore"):
            rm1 = np.expm1(dc) + np.where(dlow == 0, 0.0, np.exp(dc) * dlow)  # r − 1, accurate near r = 1
        sig, dsig = sigmoid_pair(tau * rm1)
        L = _neg_a_times(A, sig * (4.0 / tau))
        with np.errstate(invalid="ignore", over="ignore"):
            local = np.where(dsig == 0, 0.0, 4.0 * dsig * r)  # d gate / d ℓ = 4σ(1−σ)·r
        return L, _neg_a_times(A, local) * k, metrics

    if v == "dro":
        L = -(A * lp - 0.5 * p.dro_beta * dc * dc)
        return L, -(A - p.dro_beta * dc * k), metrics

    if v == "cispo":
        cr = np.clip(r, 1.0 - p.eps_low, 1.0 + p.eps_high)
        clipped = (r < 1.0 - p.eps_low) | (r > 1.0 + p.eps_high)
        metrics["pg_clipfrac"] = sum_count(clipped.astype(float), m)
        metrics["ratio_mean"] = sum_count(r, m)
        metrics["ratio_clamped_mean"] = sum_count(cr, m)
        return _neg_a_times(A, cr * lp), _neg_a_times(A, cr), metrics

    if v == "rollout_is":
        in_range = (r > 1.0 - p.eps_low) & (r < 1.0 + p.eps_high)
        cr = np.where(in_range, r, 0.0)
        metrics["pg_clipfrac"] = sum_count((~in_range).astype(float), m)
        return _neg_a_times(A, cr * lp), _neg_a_times(A, cr), metrics

    if v.startswith("dppo"):
        prob, prob_old = np.exp(lp), np.exp(old)
        diff = prob - prob_old
        if v == "dppo_tv":
            valid = np.where(A > 0, diff <= p.eps_high, diff >= -p.eps_low)
        elif v == "dppo_kl":
            bkl = _binary_kl(lp, old, p.dppo_eps)
            valid = np.where(A > 0, (bkl <= p.eps_high) | (prob <= prob_old),
                             (bkl <= p.eps_low) | (prob >= prob_old))
        elif v == "dppo_binary_tv":
            valid = ~(((A > 0) & (diff > p.eps_high)) | ((A < 0) & (-diff > p.eps_low)))
        else:
            bkl = _binary_kl(lp, old, p.dppo_eps)
            valid = ~(((A > 0) & (diff > 0) & (bkl > p.eps_high)) | ((A < 0) & (diff < 0) & (bkl > p.eps_low)))
        metrics["pg_clipfrac"] = sum_count((~valid).astype(float), m)
        if v in ("dppo_tv", "dppo_kl"):
            tr = r if p.clip_c is None else np.minimum(r, p.clip_c)
            over = np.zeros(r.shape, bool) if p.clip_c is None else r > p.clip_c
            metrics["pg_clipfrac_lower"] = sum_count((over & valid).astype(float), m)
            trv = np.where(valid, tr, 0.0)  # a removed token contributes exactly 0, whatever r is
            return _neg_a_times(A, trv * lp), _neg_a_times(A, trv), metrics
        rv = np.where(valid, r, 0.0)
        return _neg_a_times(A, rv), _neg_a_times(A, rv) * k, metrics

    if v == "clip_cov":
        L1, g1, L2, g2 = _ppo_clip(A, r, k, p.eps_low, p.eps_high)
        nnz = int(m.sum())
        cov = _cov(A, lp, m)
        cand = m & ~(L2 > L1) & (cov > p.clip_cov_lb) & (cov < p.clip_cov_ub)
        k_sel = max(int(p.clip_cov_ratio * nnz), 1)
        sel = _selected(p, cand, k_sel, p.selected, "clip_cov")
        corr = 1.0 - sel.astype(np.float64)
        L, g = max_with_grad(L1, L2, g1, g2)
        metrics["pg_clipfrac"] = sum_count(sel.astype(float), m)
        return L * corr, g * corr, metrics

    if v == "kl_cov":
        L1 = _neg_a_times(A, r)
        g1 = L1 * k
        absd = np.abs(dc)
        metrics["ppo_kl_abs"] = sum_count(absd, m, np.sign(dc) * dlow)
        nnz = int(m.sum())
        sel = np.zeros(m.shape, bool)
        if nnz:
            cov = _cov(A, lp, m)
            k_sel = min(max(1, int(nnz * p.kl_cov_ratio)), nnz)
            vals = np.sort(cov[m])[::-1]
            threshold = vals[k_sel - 1]
            if k_sel < nnz and vals[k_sel] == threshold and p.selected is None:
                cand = m & (cov == threshold)
                above = m & (cov > threshold)
                # the tied tokens at the k-th place: the engine's pick among them is not determined
                _selected(p, cand, k_sel - int(above.sum()), None, "kl_cov")
            if p.selected is not None:
                sel = as_mask(p.selected, m.shape, "cov_selected")
                if int((sel & m).sum()) != k_sel or (sel & ~m).any():
                    raise ValueError(f"cov_selected must mark exactly {k_sel} valid tokens")
            else:
                sel = m & (cov >= threshold)
        L = L1 + np.where(sel, p.ppo_kl_coef * absd, 0.0)
        g = g1 + np.where(sel, p.ppo_kl_coef * np.sign(dc) * k, 0.0)
        return L, g, metrics

    raise AssertionError(v)  # pragma: no cover


def _geo_mean(p, old, lp, A, m, weights):
    delta, low = log_ratio(lp, old)
    lo, hi = p.clamp
    delta, kk = clamp_with_pass(delta, lo, hi)
    low = np.where(kk > 0, low, 0.0)
    sgn = np.sign(A)
    dcl, kcl = clamp_with_pass(delta, -p.eps_low, p.eps_high)
    mn, gmn = min_with_grad(sgn * delta, sgn * dcl, sgn, sgn * kcl)
    mval = sgn * mn
    mlow = np.where(mval == delta, low, 0.0)  # m = Δ (unclipped): carry Δ's low part
    dm = sgn * gmn * kk
    counts = m.sum(axis=1)
    n = np.maximum(counts, 1).astype(np.float64)
    with np.errstate(over="ignore"):
        rho = np.exp(fsum_rows(mval, m, mlow) / n)
    adv = fsum_rows(A, m) / n
    if weights is None:
        sw = np.ones(A.shape[0])
    else:
        with np.errstate(divide="ignore"):
            logw = np.where(m, np.log(np.where(m, weights, 1.0)), 0.0)
        sw = np.exp(np.where(np.isneginf(logw).any(axis=1), -np.inf,
                             fsum_rows(np.where(np.isneginf(logw), 0.0, logw), m) / n))
    row = _neg_a_times(adv, rho * sw)
    rows = A.shape[0]
    loss = exact_sum(row.tolist()) / rows if rows else math.nan
    grad = _neg_a_times(adv, rho * sw)[:, None] * dm / n[:, None] / rows
    clipped = (delta < -p.eps_low) | (delta > p.eps_high)
    metrics = {
        "pg_clipfrac": sum_count((clipped & (A > 0)).astype(float), m),
        "pg_clipfrac_lower": sum_count((clipped & (A < 0)).astype(float), m),
        "ppo_kl": sum_count(-delta, m, -low),
    }
    return loss, np.where(m, grad, 0.0), metrics


def _evaluate(old_log_prob, log_prob, advantages, response_mask, p, rollout_is_weights):
    if p.variant not in POLICY_LOSS_VARIANTS:
        raise ValueError(f"unknown policy-loss variant {p.variant!r}; expected one of: "
                         f"{', '.join(POLICY_LOSS_VARIANTS)}")
    m, a = masked_inputs(response_mask, old_log_prob=old_log_prob, log_prob=log_prob,
                         advantages=advantages, rollout_is_weights=rollout_is_weights)
    old, lp, A, w = a["old_log_prob"], a["log_prob"], a["advantages"], a["rollout_is_weights"]
    if w is not None and (w < 0).any():
        pos = tuple(int(i) for i in np.argwhere(w < 0)[0])
        raise ValueError(f"rollout_is_weights must be >= 0; found {w[pos]!r} at {pos}")
    if p.variant.startswith("dppo"):
        for name, x in (("log_prob", lp), ("old_log_prob", old)):
            if (x > 0).any():
                pos = tuple(int(i) for i in np.argwhere(x > 0)[0])
                raise ValueError(f"{p.variant}: {name} must be a log-probability (<= 0); found {x[pos]!r} at {pos}")
    if p.variant == "geo_mean":
        return _Result(*_geo_mean(p, old, lp, A, m, w))
    L, g, metrics = _diag(p, old, lp, A, m)
    if w is not None:
        L, g = L * w, g * w
    L = np.where(m, L, 0.0)
    g = np.where(m, g, 0.0)
    loss = agg_loss(L, m, p.loss_agg_mode, p.loss_scale_factor)
    wts = agg_weights(m, p.loss_agg_mode, p.loss_scale_factor)
    with np.errstate(invalid="ignore"):
        grad = np.where(m, wts * g, 0.0)
    return _Result(loss, grad, metrics)


def _params(variant, loss_agg_mode, clip_ratio_low, clip_ratio_high, clip_ratio_c, log_ratio_clamp,
            loss_scale_factor, tau_pos, tau_neg, clip_cov_ratio, clip_cov_lb, clip_cov_ub, kl_cov_ratio,
            ppo_kl_coef, dro_beta, dppo_eps, cov_selected):
    def fin(name, x, positive=False, nonneg=False):
        x = float(x)
        if not math.isfinite(x) or (positive and x <= 0) or (nonneg and x < 0):
            cond = " and > 0" if positive else " and >= 0" if nonneg else ""
            raise ValueError(f"{name} must be finite{cond}, got {x!r}")
        return x

    eps_low = fin("clip_ratio_low", clip_ratio_low, nonneg=True)
    eps_high = fin("clip_ratio_high", clip_ratio_high, nonneg=True)
    c = None if clip_ratio_c is None else fin("clip_ratio_c", clip_ratio_c, positive=True)
    if variant == "vanilla" and c is not None and c <= 1.0:
        raise ValueError(f"clip_ratio_c must be > 1 for dual-clip PPO (verl asserts it), got {c!r}; "
                         "None disables dual clip")
    if variant == "dro" and (dro_beta is None or not float(dro_beta) > 0):
        raise ValueError(f"dro needs dro_beta > 0 (verl raises too), got {dro_beta!r}")
    if variant == "clip_cov" and not float(clip_cov_ratio) > 0:
        raise ValueError(f"clip_cov_ratio must be > 0, got {clip_cov_ratio!r}")
    if variant == "kl_cov" and not float(kl_cov_ratio) > 0:
        raise ValueError(f"kl_cov_ratio must be > 0, got {kl_cov_ratio!r}")
    if variant == "sapo":
        fin("tau_pos", tau_pos, positive=True)
        fin("tau_neg", tau_neg, positive=True)
    return _Params(variant, loss_agg_mode, eps_low, eps_high, c, parse_clamp(log_ratio_clamp), loss_scale_factor,
                   float(tau_pos), float(tau_neg), float(clip_cov_ratio), float(clip_cov_lb), float(clip_cov_ub),
                   float(kl_cov_ratio), fin("ppo_kl_coef", ppo_kl_coef),
                   None if dro_beta is None else float(dro_beta), fin("dppo_eps", dppo_eps, nonneg=True),
                   cov_selected)


def policy_loss(old_log_prob, log_prob, advantages, response_mask, *, variant: str = "vanilla",
                loss_agg_mode: str = "token-mean", clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=3.0,
                log_ratio_clamp=None, loss_scale_factor=None, rollout_is_weights=None, tau_pos=1.0,
                tau_neg=1.05, clip_cov_ratio=0.0002, clip_cov_lb=1.0, clip_cov_ub=5.0, kl_cov_ratio=0.0002,
                ppo_kl_coef=0.1, dro_beta=None, dppo_eps=1e-8, cov_selected=None):
    """The aggregated policy loss and its metrics: ``(loss: float, metrics: dict[str, SumCount])``.

    old_log_prob, log_prob, advantages: ``[B, T]`` (any real dtype, NumPy or torch); response_mask:
    ``[B, T]`` bool/0-1. variant: one of :data:`POLICY_LOSS_VARIANTS` (formulas in the module doc).
    loss_agg_mode / loss_scale_factor: as :func:`rlconform.reference.agg_loss` (ignored by geo_mean).
    clip_ratio_low / clip_ratio_high: εl, εh (≥ 0; the DPPO divergence thresholds for dppo_*, the
    log-space bounds for geo_mean). clip_ratio_c: the dual-clip bound c > 1 for vanilla (None: no
    dual clip, SkyRL "regular"), the truncation cap for dppo_tv / dppo_kl (None: no cap); ignored
    otherwise. log_ratio_clamp: None (exact), c (Δ clamped to [−c, c] before exp) or (lo, hi) with
    None for an open side; for gspo it applies to log s. rollout_is_weights: optional ``[B, T]``
    constant weights ≥ 0 multiplying L (verl; for geo_mean their geometric mean over the row's valid
    tokens multiplies the row loss). tau_pos, tau_neg: SAPO temperatures (> 0). clip_cov_ratio,
    clip_cov_lb, clip_cov_ub, kl_cov_ratio, ppo_kl_coef: Clip-Cov / KL-Cov parameters (verl
    defaults). dro_beta: DRO's β (> 0, required for dro). dppo_eps: η of the binary KL (1e-8 as the
    engines). cov_selected: optional ``[B, T]`` bool, the tokens the engine selected (clip_cov,
    kl_cov) when the inputs do not determine them.

    Returns the loss (Python float; ``nan`` for an empty batch except with token-sum) and metrics,
    each a :class:`SumCount` over the valid tokens (module doc lists the keys per variant).
    Accuracy: per-token terms within a few ulps (clip decisions and selections made on the exact
    float64 values); the aggregation is exactly rounded (agg_loss).
    Raises ValueError: unknown variant or mode, bad parameters (clip_ratio_c ≤ 1 with dual clip,
    dro without dro_beta, ...), shapes, NaN/±inf at a valid position, negative weights, positive
    log-probs for dppo_*, a clip_cov / kl_cov selection the inputs leave open (pass cov_selected),
    a loss term beyond the float64 range.
    Source: verl 0.9.1 ``verl/trainer/ppo/core_algos.py`` (register_policy_loss), SkyRL 0.4.0
    ``skyrl/backends/skyrl_train/utils/ppo_utils.py`` (PolicyLossRegistry); papers in the module doc.
    """
    p = _params(variant, loss_agg_mode, clip_ratio_low, clip_ratio_high, clip_ratio_c, log_ratio_clamp,
                loss_scale_factor, tau_pos, tau_neg, clip_cov_ratio, clip_cov_lb, clip_cov_ub, kl_cov_ratio,
                ppo_kl_coef, dro_beta, dppo_eps, cov_selected)
    res = _evaluate(old_log_prob, log_prob, advantages, response_mask, p, rollout_is_weights)
    return res.loss, res.metrics


def policy_loss_grad(old_log_prob, log_prob, advantages, response_mask, *, variant: str = "vanilla",
                     loss_agg_mode: str = "token-mean", clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=3.0,
                     log_ratio_clamp=None, loss_scale_factor=None, rollout_is_weights=None, tau_pos=1.0,
                     tau_neg=1.05, clip_cov_ratio=0.0002, clip_cov_lb=1.0, clip_cov_ub=5.0, kl_cov_ratio=0.0002,
                     ppo_kl_coef=0.1, dro_beta=None, dppo_eps=1e-8, cov_selected=None,
                     grad_output=1.0) -> np.ndarray:
    """∂ policy_loss / ∂ log_prob times the scalar ``grad_output``: float64 ``[B, T]``.

    Same arguments as :func:`policy_loss`. Exactly 0 at masked positions. Diagonal variants:
    grad_output·w_{i,t}·L'_{i,t} (w the agg_loss weights, L' the per-token derivative of the module
    doc, times rollout_is_weights); geo_mean: −grad_output·Ā_i·ρ_i·(∂m_t/∂Δ_t)/(n_i·B). The
    gradient w.r.t. old_log_prob is not provided (engines treat π_old as a constant).
    Raises ValueError as :func:`policy_loss`, and for a grad_output that is not finite.
    """
    go = float(grad_output)
    if not math.isfinite(go):
        raise ValueError(f"grad_output must be finite, got {grad_output!r}")
    p = _params(variant, loss_agg_mode, clip_ratio_low, clip_ratio_high, clip_ratio_c, log_ratio_clamp,
                loss_scale_factor, tau_pos, tau_neg, clip_cov_ratio, clip_cov_lb, clip_cov_ub, kl_cov_ratio,
                ppo_kl_coef, dro_beta, dppo_eps, cov_selected)
    res = _evaluate(old_log_prob, log_prob, advantages, response_mask, p, rollout_is_weights)
    with np.errstate(invalid="ignore"):
        return np.where(res.grad == 0, 0.0, res.grad * go)
