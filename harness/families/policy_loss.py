"""Policy-gradient losses ``policy_loss``: the loss, its gradient w.r.t. the log-probs, and its metrics.

Canonical form: a :class:`~rlconform.harness.core.contracts.LossVariants` registry whose callables are one
micro-batch's call ``(old_log_prob [b, T], log_prob [b, T], advantages [b, T], response_mask [b, T]
bool, info: BatchInfo) -> (loss 0-d, metrics: dict[str, float])``. Micro-batch losses are summed
(gradient accumulation, one DP rank); the aggregation is the global **token-mean** (Σ L·m over the
mini-batch / the mini-batch's valid tokens, verl's ``global_batch_info``), except ``geo_mean``
(mean over the mini-batch's rows, as the reference defines it) and a variant whose aggregation the
binding declares forced (:attr:`LossVariants.agg_modes`: verl's SAPO is always ``seq-mean-token-mean``),
which the reference aggregates as declared. Metrics (clip fraction ``pg_clipfrac``,
approx KL ``ppo_kl``, ...) are means over valid tokens; the engine folds the micro-batches' dicts with
its ``combine_metrics``. The reference is :func:`rlconform.reference.policy_loss` (and
``policy_loss_grad``) with the variant's parameters in :data:`VARIANTS`: the engines' defaults and
their documented numerical guards (the ±20 log-ratio clamp, GSPO's log s ≤ 10), so that an engine is
compared with what it claims to compute (docs/engines/policy-losses.md §1–2).

Each variant is a finding dimension: regimes ``<variant>@moderate`` (|Δ| ≤ 1, padded rows, fp32 and
fp64) and ``<variant>@extreme_log_ratios`` (a few tokens with Δ = ±100 in fp32, ±20 in bf16, where
``exp`` overflows; fp32 and bf16). ``partition_invariant`` splits the rows into 2–4 micro-batches
(loss, gradient and metrics must not change; ``clip_cov`` / ``kl_cov`` select tokens by a covariance
over the call's tokens, batch-global by design, so they are not checked for it); ``mask_invariant``
writes NaN, ±inf or 1e30 into every input at masked positions.

Yardstick ("faithful" path): the float64 reference evaluated with log_prob moved by one rounding of
the log-ratio's operands in the compute dtype (log_prob − ε·(|log_prob| + |old_log_prob|), ε = 2⁻²⁴ for
fp32 compute of fp32/bf16 inputs, 2⁻⁵³ for fp64; ``fl(ℓ − o)`` rounds at the larger operand's scale, e.g.
o ≈ −25 below a log-ratio beyond the clamp), rounded to the engine's output dtype: what a correct fp32
computation can differ by, including exp's amplification of the log-ratio's rounding and a token within that rounding of a
clip threshold falling on the other side. bf16 engines are held to fp32 compute rounded to bf16, as
everywhere in the catalog. Metrics are logged numbers: they are compared at float32 precision at most
(an fp64 run's metrics pass through fp32 loggers). The reference engine binds :func:`faithful_loss`
(the float64 reference per micro-batch as an autograd op).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from hypothesis import strategies as st

import rlconform.reference as R
from rlconform.harness.core import strategies as S
from rlconform.harness.core.branches import Branch, place_in_regions, place_rows_in_regions
from rlconform.harness.core.contracts import BatchInfo, LossVariants
from rlconform.harness.core.evaluation import Compared, Evaluation
from rlconform.harness.core.failure import problem as problem_clause
from rlconform.harness.core.opinfo import (
    FINITE,
    MASK_INVARIANT,
    MATCHES_REFERENCE,
    NON_DESTRUCTIVE,
    PARTITION_INVARIANT,
    OpInfo,
    reference_function,
    split_regime,
    variant_regime,
)
from rlconform.harness.core.tensors import as_numpy
from rlconform.harness.families import OpFamily
from rlconform.harness.families._token_loss import drive_micro_batches, guarded_call, loss_mask, second_looks
from rlconform.reference.exact_sum import exact_sum

#: catalog variant -> keyword arguments of :func:`rlconform.reference.policy_loss` (besides the
#: aggregation). Engine defaults (clip 0.2/0.2, dual-clip c = 3, SAPO τ 1.0/1.05, DRO β 0.5) and guards.
VARIANTS = {
    "vanilla": dict(variant="vanilla", clip_ratio_c=3.0, log_ratio_clamp=20),  # verl vanilla, SkyRL dual_clip
    "ppo_clip": dict(variant="vanilla", clip_ratio_c=None, log_ratio_clamp=20),  # SkyRL regular
    "gspo": dict(variant="gspo", log_ratio_clamp=(None, 10)),
    "sapo": dict(variant="sapo", log_ratio_clamp=20),
    "gpg": dict(variant="gpg"),
    "cross_entropy": dict(variant="cross_entropy"),
    "importance_sampling": dict(variant="importance_sampling"),
    # every candidate selected (ratio 1): the engines' random choice among candidates is then determined
    "clip_cov": dict(variant="clip_cov", clip_cov_ratio=1.0, clip_cov_lb=1.0, clip_cov_ub=5.0),
    "kl_cov": dict(variant="kl_cov", kl_cov_ratio=0.2, ppo_kl_coef=1.0),  # SkyRL's defaults
    "geo_mean": dict(variant="geo_mean"),
    "dro": dict(variant="dro", dro_beta=0.5),
    "cispo": dict(variant="cispo", log_ratio_clamp=20),
    "dppo_tv": dict(variant="dppo_tv", clip_ratio_c=3.0, log_ratio_clamp=20),
    "dppo_kl": dict(variant="dppo_kl", clip_ratio_c=3.0, log_ratio_clamp=20),
    "dppo_binary_tv": dict(variant="dppo_binary_tv", log_ratio_clamp=20),
    "dppo_binary_kl": dict(variant="dppo_binary_kl", log_ratio_clamp=20),
    "rollout_is": dict(variant="rollout_is", log_ratio_clamp=20),
}
#: aggregation of every variant but geo_mean (which ignores it)
LOSS_AGG_MODE = "token-mean"
#: metrics an engine must log when the reference defines them (the others are compared when logged)
REQUIRED_METRICS = ("pg_clipfrac",)
#: variants whose token selection depends on the call's whole batch (not partition invariant by design)
BATCH_GLOBAL = ("clip_cov", "kl_cov")
GARBAGE = (np.nan, np.inf, -np.inf, 1e30)
EXTREME = {"float32": 100.0, "float64": 100.0, "bfloat16": 20.0, "float16": 20.0}

_MODERATE = [variant_regime(v, "moderate") for v in VARIANTS]


def _parameters(variant: str) -> str:
    """The parameters ``variant`` is checked with (its :data:`VARIANTS` entry; the PPO clip ε of the clipped
    variants is the reference's default, 0.2 / 0.2, as the engines' defaults), in words."""
    kw = {k: v for k, v in VARIANTS[variant].items() if k != "variant"}
    dppo = variant.startswith("dppo_")
    # clip_ratio_low / _high (the reference's defaults): the PPO clip, DPPO's divergence thresholds, geo_mean's
    # log-space bounds
    words = {"vanilla": ["clip ε 0.2 / 0.2"], "ppo_clip": ["clip ε 0.2 / 0.2"], "geo_mean": ["log-space bounds 0.2 / 0.2"]
             }.get(variant, ["divergence thresholds 0.2 / 0.2"] if dppo else [])
    for k, v in kw.items():
        if k == "log_ratio_clamp":
            words.append(f"log-ratio clamp {'±' + format(v, 'g') if not isinstance(v, tuple) else f'max {v[1]:g}'}")
        elif k == "clip_ratio_c":
            words.append("no dual clip" if v is None else f"{'truncation cap' if dppo else 'dual-clip c'} {v:g}")
        else:
            words.append(f"{k} {v:g}")
    return ", ".join(words)


OPS = (
    OpInfo("policy_loss", "policy_loss", None,
           (MATCHES_REFERENCE, PARTITION_INVARIANT, NON_DESTRUCTIVE, FINITE, MASK_INVARIANT),
           {**{variant_regime(v, "moderate"): ("float32", "float64") for v in VARIANTS},
            **{variant_regime(v, "extreme_log_ratios"): ("float32", "bfloat16") for v in VARIANTS}},
           reference_function("policy_loss"), reference_function("policy_loss_grad"), differentiable=True,
           source="verl 0.9.1 core_algos (register_policy_loss); SkyRL 0.4.0 ppo_utils.PolicyLossRegistry; "
                  "papers in rlconform.reference.policy_loss",
           family="policy_loss", variants=tuple(VARIANTS),
           property_regimes={
               PARTITION_INVARIANT: tuple(variant_regime(v, "moderate") for v in VARIANTS if v not in BATCH_GLOBAL),
               NON_DESTRUCTIVE: tuple(_MODERATE),
               MASK_INVARIANT: tuple(_MODERATE),
               FINITE: tuple(variant_regime(v, "extreme_log_ratios") for v in VARIANTS),
           },
           variant_parameters={v: _parameters(v) for v in VARIANTS if _parameters(v)}),
)


# ------------------------------------------------------------------------------------ branches
_LOG_LO, _LOG_HI, _LOG_C = math.log(0.8), math.log(1.2), math.log(3.0)  # 1 − εl, 1 + εh, c (engine defaults)
#: log-ratio intervals Δ = ℓ − o the moderate regime places tokens in, each with the advantage
#: sign its branch needs (0: any); margins keep a token's fp32 rounding on its side of the threshold
REGIONS = {
    "inside the clip range": ((_LOG_LO + 0.03, _LOG_HI - 0.03), 0),
    "below 1 − εl": ((-1.5, _LOG_LO - 0.03), -1),
    "above 1 + εh, A > 0": ((_LOG_HI + 0.03, _LOG_C - 0.05), 1),
    "above 1 + εh, below c, A < 0": ((_LOG_HI + 0.03, _LOG_C - 0.05), -1),
    "above the dual-clip c, A < 0": ((_LOG_C + 0.05, 2.5), -1),
    "beyond the +20 clamp": ((20.5, 25.0), 0),
    "beyond the −20 clamp": ((-25.0, -20.5), 0),
}
#: regions of a whole row's mean log-ratio (GSPO's sequence ratio s = exp(mean Δ), log s clamped at 10)
ROW_REGIONS = {
    "s above 1 + εh, A > 0": ((_LOG_HI + 0.03, 1.0), 1),
    "s below 1 − εl, A < 0": ((-1.5, _LOG_LO - 0.03), -1),
    "log s beyond the 10 clamp": ((10.5, 13.0), 0),
}


def _delta(x):
    return x["log_prob"] - x["old_log_prob"]


def _ratio_clip(x, low=True, high=True):
    """[B, T] bool: the token ratio below 1 − εl (low) / above 1 + εh (high)."""
    d = _delta(x)
    return ((d < _LOG_LO) if low else False) | ((d > _LOG_HI) if high else False)


def _gspo_mean(x):
    m = x["mask"]
    d = np.where(m, _delta(x), 0.0)
    return np.broadcast_to((d.sum(-1) / np.maximum(m.sum(-1), 1))[:, None], m.shape)


def _cov(x):
    m, a, lp = x["mask"], x["advantages"], x["log_prob"]
    n = max(int(m.sum()), 1)
    return (a - a[m].sum() / n) * (lp - lp[m].sum() / n)


def _p(x):
    return np.exp(x["log_prob"]), np.exp(x["old_log_prob"])


def _bkl(x):
    p, po = _p(x)
    return po * (x["old_log_prob"] - x["log_prob"]) + (1 - po) * np.log((1 - po + 1e-8) / (1 - p + 1e-8))


def _b(name, fn):
    return Branch(name, fn)


_POS = lambda x: x["advantages"] > 0  # noqa: E731
_NEG = lambda x: x["advantages"] < 0  # noqa: E731
_PPO = (
    _b("unclipped (ratio inside [1 − εl, 1 + εh])", lambda x: ~_ratio_clip(x)),
    _b("clip high binds (ratio > 1 + εh, A > 0)", lambda x: (_delta(x) > _LOG_HI) & _POS(x)),
    _b("clip low binds (ratio < 1 − εl, A < 0)", lambda x: (_delta(x) < _LOG_LO) & _NEG(x)),
    _b("unclipped below 1 − εl (A > 0 keeps −A·r)", lambda x: (_delta(x) < _LOG_LO) & _POS(x)),
    _b("log-ratio beyond the ±20 clamp", lambda x: np.abs(_delta(x)) > 20),
)
_CLAMP = (_b("log-ratio beyond the ±20 clamp", lambda x: np.abs(_delta(x)) > 20),)
_ANY = (_b("any valid token", lambda x: np.ones(x["mask"].shape, bool)),)
_OUTSIDE = (
    _b("ratio inside (1 − εl, 1 + εh)", lambda x: ~_ratio_clip(x)),
    _b("ratio below 1 − εl", lambda x: _ratio_clip(x, high=False)),
    _b("ratio above 1 + εh", lambda x: _ratio_clip(x, low=False)),
) + _CLAMP


def _dppo(kind, truncated):
    if kind == "tv":
        hi = lambda x: _POS(x) & (_p(x)[0] - _p(x)[1] > 0.2)  # noqa: E731
        lo = lambda x: _NEG(x) & (_p(x)[1] - _p(x)[0] > 0.2)  # noqa: E731
    else:
        hi = lambda x: _POS(x) & (_p(x)[0] > _p(x)[1]) & (_bkl(x) > 0.2)  # noqa: E731
        lo = lambda x: _NEG(x) & (_p(x)[0] < _p(x)[1]) & (_bkl(x) > 0.2)  # noqa: E731
    out = (_b(f"A > 0, {kind} divergence above εh (token masked out)", hi),
           _b(f"A < 0, {kind} divergence beyond εl (token masked out)", lo),
           _b("token kept", lambda x: ~hi(x) & ~lo(x)))
    if truncated:
        out += (_b("ratio above the truncation c (kept token)", lambda x: (_delta(x) > _LOG_C) & ~hi(x) & ~lo(x)),)
    return out + _CLAMP


#: variant -> the branches of its definition (reference.policy_loss's module doc; thresholds at the catalog's
#: parameters, VARIANTS): every one must be taken by the CI profile's moderate examples
BRANCHES = {
    "vanilla": _PPO + (
        _b("above 1 + εh, below c, A < 0 (unclipped −A·r)", lambda x: (_delta(x) > _LOG_HI) & (_delta(x) < _LOG_C)
           & _NEG(x)),
        _b("dual clip binds (ratio > c, A < 0)", lambda x: (_delta(x) > _LOG_C) & _NEG(x))),
    "ppo_clip": _PPO + (
        _b("above 1 + εh, A < 0 (unclipped −A·r, no dual clip)", lambda x: (_delta(x) > _LOG_HI) & _NEG(x)),),
    "gspo": (
        _b("s inside the clip range", lambda x: np.abs(_gspo_mean(x) - (_LOG_LO + _LOG_HI) / 2) < (_LOG_HI - _LOG_LO) / 2),
        _b("clip high binds (s > 1 + εh, A > 0)", lambda x: (_gspo_mean(x) > _LOG_HI) & _POS(x)),
        _b("clip low binds (s < 1 − εl, A < 0)", lambda x: (_gspo_mean(x) < _LOG_LO) & _NEG(x)),
        _b("log s beyond the 10 clamp", lambda x: _gspo_mean(x) > 10)),
    "sapo": (_b("A > 0 (τ_pos)", _POS), _b("A < 0 (τ_neg)", _NEG)) + _CLAMP,
    "gpg": _ANY,
    "cross_entropy": _ANY,
    "importance_sampling": _ANY,
    "clip_cov": (
        _b("selected (unclipped, lb < cov < ub): loss zeroed",
           lambda x: ~_ratio_clip(x) & (_cov(x) > 1.0) & (_cov(x) < 5.0)),
        _b("not a candidate: cov outside (lb, ub)", lambda x: (_cov(x) <= 1.0) | (_cov(x) >= 5.0)),
        _b("not a candidate: clipped", lambda x: ((_delta(x) > _LOG_HI) & _POS(x)) | ((_delta(x) < _LOG_LO) & _NEG(x)))),
    "kl_cov": (
        _b("selected (largest cov): KL penalty added", lambda x: _cov(x) >= np.sort(_cov(x)[x["mask"]])[::-1][
            max(1, int(0.2 * x["mask"].sum())) - 1] if x["mask"].any() else np.zeros(x["mask"].shape, bool)),
        _b("not selected", lambda x: _cov(x) < np.sort(_cov(x)[x["mask"]])[::-1][
            max(1, int(0.2 * x["mask"].sum())) - 1] if x["mask"].any() else np.zeros(x["mask"].shape, bool))),
    "geo_mean": (
        _b("log-space clip high binds (Δ > εh, A > 0)", lambda x: (_delta(x) > 0.2) & _POS(x)),
        _b("log-space clip low binds (Δ < −εl, A < 0)", lambda x: (_delta(x) < -0.2) & _NEG(x)),
        _b("unclipped (−εl ≤ Δ ≤ εh)", lambda x: np.abs(_delta(x)) <= 0.2),
        _b("unclipped beyond the bounds (Δ > εh with A < 0, Δ < −εl with A > 0)",
           lambda x: ((_delta(x) > 0.2) & _NEG(x)) | ((_delta(x) < -0.2) & _POS(x)))),
    "dro": _ANY,
    "cispo": _OUTSIDE,
    "rollout_is": _OUTSIDE,
    "dppo_tv": _dppo("tv", True),
    "dppo_kl": _dppo("kl", True),
    "dppo_binary_tv": _dppo("tv", False),
    "dppo_binary_kl": _dppo("kl", False),
}


def _place_branches(rng, old, delta, adv, mask, variant, forced_signs: bool):
    """Move tokens (or, for gspo, whole rows) of ``delta`` into :data:`REGIONS` / :data:`ROW_REGIONS`; where
    a region needs an advantage sign and ``forced_signs``, the token's (row's) advantage gets it."""
    if variant == "gspo":
        regs = list(ROW_REGIONS.values())
        delta, which = place_rows_in_regions(rng, delta, mask, [r for r, _ in regs], reduce="mean")
        if forced_signs:
            sign = np.array([s for _, s in regs] + [0])[which][:, None]
            adv = np.where(sign != 0, sign * (np.abs(adv) + (adv == 0)), adv)
        return delta, adv
    regs = list(REGIONS.values())
    delta, which = place_in_regions(rng, delta, [r for r, _ in regs], where=mask)
    if forced_signs:
        sign = np.array([s for _, s in regs] + [0])[which]  # which = -1 picks the trailing 0
        adv = np.where(sign != 0, sign * (np.abs(adv) + (adv == 0)), adv)
    return delta, adv


# ------------------------------------------------------------------------------------ inputs
@st.composite
def inputs(draw, dtype: str, variant: str, data: str):
    """``{"old_log_prob", "log_prob", "advantages": [B, T] float64 (exact in dtype; log-probs ≤ 0),
    "mask": [B, T] bool (right-padded or multi-turn rows: observation spans between
    valid tokens, some rows empty), "partitions": 2 lists of micro-batch row
    ranges, "garbage": float, "variant": str}``; B ≤ 8, T ≤ 64. Masked positions hold ordinary values
    (a loss that sums them shows in the base run). ``moderate``: |Δ| ≤ 1, and in most examples a quarter
    of the tokens placed in the branch regions of :data:`REGIONS` (ratio below 1 − εl, above 1 + εh, above
    the dual-clip c with A < 0, log-ratio beyond ±20: :data:`BRANCHES` lists what each variant takes)."""
    b = draw(st.integers(1, 8))
    t = draw(st.sampled_from([1, 4, 16, 64]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    lengths = rng.integers(0, t + 1, size=b)
    if draw(st.booleans()):
        lengths[rng.integers(0, b)] = t
    mask = S.loss_masks(draw, rng, b, t, lengths)  # right padding or multi-turn rows
    old = np.log(rng.uniform(0.05, 1.0, (b, t)))
    delta = rng.uniform(-1.0, 1.0, (b, t)) * draw(st.sampled_from([1e-3, 0.1, 1.0]))
    if data == "extreme_log_ratios":
        big = EXTREME[dtype]
        hits = rng.random((b, t)) < draw(st.sampled_from([0.05, 0.3]))
        hits[rng.integers(0, b), rng.integers(0, t)] = True
        sign = rng.choice([-1.0, 1.0], size=(b, t))
        delta = np.where(hits, sign * big, delta)
        old = np.where(hits & (sign > 0), old - big - 0.5, old)  # keep log_prob = old + Δ ≤ 0
    adv = rng.standard_normal((b, t))
    kind = draw(st.sampled_from(["token", "row", "zeros"]))
    if variant in BATCH_GLOBAL:  # per-token advantages: no tied covariances (the selection is then determined)
        kind = "token"
    if kind == "row":  # GRPO: one advantage per sequence
        adv = np.repeat(rng.standard_normal((b, 1)), t, axis=1)
    elif kind == "zeros":
        adv = np.where(rng.random((b, t)) < 0.3, 0.0, adv)
    if data == "moderate" and draw(st.booleans()):  # take every branch; half the examples as before
        delta, adv = _place_branches(rng, old, delta, adv, mask, variant, forced_signs=kind != "row")
        old = np.minimum(old, -delta - rng.uniform(0.05, 0.5, (b, t)))  # keep log_prob = old + Δ ≤ 0
    lp = old + delta
    lp = np.where(lp > 0, old - np.abs(delta), lp)
    parts = []
    for _ in range(2):
        k = draw(st.integers(1, min(b, 4)))
        parts.append(draw(S.composition(b, k)))
    return {"old_log_prob": S.round_to(old, dtype), "log_prob": S.round_to(lp, dtype),
            "advantages": S.round_to(adv, dtype), "mask": mask, "partitions": parts,
            "garbage": draw(st.sampled_from(GARBAGE)), "variant": variant}


def strategy(op: OpInfo, dtype: str, regime: str):
    variant, data = split_regime(regime)
    return inputs(dtype, variant, data)


# ----------------------------------------------------------------------------- the reference
def reference(variant: str, old, lp, adv, mask, *, agg: str = LOSS_AGG_MODE):
    """(loss, gradient [B, T], metrics {key: SumCount}) of the float64 reference for a catalog variant."""
    kw = dict(VARIANTS[variant], loss_agg_mode=agg)
    loss, metrics = R.policy_loss(old, lp, adv, mask, **kw)
    grad = R.policy_loss_grad(old, lp, adv, mask, **kw)
    return loss, grad, metrics


class _Faithful(torch.autograd.Function):
    """The float64 reference of one micro-batch as an autograd op: value and closed-form gradient,
    normalised by the mini-batch's totals (token-mean: Σ L·m / global nnz; geo_mean: Σ rows / global
    rows), rounded to the log-probs' dtype."""

    @staticmethod
    def forward(ctx, log_prob, old, adv, mask, variant, info):
        lp64, old64, adv64 = (as_numpy(x) for x in (log_prob, old, adv))
        m = mask.detach().cpu().numpy().astype(bool)
        if variant == "geo_mean":
            loss, grad, metrics = reference(variant, old64, lp64, adv64, m)
            scale = m.shape[0] / max(info.global_batch_size, 1)
        else:
            loss, grad, metrics = reference(variant, old64, lp64, adv64, m, agg="token-sum")
            scale = 1.0 / max(info.global_nnz, 1)
        ctx.grad = torch.from_numpy(grad * scale)
        ctx.metrics = metrics
        ctx.dtype = log_prob.dtype
        return torch.tensor(loss * scale, dtype=torch.float64).to(log_prob.dtype)

    @staticmethod
    def backward(ctx, grad_output):
        return (ctx.grad * grad_output.double()).to(ctx.dtype), None, None, None, None, None


