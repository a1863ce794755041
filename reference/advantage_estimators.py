"""Outcome-reward advantage estimators and GAE (verl 0.9.1, SkyRL 0.4.0), exact in float64.

``outcome_advantage(token_level_rewards [B, T], response_mask [B, T], index [B], *, estimator, ...)``
returns ``(advantages [B, T], returns [B, T])`` float64 for one *variant* of ``ESTIMATORS``;
``gae(...)`` is Generalized Advantage Estimation; ``masked_whiten`` (module ``whitening``) is the
batch whitening several of them end with. ``ESTIMATOR_DOCS[name]`` gives each variant's formula and
source; ``NAN_SCOPE[name]`` the unit a non-finite input may poison.

Conventions shared by every variant (``S`` below):
  S1 outcome score: s_i = Σ_t r_{i,t}·m_{i,t}, the sum of the row's *unmasked* token rewards, exactly
     rounded to float64. (verl and SkyRL sum every position, ``token_level_rewards.sum(-1)``; the two
     agree when masked rewards are 0, which is how trainers fill them.) A row with no unmasked token
     has s_i = 0 and is still a member of its group (as in the engines).
  S2 groups: rows with equal ``index`` values (ints, uid strings, anything hashable; compared with ==)
     form a prompt group; rows need not be contiguous; sizes may differ.
  S3 degenerate groups: a group of one row (singleton) gets advantage 0. A group whose scores are all
     equal gets advantage 0 (exactly: the statistics are exact rationals, so s_i − μ = 0 exactly).
     ``singleton="raw"`` follows verl's declared convention instead (core_algos.py:315, :572, :622, :678,
     :817; SkyRL ppo_utils.py:1378, :1415: a singleton group's statistics are μ := 0, σ := 1): the
     variant's formula with μ = 0 and σ = 1, so grpo a = s/(1 + ε), drgrpo / rloo / opo / maxrl a = s, gpg a = α·s/f_norm, reinforce_plus_plus_baseline
     and gdpo x = s (resp. s/(1 + ε) per component) before the batch whitening; grpo_passk stays 0.
  S4 statistics: group mean μ = Σs/n and unbiased std σ = sqrt(Σ(s − μ)²/(n − 1)) are computed from
     exact rationals (never as E[x²] − μ²); ε is added to σ (not to σ²) where a variant divides by it.
  S5 masks: masked positions of every [B, T] input are ignored whatever they hold (NaN, ±inf, 1e30);
     both outputs are 0.0 at masked positions.
  S6 non-finite inputs (NaN/±inf reward at an unmasked position, NaN reward_baselines, NaN values):
     every unmasked output of the input's containment unit is NaN, and nothing outside it changes.
     The unit (``NAN_SCOPE``) is the prompt group for group-normalised variants, the row for remax,
     and the whole batch for variants that end with batch whitening (a batch statistic cannot contain
     a NaN; “one NaN reward spreads to every group” is about the group-normalised variants).
  S7 accuracy, against the exact value of the formula on the given float64 inputs: group variants
     within ~1.5 ulps (exact rational statistics, σ rounded once, one final rounding); returns and
     remax advantages within 1 ulp + ~2^-100·Σ|r| (double-double recurrences); whitened outputs
     within a few ulps + ~8 eps·max|x|/sqrt(σ² + 1e-8), x the values before whitening (their
     rounding is amplified by the whitening where x is nearly constant).

Where verl 0.9.1 and SkyRL 0.4.0 disagree with each other or with S1–S6, the docs say so; the
engines' measured behaviour is in docs/engines/advantage-estimators.md.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from ._compensated import two_sum
from ._convert import as_float64, as_mask, is_tensor_like
from ._dd import dd_add, dd_mul, dd_round, two_prod
from .exact_sum import exact_sum
from .whitening import WHITEN_EPS, ExactMoments, masked_whiten, whiten_scale

__all__ = ["ESTIMATORS", "ESTIMATOR_DOCS", "NAN_SCOPE", "outcome_advantage", "gae", "masked_whiten"]

ESTIMATORS = (
    "grpo",
    "drgrpo",
    "rloo",
    "reinforce_plus_plus",
    "reinforce_plus_plus_baseline",
    "remax",
    "opo",
    "gpg",
    "gdpo",
    "grpo_passk",
    "maxrl",
)

# (advantages' unit, returns' unit) that a non-finite unmasked input poisons (S6)
NAN_SCOPE = {
    "grpo": ("group", "group"),
    "drgrpo": ("group", "group"),
    "rloo": ("group", "group"),
    "opo": ("group", "group"),
    "gpg": ("group", "group"),
    "grpo_passk": ("group", "group"),
    "maxrl": ("group", "group"),
    "remax": ("row", "row"),
    "reinforce_plus_plus": ("batch", "row"),
    "reinforce_plus_plus_baseline": ("batch", "batch"),
    "gdpo": ("batch", "batch"),
}

ESTIMATOR_DOCS = {
    "grpo": """GRPO (Shao et al. 2024, DeepSeekMath, arXiv 2402.03300): a_i = (s_i − μ_g)/(σ_g + ε), σ_g the