def faithful_loss(variant: str):
    """The reference engine's binding of ``variant``: the float64 reference through :class:`_Faithful`;
    metrics are per-call means (Python floats), folded token-weighted by :func:`token_weighted`."""

    def loss(old_log_prob, log_prob, advantages, response_mask, info):
        out = _Faithful.apply(log_prob, old_log_prob, advantages, response_mask, variant, info)
        m = response_mask.detach().cpu().numpy().astype(bool)
        _, _, metrics = reference(variant, as_numpy(old_log_prob), as_numpy(log_prob), as_numpy(advantages), m,
                                  agg="token-sum") if m.any() else (None, None, {})
        return out, {k: v.mean for k, v in metrics.items()}

    loss.__qualname__ = f"reference.policy_loss[{variant}]"
    return loss


def token_weighted(parts: list) -> dict:
    """Fold per-micro-batch metric means token-weighted: Σ mean·n / Σ n over the parts that logged the key
    with n > 0 (sum/count, never a mean of means)."""
    keys = sorted({k for metrics, _ in parts for k in metrics})
    out = {}
    for k in keys:
        num = [float(metrics[k]) * n for metrics, n in parts if k in metrics and n > 0]
        den = sum(n for metrics, n in parts if k in metrics and n > 0)
        if den:
            out[k] = exact_sum(num) / den
    return out


def reference_variants() -> LossVariants:
    return LossVariants({v: faithful_loss(v) for v in VARIANTS}, combine_metrics=token_weighted)


# ------------------------------------------------------------------------------ the engine run
def _info(mask: np.ndarray) -> BatchInfo:
    return BatchInfo(dp_size=1, global_nnz=int(mask.sum()), global_batch_size=int(mask.shape[0]),
                     global_nonempty_seqs=int((mask.sum(-1) > 0).sum()), num_micro_batches=1)


def run(impl: LossVariants, fn, arrays: dict, mask: np.ndarray, dtype: str, partition, ev: Evaluation):
    """Drive ``fn`` over the micro-batches of ``partition``
    (:func:`~rlconform.harness.families._token_loss.drive_micro_batches`): (loss, gradient [B, T] or None,
    metrics, output dtype), or None after a problem."""
    info = BatchInfo(**{**_info(mask).__dict__, "num_micro_batches": len(partition)})
    return drive_micro_batches("policy_loss", lambda t, m: fn(t["old_log_prob"], t["log_prob"], t["advantages"], m, info), arrays, "log_prob",
                               impl.combine_metrics, mask, dtype, partition, ev)


def agg_mode(impl: LossVariants, variant: str) -> str:
    """The loss_agg_mode the reference aggregates ``variant`` with for this binding: the one the binding
    declares the engine forces (:attr:`LossVariants.agg_modes`), else the catalog's token-mean."""
    return (getattr(impl, "agg_modes", None) or {}).get(variant, LOSS_AGG_MODE)