unbiased group std, ε = ``epsilon`` (1e-6); returns = advantages; broadcast over the row's unmasked
tokens. norm_adv_by_std=False gives drgrpo. Source: verl core_algos.compute_grpo_outcome_advantage
(and _vectorized, via groupwise.group_mean_std with eps=0), SkyRL ppo_utils.compute_grpo_outcome_advantage
— both ε on σ, unbiased torch.std. Engines: a singleton group gets μ = 0, σ = 1, so a = s/(1 + ε) (here 0).""",
    "drgrpo": """Dr. GRPO (Liu et al. 2025, arXiv 2503.20783): a_i = s_i − μ_g (no std division); returns =
advantages. Source: verl grpo with norm_adv_by_std_in_grpo=False, SkyRL grpo with grpo_norm_by_std=False.
Engines: singleton a = s (μ = 0); here 0.""",
    "rloo": """RLOO (Ahmadian et al. 2024, arXiv 2402.14740; Kool et al. 2019): a_i = s_i − (Σ_{j≠i} s_j)/(n − 1)
= n/(n − 1)·(s_i − μ_g); returns = advantages. Source: verl compute_rloo_outcome_advantage (computes
s·n/(n−1) − μ·n/(n−1)) and rloo_vectorized ((c·s − Σs)/(c − 1)), SkyRL compute_rloo_outcome_advantage
((s − μ)·n/(n − 1)). Engines: verl leaves a singleton's score unchanged (a = s); SkyRL sets it to 0
(as here).""",
    "reinforce_plus_plus": """REINFORCE++ (Hu 2025, arXiv 2501.03262): G_t = r_t + γ·G_{t'} over unmasked
positions, t' the next unmasked position of the row (G = 0 after the last), so the discount counts
unmasked tokens only and masked rewards are skipped; advantages = masked_whiten(G) over the whole
batch (shift_mean=True, unbiased, +1e-8), returns = G. Source: verl
compute_reinforce_plus_plus_outcome_advantage (γ = config.gamma; carries the running return through
masked positions). SkyRL 'reinforce++' resets the running return to 0 after every masked position
(a reward after an interior masked span does not reach the tokens before it) and leaves returns at
masked positions unmasked; both agree for right-padded rows.""",
    "reinforce_plus_plus_baseline": """REINFORCE++-baseline (Hu 2025, arXiv 2501.03262): x_i = s_i − μ_g
broadcast over the row's unmasked tokens, then advantages = masked_whiten(x) over the whole batch
(length-weighted statistics, shift_mean=True); returns = advantages. A singleton or constant group has
x = 0 before whitening (S3), which the batch whitening then maps to −μ_b/σ_b like every other 0.
Source: verl compute_reinforce_plus_plus_baseline_outcome_advantage (singleton: μ = 0, x = s).
Not in SkyRL.""",
    "remax": """ReMax (Li et al. 2023, arXiv 2310.10505): returns_t = Σ_{j≥t} r_j·m_j (undiscounted reward to
go), advantages_t = returns_t − b_i at unmasked positions, b_i = reward_baselines[i] (the greedy
rollout's reward). Needs ``reward_baselines [B]``. Source: verl compute_remax_outcome_advantage (its
returns are not masked: inside an interior masked span they hold the suffix sum; here 0). Not in SkyRL.""",
    "opo": """OPO (Hao et al. 2025, arXiv 2505.23585): length-weighted baseline b_g = Σ_i L_i·s_i / Σ_i L_i,
L_i the row's unmasked token count; a_i = s_i − b_g; returns = advantages. A group whose rows all have
L = 0 has every output masked (0). Source: verl compute_opo_outcome_advantage (singleton: b = 0, a = s).
Not in SkyRL.""",
    "gpg": """GPG (Chu et al. 2025, arXiv 2504.02546): a_i = α·(s_i − μ_g)/f_norm, α = B / max(M, 1) with M the
number of rows of the whole batch whose score is non-zero (NaN counts as non-zero, as in
torch.count_nonzero), f_norm = ``f_norm`` (1.0); returns = advantages. α is a batch statistic: a
row's advantage depends on other groups' scores through M. Source: verl compute_gpg_outcome_advantage
(computes the group std but does not use it; singleton: μ = 0, a = α·s). Not in SkyRL.""",
    "gdpo": """GDPO (arXiv 2601.05242): K reward components r^(k) [B, T] (``reward_components``), each
normalised like GRPO within its group, A_k,i = (s^(k)_i − μ^(k)_g)/(σ^(k)_g + ε) (or without σ when
norm_adv_by_std=False; singleton 0), summed with weights w_k (``reward_weights``, default 1):
x_i = Σ_k w_k·A_k,i, then advantages = masked_whiten(x) over the batch; returns = advantages.
Without reward_components, K = 1 with token_level_rewards. Source: verl compute_gdpo_outcome_advantage
(components come from non_tensor_batch[config.gdpo_reward_keys], placed at each row's last response
token). Not in SkyRL.""",
    "grpo_passk": """GRPO Pass@k (Chen et al. 2025, arXiv 2503.19595): in each group only the row with the
strictly largest score gets r_max − r_second (divided by σ_g + ε when norm_adv_by_std), every other
row 0; ties for the maximum give 0 to all; returns = advantages. Source: verl
compute_grpo_passk_outcome_advantage (raises ValueError for a group of one row, here 0; reads
norm_adv_by_std_in_grpo from ``config``, not from its argument; picks the first maximum by topk).
Not in SkyRL.""",
    "maxrl": """MaxRL (SkyRL): a_i = (s_i − μ_g)/(μ_g + ε), mean-normalised group-relative reward; returns =
advantages. Where μ_g + ε = 0 exactly, a_i = ±inf by the sign of s_i − μ_g (0 if equal). Source: SkyRL
ppo_utils.compute_maxrl_advantage (singleton: a = s). Not in verl.""",
}


# --------------------------------------------------------------------------------------------------
# input handling


def _rewards_and_mask(token_level_rewards, response_mask):
    r = as_float64(token_level_rewards, "token_level_rewards")
    if r.ndim != 2:
        raise ValueError(f"token_level_rewards must be [B, T], got shape {r.shape}")
    m = as_mask(response_mask, r.shape, "response_mask")
    return r, m


def _token_array(x, mask, name):
    """[B, T] float64 with masked entries set to 0, and a [B] flag of rows with a non-finite unmasked entry."""
    a = as_float64(x, name)
    if a.shape != mask.shape:
        raise ValueError(f"{name} has shape {a.shape}, expected {mask.shape} (the response mask's shape)")
    a = np.where(mask, a, 0.0)
    bad = ~np.isfinite(a)
    return np.where(bad, 0.0, a), bad.any(axis=1)


def _group_ids(index, bsz):
    if index is None:
        raise ValueError("index (one group id per row) is required for this estimator")
    if is_tensor_like(index):
        index = index.detach().cpu().numpy()
    ids = np.asarray(index, dtype=object).reshape(-1).tolist() if np.ndim(index) else None
    if ids is None or len(ids) != bsz:
        raise ValueError(f"index must have one group id per row (length {bsz}), got shape {np.shape(index)}")
    groups: dict = {}
    for i, g in enumerate(ids):
        groups.setdefault(g, []).append(i)
    return list(groups.values())


def _scores(r, bad_rows):
    """s_i = exactly rounded Σ_t r_{i,t} (masked entries already 0); NaN for poisoned rows."""
    s = np.array([exact_sum(row) for row in r.tolist()]) if r.shape[1] else np.zeros(r.shape[0])
    s[bad_rows] = np.nan
    return s


def _check_eps(epsilon):
    epsilon = float(epsilon)
    if not (math.isfinite(epsilon) and epsilon >= 0.0):
        raise ValueError(f"epsilon must be finite and >= 0, got {epsilon}")
    return epsilon


# --------------------------------------------------------------------------------------------------
# per-group kernels: scores (floats) -> advantages (floats) or exact Fractions


def _std(dev: list, n: int) -> float:
    """Unbiased std from exact deviations (n >= 2), within 1 ulp."""
    var = sum((d * d for d in dev), Fraction(0)) / (n - 1)
    return math.sqrt(float(var))


def _div(num: Fraction, den: Fraction) -> float:
    """num/den rounded once; num = 0 gives 0 (a constant group); den = 0 gives ±inf."""
    if num == 0:
        return 0.0
    if den == 0:
        return math.copysign(math.inf, num)
    return float(num / den)


def _grpo_group(s: list, norm: bool, eps: float, raw: bool = False) -> list:
    """(s_i − μ)/(σ + ε) (or s_i − μ) of one group as exact Fractions, σ rounded to float once; singleton 0
    (``raw``: μ := 0, σ := 1, so s/(1 + ε) or s)."""
    n = len(s)
    if n == 1:
        if not raw:
            return [Fraction(0)]
        return [Fraction(s[0]) / (1 + Fraction(eps)) if norm else Fraction(s[0])]
    fs = [Fraction(x) for x in s]
    mu = sum(fs, Fraction(0)) / n
    dev = [x - mu for x in fs]
    if not norm:
        return dev
    den = Fraction(_std(dev, n)) + Fraction(eps)  # > 0 unless every deviation is 0
    return [d / den if d else Fraction(0) for d in dev]


def _group_kernel(name, s, lengths, *, norm, eps, alpha, f_norm, raw=False):
    """Advantages of one group (list of floats or Fractions), finite scores (``raw``: a singleton's
    statistics are μ := 0, σ := 1, see S3)."""
    n = len(s)
    if n == 1:
        if not raw or name == "grpo_passk":
            return [0.0]
        if name in ("grpo", "drgrpo"):
            return _grpo_group(s, norm and name == "grpo", eps, raw=True)
        if name == "gpg":
            return [alpha * Fraction(s[0]) / Fraction(f_norm)]
        return [Fraction(s[0])]  # maxrl: (s − 0)·1, SkyRL's singleton branch
    fs = [Fraction(x) for x in s]
    if name in ("grpo", "drgrpo"):
        return _grpo_group(s, norm and name == "grpo", eps)
    if name == "rloo":
        tot = sum(fs, Fraction(0))
        return [x - (tot - x) / (n - 1) for x in fs]
    if name == "opo":
        wsum = sum(lengths)
        if wsum == 0:
            return [0.0] * n
        b = sum((L * x for L, x in zip(lengths, fs)), Fraction(0)) / wsum
        return [x - b for x in fs]
    if name == "gpg":
        mu = sum(fs, Fraction(0)) / n
        return [alpha * (x - mu) / Fraction(f_norm) for x in fs]
    if name == "maxrl":
        mu = sum(fs, Fraction(0)) / n
        return [_div(x - mu, mu + Fraction(eps)) for x in fs]
    if name == "grpo_passk":
        order = sorted(range(n), key=lambda i: fs[i], reverse=True)
        top, second = fs[order[0]], fs[order[1]]
        out = [0.0] * n
        if top == second:
            return out
        adv = top - second
        if norm:
            mu = sum(fs, Fraction(0)) / n
            den = Fraction(_std([x - mu for x in fs], n)) + Fraction(eps)
            adv = adv / den
        out[order[0]] = adv
        return out
    raise AssertionError(name)


# --------------------------------------------------------------------------------------------------
# recurrences over unmasked positions (double-double)


def _suffix_recurrence(xh, xl, mask, ch, cl):
    """y_t = x_t + c·y_{t'} at unmasked t (t' the next unmasked position, y = 0 past the last);
    masked positions are skipped (y carried unchanged) and output 0. dd in, dd out ([B, T] pairs)."""
    bsz, seqlen = mask.shape
    yh = np.zeros(bsz)
    yl = np.zeros(bsz)
    oh = np.zeros((bsz, seqlen))
    ol = np.zeros((bsz, seqlen))
    for t in range(seqlen - 1, -1, -1):
        m = mask[:, t]
        ph, pl = dd_mul(yh, yl, ch, cl)
        nh, nl = dd_add(xh[:, t], xl[:, t], ph, pl)
        yh = np.where(m, nh, yh)
        yl = np.where(m, nl, yl)
        oh[:, t] = np.where(m, yh, 0.0)
        ol[:, t] = np.where(m, yl, 0.0)
    return oh, ol


def _poison(out, mask, rows=None):
    """NaN at the unmasked positions of ``rows`` (bool [B]) or of every row (rows=None)."""
    sel = mask if rows is None else (mask & rows[:, None])
    out[sel] = np.nan


# --------------------------------------------------------------------------------------------------
# public API


def outcome_advantage(
    token_level_rewards,
    response_mask,
    index=None,
    *,
    estimator: str,
    epsilon: float = 1e-6,
    norm_adv_by_std: bool = True,
    gamma: float = 1.0,
    reward_baselines=None,
    reward_components=None,
    reward_weights=None,
    f_norm: float = 1.0,
    singleton: str = "zero",
):
    """Advantages and returns of one outcome-reward estimator variant; returns (advantages, returns).

    Inputs (NumPy arrays or torch tensors, any real dtype): token_level_rewards ``[B, T]``;
    response_mask ``[B, T]`` bool or 0/1; index ``[B]`` group ids (required by every variant but
    reinforce_plus_plus and remax). Keyword-only:
      estimator         one of ``ESTIMATORS`` (formula and source: ``ESTIMATOR_DOCS[estimator]``)
      epsilon           ε ≥ 0 added to σ (grpo, gdpo, grpo_passk) or μ (maxrl); default 1e-6 as both engines
      norm_adv_by_std   divide by σ + ε (grpo, gdpo, grpo_passk); grpo with False is drgrpo
      gamma             discount of reinforce_plus_plus (counted over unmasked tokens)
      reward_baselines  ``[B]`` (remax only, required there)
      reward_components ``[K, B, T]`` or a sequence of K ``[B, T]`` (gdpo only; default: K = 1 with
                        token_level_rewards); reward_weights ``[K]`` (gdpo only; default ones)
      f_norm            GPG's normaliser (finite, non-zero; default 1.0)
      singleton         ``"zero"`` (S3: a group of one row gets 0) or ``"raw"`` (an engine's declared
                        convention: its statistics are μ := 0, σ := 1; see S3)
    Returns two float64 ``[B, T]`` arrays, 0.0 at masked positions. The conventions S1–S7 of the
    module docstring hold for every variant: singleton and constant groups get 0; masked inputs are
    ignored; a non-finite unmasked input poisons its ``NAN_SCOPE`` unit with NaN and nothing else.
    Raises ValueError: unknown estimator, shapes, mask values, index length, missing or unexpected
    per-variant input, epsilon < 0, f_norm 0 or non-finite, non-finite gamma, singleton not "zero" / "raw".
    """
    if estimator not in ESTIMATORS:
        raise ValueError(f"unknown estimator {estimator!r}; expected one of {ESTIMATORS}")
    if singleton not in ("zero", "raw"):
        raise ValueError(f"singleton must be 'zero' or 'raw', got {singleton!r}")
    raw = singleton == "raw"
    r, mask = _rewards_and_mask(token_level_rewards, response_mask)
    bsz, seqlen = mask.shape
    eps = _check_eps(epsilon)
    if reward_baselines is not None and estimator != "remax":
        raise ValueError(f"reward_baselines is only used by remax, not {estimator!r}")
    if (reward_components is not None or reward_weights is not None) and estimator != "gdpo":
        raise ValueError(f"reward_components / reward_weights are only used by gdpo, not {estimator!r}")

    if estimator == "remax":
        return _remax(r, mask, reward_baselines)
    if estimator == "reinforce_plus_plus":
        return _reinforce_pp(r, mask, gamma)

    groups = _group_ids(index, bsz)
    lengths = mask.sum(axis=1).astype(int)

    if estimator == "gdpo":
        return _gdpo(r, mask, groups, lengths, reward_components, reward_weights, norm_adv_by_std, eps, raw)

    r0, bad_rows = _token_array(r, mask, "token_level_rewards")
    s = _scores(r0, bad_rows)

    alpha = None
    if estimator == "gpg":
        f_norm = float(f_norm)
        if not math.isfinite(f_norm) or f_norm == 0.0:
            raise ValueError(f"f_norm must be finite and non-zero, got {f_norm}")
        nonzero = int(np.count_nonzero(s))  # NaN != 0 counts, as torch.count_nonzero
        alpha = Fraction(bsz, max(nonzero, 1))

    adv_rows = np.zeros(bsz)
    poisoned = np.zeros(bsz, dtype=bool)
    exact_rows = [Fraction(0)] * bsz  # for the batch whitening of reinforce_plus_plus_baseline
    for members in groups:
        ss = [float(s[i]) for i in members]
        if not all(math.isfinite(x) for x in ss):
            poisoned[members] = True
            continue
        if estimator == "reinforce_plus_plus_baseline":
            dev = _grpo_group(ss, False, 0.0, raw=raw)
            for i, d in zip(members, dev):
                exact_rows[i] = d
            continue
        vals = _group_kernel(estimator, ss, [int(lengths[i]) for i in members],
                             norm=norm_adv_by_std, eps=eps, alpha=alpha, f_norm=f_norm, raw=raw)
        for i, v in zip(members, vals):
            adv_rows[i] = float(v)

    if estimator == "reinforce_plus_plus_baseline":
        adv = _whiten_rows(exact_rows, poisoned, lengths, mask)
        return adv, adv.copy()
    adv = np.where(mask, adv_rows[:, None], 0.0)
    _poison(adv, mask, poisoned)
    return adv, adv.copy()


def _whiten_rows(x: list, poisoned, lengths, mask) -> np.ndarray:
    """masked_whiten of a row-constant [B, T] array (row i holds the exact x_i on its unmasked tokens),
    with the batch statistics computed exactly from (x_i, L_i); NaN everywhere if a row is poisoned."""
    bsz, seqlen = mask.shape
    out = np.zeros((bsz, seqlen))
    nnz = int(lengths.sum())
    if nnz == 0:
        return out
    if poisoned.any():
        out[mask] = np.nan
        return out
    tot = sum((int(L) * xi for L, xi in zip(lengths, x)), Fraction(0))
    sq = sum((int(L) * xi * xi for L, xi in zip(lengths, x)), Fraction(0))
    mean, scale = whiten_scale(ExactMoments(nnz, tot, sq, 0), WHITEN_EPS)
    scale = Fraction(scale)
    rows = np.array([float((xi - mean) / scale) for xi in x])
    return np.where(mask, rows[:, None], 0.0)


def _remax(r, mask, reward_baselines):
    bsz = mask.shape[0]
    if reward_baselines is None:
        raise ValueError("remax needs reward_baselines [B]")
    b = as_float64(reward_baselines, "reward_baselines").reshape(-1)
    if b.shape != (bsz,):
        raise ValueError(f"reward_baselines must have shape ({bsz},), got {b.shape}")
    r0, bad_rows = _token_array(r, mask, "token_level_rewards")
    bad_rows = bad_rows | (~np.isfinite(b) & mask.any(axis=1))
    b = np.where(np.isfinite(b), b, 0.0)
    gh, gl = _suffix_recurrence(r0, np.zeros_like(r0), mask, 1.0, 0.0)
    ah, al = dd_add(gh, gl, np.broadcast_to(-b[:, None], gh.shape), np.zeros_like(gh))
    returns = np.where(mask, dd_round(gh, gl), 0.0)
    adv = np.where(mask, dd_round(ah, al), 0.0)
    _poison(returns, mask, bad_rows)
    _poison(adv, mask, bad_rows)
    return adv, returns


def _reinforce_pp(r, mask, gamma):
    gamma = float(gamma)
    if not math.isfinite(gamma):
        raise ValueError(f"gamma must be finite, got {gamma}")
    r0, bad_rows = _token_array(r, mask, "token_level_rewards")
    gh, gl = _suffix_recurrence(r0, np.zeros_like(r0), mask, gamma, 0.0)
    returns = np.where(mask, dd_round(gh, gl), 0.0)
    _poison(returns, mask, bad_rows)
    adv = masked_whiten(returns, mask)  # NaN in any unmasked return poisons the whole batch
    return adv, returns


def _gdpo(r, mask, groups, lengths, reward_components, reward_weights, norm, eps, raw=False):
    bsz, seqlen = mask.shape
    if reward_components is None:
        comps = [r]
    elif isinstance(reward_components, (list, tuple)):
        comps = list(reward_components)
    else:
        arr = reward_components
        shape = tuple(arr.shape) if hasattr(arr, "shape") else np.shape(arr)
        if len(shape) != 3:
            raise ValueError(f"reward_components must be [K, B, T] or a sequence of [B, T], got shape {shape}")
        comps = [arr[k] for k in range(shape[0])]
    if not comps:
        raise ValueError("reward_components is empty")
    k = len(comps)
    if reward_weights is None:
        w = np.ones(k)
    else:
        w = as_float64(reward_weights, "reward_weights").reshape(-1)
        if w.shape != (k,):
            raise ValueError(f"reward_weights must have shape ({k},), got {w.shape}")
        if not np.isfinite(w).all():
            raise ValueError("reward_weights must be finite")
    total = [Fraction(0)] * bsz
    poisoned = np.zeros(bsz, dtype=bool)
    for c, wk in zip(comps, w.tolist()):
        ck, bad_rows = _token_array(c, mask, "reward_components")
        s = _scores(ck, bad_rows)
        for members in groups:
            ss = [float(s[i]) for i in members]
            if not all(math.isfinite(x) for x in ss):
                poisoned[members] = True
                continue
            vals = _grpo_group(ss, norm, eps, raw=raw)
            for i, v in zip(members, vals):
                total[i] += Fraction(wk) * v
    adv = _whiten_rows(total, poisoned, lengths, mask)
    return adv, adv.copy()


def gae(token_level_rewards, values, response_mask, gamma, lam, *, whiten: bool = True):
    """Generalized Advantage Estimation (Schulman et al. 2016, arXiv 1506.02438); returns (advantages, returns).

    Inputs (NumPy or torch, any real dtype): token_level_rewards, values, response_mask ``[B, T]``;
    gamma (discount) and lam (GAE λ), finite floats. Over the unmasked positions of each row, from
    the last to the first (t' = the next unmasked position of the row; past the last, V_{t'} = A_{t'} = 0):
        δ_t = r_t + γ·V_{t'} − V_t,    A_t = δ_t + γλ·A_{t'},    returns_t = A_t + V_t
    advantages = masked_whiten(A, mask) over the whole batch (shift_mean=True, unbiased, +1e-8) if
    ``whiten`` (verl and SkyRL always whiten), else A. Masked positions are skipped: their rewards and
    values are ignored whatever they hold, and both outputs are 0 there. Returns two float64 [B, T].

    Source: verl 0.9.1 core_algos.compute_gae_advantage_return (skips masked "observation" tokens
    exactly like this: nextvalues and lastgaelam carried through them; but it leaves advantages at
    masked positions unzeroed — the carried value, whitened — and NaN at a masked position leaks
    through ``x·mask``). SkyRL 0.4.0 ppo_utils.compute_gae_advantage_return does *not* skip masked
    positions: V_{t+1} and A_{t+1} are the next column's, whatever its mask; both agree for right-padded
    rows whose masked positions hold r = V = 0.
    Degenerate: 0 or 1 unmasked tokens in the batch: whitening as defined by ``masked_whiten`` (all
    zeros). A non-finite unmasked reward or value: that row's A and returns are NaN (row scope), and
    with ``whiten`` every unmasked advantage of the batch is NaN.
    Accuracy: δ and the recurrence in double-double with γλ exact, so A and returns are within one
    ulp + ~2^-100·(Σ of the magnitudes of the terms) of the exact recurrence on the given floats
    (|inputs| ≤ 1e290); whitened advantages add the whitening's error (``masked_whiten``).
    """
    r, mask = _rewards_and_mask(token_level_rewards, response_mask)
    r0, bad_r = _token_array(r, mask, "token_level_rewards")
    v0, bad_v = _token_array(values, mask, "values")
    bad_rows = bad_r | bad_v
    gamma, lam = float(gamma), float(lam)
    if not (math.isfinite(gamma) and math.isfinite(lam)):
        raise ValueError(f"gamma and lam must be finite, got {gamma}, {lam}")
    ch, cl = two_prod(gamma, lam)
    bsz, seqlen = mask.shape
    ah = np.zeros(bsz)
    al = np.zeros(bsz)
    vnext = np.zeros(bsz)
    adv = np.zeros((bsz, seqlen))
    ret = np.zeros((bsz, seqlen))
    for t in range(seqlen - 1, -1, -1):
        m = mask[:, t]
        vt = v0[:, t]
        ph, pl = two_prod(gamma, vnext)
        s1, e1 = two_sum(r0[:, t], ph)
        s2, e2 = two_sum(s1, -vt)
        dh, dl = two_sum(s2, e1 + e2 + pl)
        qh, ql = dd_mul(ah, al, ch, cl)
        nh, nl = dd_add(dh, dl, qh, ql)
        ah = np.where(m, nh, ah)
        al = np.where(m, nl, al)
        vnext = np.where(m, vt, vnext)
        adv[:, t] = np.where(m, dd_round(ah, al), 0.0)
        rh, rl = dd_add(ah, al, vt, np.zeros(bsz))
        ret[:, t] = np.where(m, dd_round(rh, rl), 0.0)
    _poison(adv, mask, bad_rows)
    _poison(ret, mask, bad_rows)
    if whiten:
        adv = masked_whiten(adv, mask)
    return adv, ret