def _round(x, dtype: str) -> np.ndarray:
    return S.round_to(np.asarray(x, dtype=np.float64), dtype)


#: relative rounding of the compute dtype (fp32 for every input dtype but fp64)
COMPUTE_EPS = {"float64": 2.0**-53, "float32": 2.0**-24, "bfloat16": 2.0**-24, "float16": 2.0**-24}


def yardstick(variant: str, arrays: dict, mask: np.ndarray, dtype: str, ref, agg: str = LOSS_AGG_MODE):
    """The reference at log_prob − ε·(|log_prob| + |old_log_prob|) (module doc); the reference itself where
    that is undefined."""
    lp, old = arrays["log_prob"], arrays["old_log_prob"]
    with np.errstate(invalid="ignore", over="ignore"):
        moved = lp - COMPUTE_EPS[dtype] * (np.abs(lp) + np.abs(old))
    try:
        return reference(variant, old, moved,
                         arrays["advantages"], mask, agg=agg)
    except ValueError:
        return ref


def _compared(label, out, ref, dtype, mask, ev, faithful) -> list[Compared]:
    loss, grad, metrics, odt = out
    r_loss, r_grad, r_metrics = ref
    f_loss, f_grad, f_metrics = faithful
    mdt = "float32" if odt == "float64" else odt
    res = [Compared(f"{label}loss", np.float64(loss), np.float64(r_loss), _round(f_loss, odt), odt, "pipeline")]
    for key in sorted(r_metrics):
        want = r_metrics[key].mean
        if math.isnan(want):
            continue
        if key not in metrics:
            if key in REQUIRED_METRICS:
                ev.problems.append(problem_clause("lost metric", f"metric {key!r} missing: the engine logged "
                                                                  f"{sorted(metrics)}", key=f"metric {key}"))
            continue
        f_want = f_metrics[key].mean if key in f_metrics else want
        res.append(Compared(f"{label}metric {key}", np.float64(float(metrics[key])), np.float64(want),
                            _round(f_want, mdt), mdt, "pipeline", quantity="metric"))
    grads = []
    if grad is not None:
        grads.append(Compared(f"{label}gradient w.r.t. log_prob", grad, r_grad, _round(f_grad, odt), odt,
                              "pipeline", only_where=mask))
    return res, grads


def evaluate(binding, case) -> Evaluation:
    impl = binding.resolve("policy_loss")
    variant = case.inputs["variant"]
    fn = impl.get("policy_loss", variant, binding.name)
    mask = loss_mask(case)
    arrays = {k: case.inputs[k] for k in ("old_log_prob", "log_prob", "advantages")}
    ev = Evaluation()
    if variant in BATCH_GLOBAL and mask.any():
        try:  # tied covariances at the k-th place: the engine's selection is not determined by the inputs
            reference(variant, arrays["old_log_prob"], arrays["log_prob"], arrays["advantages"], mask)
        except ValueError as exc:
            ev.undefined = f"the reference is undefined here: {exc}"
            return ev
    if case.property == NON_DESTRUCTIVE:
        return guarded_call("policy_loss", fn, arrays, "log_prob", mask, case.dtype,
                            lambda f, t, m: f(t["old_log_prob"], t["log_prob"], t["advantages"], m, _info(mask)), ev)
    if not mask.any():
        ev.undefined = "the token-mean policy loss of a mini-batch with no valid token is undefined"
        return ev
    agg = agg_mode(impl, variant)
    try:
        ref = reference(variant, arrays["old_log_prob"], arrays["log_prob"], arrays["advantages"], mask, agg=agg)
    except ValueError as exc:
        ev.undefined = f"the reference is undefined here: {exc}"
        return ev
    fa = yardstick(variant, arrays, mask, case.dtype, ref, agg)
    out = run(impl, fn, arrays, mask, case.dtype, [(0, mask.shape[0])], ev)
    if out is None:
        return ev
    ev.values, ev.gradients = _compared("", out, ref, case.dtype, mask, ev, fa)
    ev.base_label = "one micro-batch"
    second_looks(case, arrays, mask, ev, lambda a, p: run(impl, fn, a, mask, case.dtype, p, ev),
                 lambda label, alt: _compared(label, alt, ref, case.dtype, mask, ev, fa))
    return ev


FAMILY = OpFamily("policy_loss", OPS, strategy, evaluate, order=60,
                  doc="policy-gradient losses (PPO and successors): loss, gradient w.r.t. log_prob, metrics")
