"""Advantage estimators, GAE and whitening: ``outcome_advantage`` (one variant per estimator), ``gae``,
``masked_whiten``.

Canonical signatures (torch in, torch out; ``index`` a NumPy int64 array of group ids, rows of a group
need not be contiguous):

==================  ===============================================================================
op                  signature
==================  ===============================================================================
outcome_advantage   variant callable ``(token_level_rewards [B, T], response_mask [B, T], index [B],
                    **extras) -> (advantages [B, T], returns [B, T])``; extras: ``reward_baselines [B]``
                    (remax), ``reward_components [K, B, T]`` (gdpo). Bound as
                    :class:`~rlconform.harness.core.contracts.Variants` (the engine's registry).
gae                 ``(token_level_rewards [B, T], values [B, T], response_mask [B, T], gamma, lam)
                    -> (advantages [B, T], returns [B, T])``
masked_whiten       ``(values [B, T], mask [B, T], shift_mean: bool) -> [B, T]``
==================  ===============================================================================

The catalog's parameters, which a binding configures its engine with: ε = 1e-6 (on σ, unbiased group
std), ``norm_adv_by_std`` True except for ``drgrpo``, γ = 1 for reinforce_plus_plus, GPG's f_norm = 1,
GDPO's weights 1, whitening ε = 1e-8. The float64 references
(:mod:`rlconform.reference.advantage_estimators`, :mod:`rlconform.reference.whitening`) define every
degenerate case: a singleton or constant group gets advantage 0, whitening 0 or 1 valid tokens is
defined, masked inputs are ignored whatever they hold and masked outputs are 0 (only unmasked outputs
are compared). Each estimator is a variant (``grpo@uneven_groups``), so a fault in one is its own
finding.

Regimes: ``uneven_groups`` (group sizes 2–5, shuffled index, rows of 0 to T tokens, outcome rewards at
each row's last valid token), ``singleton_groups`` (the same with at least one group of one row: the reference
gives it 0, several engines its raw score, a convention kept apart so it never hides other faults) and
``near_constant`` (groups whose rewards are equal or differ
by 1e-7 relative: where E[x²] − μ² cancels; “one-pass variance E[x²] − μ²”). A second implementation of an estimator an engine registers
(:data:`VARIANT_IMPLEMENTATIONS`: verl's ``grpo_vectorized`` is ``vectorized``) is checked as that estimator
under ``grpo+vectorized@uneven_groups`` ... with every property, and against the engine's default
implementation (``implementations_agree``). The dtype-faithful path is the same
formulas in float32 (float64 stays float64) with two-pass group statistics.

Masks: every regime of every op draws right-padded rows or multi-turn rows
(:func:`~rlconform.harness.core.strategies.multi_turn_mask`: tool-observation spans between trainable
tokens, single tokens and long runs at the start, middle and end, rows that are all observation). The
references skip a masked position: GAE's δ and recurrence jump over an interior span to the next valid
token (verl 0.9.1 ``core_algos.compute_gae_advantage_return``, lines 250–256: ``nextvalues`` and
``lastgaelam`` carried through masked columns), the outcome score sums the row's valid rewards.
"""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import strategies as st

import rlconform.reference as R
from rlconform.harness.core import strategies as S
from rlconform.harness.core.branches import Branch
from rlconform.harness.core.declared import followed, mask_layout, zero_where_masked
from rlconform.harness.core.evaluation import Compared, Evaluation, call_engine, shape_problem
from rlconform.harness.core.failure import problem as problem_clause
from rlconform.harness.core.faithful import compute_dtype
from rlconform.harness.core.garbage import with_masked_column
from rlconform.harness.core.guards import InputGuard
from rlconform.harness.core.mask_layout import apply as apply_layout
from rlconform.harness.core.opinfo import (
    FINITE,
    MASK_INVARIANT,
    MATCHES_REFERENCE,
    NON_DESTRUCTIVE,
    OpInfo,
    reference_function,
    split_regime,
    variant_regime,
    with_variant_implementations,
)
from rlconform.harness.core.tensors import as_numpy, out_dtype, round_to, to_tensor
from rlconform.harness.core.triggers import group_trigger
from rlconform.harness.families import OpFamily

ESTIMATORS = tuple(R.ESTIMATORS)
EPSILON = 1e-6
WHITEN_EPS = 1e-8
DTYPES = ("float32", "float64")
GARBAGE = (np.nan, np.inf, -np.inf, 1e30)
PROPS = (MATCHES_REFERENCE, NON_DESTRUCTIVE, FINITE, MASK_INVARIANT)

#: second implementations of an estimator the catalog knows, checked as ``variant+impl@data``
VARIANT_IMPLEMENTATIONS = {
    "vectorized": "group statistics of every group at once (scatter / bincount over the group index) instead "
                  "of a loop over groups: verl grpo_vectorized, rloo_vectorized",
}

OPS = (
    with_variant_implementations(OpInfo(
        "outcome_advantage", "advantage_estimator", None, PROPS,
        {variant_regime(e, data): DTYPES for e in ESTIMATORS
         for data in ("uneven_groups", "singleton_groups", "near_constant")},
        reference_function("outcome_advantage"),
        source="outcome-reward advantage estimators (verl core_algos.register_adv_est, SkyRL "
               "AdvantageEstimatorRegistry); formulas and papers in reference.advantage_estimators.ESTIMATOR_DOCS",
        family="advantages", variants=ESTIMATORS), VARIANT_IMPLEMENTATIONS),
    OpInfo("gae", "advantage", 5, PROPS, {"padded": DTYPES}, reference_function("gae"),
           source="GAE (Schulman et al. 2016), whitened (verl compute_gae_advantage_return)", family="advantages"),
    OpInfo("masked_whiten", "advantage", 3, PROPS,
           {"padded": DTYPES, "few_tokens": DTYPES, "offset": DTYPES}, reference_function("masked_whiten"),
           source="verl/SkyRL masked_whiten: (x − μ)·rsqrt(σ² + 1e-8), unbiased σ² over the batch",
           family="advantages"),
)


# ------------------------------------------------------------------------------------- branches
def _scores(x) -> np.ndarray:
    """s_i [B]: the row's unmasked reward sum (gdpo: of its first reward component)."""
    r = x["reward_components"][0] if "reward_components" in x else x["token_level_rewards"]
    return np.where(x["response_mask"], r, 0.0).sum(-1)


def _group_stats(x):
    """Per row [B]: its group's size, whether the group's scores are all equal, whether the row holds the
    group's strict maximum, whether the group's maximum is tied."""
    idx, s = np.asarray(x["index"]), _scores(x)
    size, const, top, tied = (np.zeros(idx.size, int), np.zeros(idx.size, bool), np.zeros(idx.size, bool),
                              np.zeros(idx.size, bool))
    for g in np.unique(idx):
        rows = np.flatnonzero(idx == g)
        sg = s[rows]
        size[rows] = rows.size
        const[rows] = np.all(sg == sg[0])
        n_max = int((sg == sg.max()).sum())
        tied[rows] = n_max > 1
        if n_max == 1:
            top[rows[np.argmax(sg)]] = True
    return size, const, top, tied


_GROUP = (
    Branch("singleton group (advantage 0)", lambda x: _group_stats(x)[0] == 1),
    Branch("constant group of ≥ 2 rows (advantage 0)", lambda x: (_group_stats(x)[0] > 1) & _group_stats(x)[1]),
    Branch("group of ≥ 2 rows with spread", lambda x: (_group_stats(x)[0] > 1) & ~_group_stats(x)[1]),
    Branch("row with no valid token", lambda x: ~np.asarray(x["response_mask"]).any(-1)),
)
_ROWS = (Branch("row with no valid token", lambda x: ~np.asarray(x["response_mask"]).any(-1)),
         Branch("row with valid tokens", lambda x: np.asarray(x["response_mask"]).any(-1)))
#: estimator -> the branches of its definition (reference.advantage_estimators S3 and the estimator's own
#: ``where``s), per row [B]: the CI profile's examples take each one
BRANCHES = {e: _ROWS if e in ("remax", "reinforce_plus_plus") else _GROUP for e in ESTIMATORS}
BRANCHES["grpo_passk"] = _GROUP + (
    Branch("strict group maximum (gets r_max − r_second)", lambda x: (_group_stats(x)[0] > 1) & _group_stats(x)[2]),
    Branch("group maximum tied (every row 0)", lambda x: (_group_stats(x)[0] > 1) & _group_stats(x)[3]),
)


# ------------------------------------------------------------------------------------- strategies
def last_valid(mask: np.ndarray) -> np.ndarray:
    """[B] int: each row's last valid position (0 for a row with none): where an outcome reward sits. With
    interior observation spans it is not ``mask.sum(-1) − 1``."""
    t = mask.shape[1]
    return np.where(mask.any(-1), t - 1 - np.argmax(mask[:, ::-1], axis=1), 0)


@st.composite
def _groups(draw, rng, max_groups: int = 4, max_size: int = 5, singleton: bool = False):
    """Group ids of uneven groups (sizes 2..max_size; with ``singleton``, at least one group of one row)."""
    n_groups = draw(st.integers(1, max_groups))
    sizes = draw(st.lists(st.integers(2, max_size), min_size=n_groups, max_size=n_groups))
    if singleton:
        sizes[draw(st.integers(0, n_groups - 1))] = 1
    index = np.repeat(np.arange(n_groups), sizes)
    if draw(st.booleans()):
        rng.shuffle(index)
    return index.astype(np.int64)


@st.composite
def outcome_inputs(draw, dtype: str, estimator: str, data: str):
    """``{"token_level_rewards", "response_mask", "index", "garbage", [extras]}`` (see the module docstring)."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    index = draw(_groups(rng, singleton=data == "singleton_groups"))
    b = index.size
    t = draw(st.sampled_from([1, 3, 8, 32]))
    lengths = rng.integers(0, t + 1, size=b)
    if draw(st.booleans()):
        lengths[rng.integers(0, b)] = 0
    if draw(st.booleans()):
        lengths = np.maximum(lengths, 1)
    mask = S.loss_masks(draw, rng, b, t, lengths)  # right padding or multi-turn rows
    lengths, last = mask.sum(-1), last_valid(mask)
    rewards = np.zeros((b, t))
    if data in ("uneven_groups", "singleton_groups"):
        scores = rng.choice([0.0, 1.0, -1.0, 0.5, 0.95], size=b)
        if draw(st.booleans()):
            scores = scores + rng.standard_normal(b) * draw(st.sampled_from([1e-3, 0.1, 1.0]))
    else:  # near_constant: equal rewards per group, or 1e-7-relative differences around a base
        base = draw(st.sampled_from([0.95, 1.0, -0.5, 3.0]))
        spread = draw(st.sampled_from([0.0, 1e-7, 1e-6]))
        scores = base * (1 + spread * rng.integers(-2, 3, size=b))
        if draw(st.booleans()):  # “one-pass variance E[x²] − μ²”: [0, 0.95 × 7]
            scores[index == index[0]] = 0.95
            scores[0] = 0.0
    rewards[np.arange(b), last] = np.where(lengths > 0, scores, 0.0)
    out = {"token_level_rewards": S.round_to(rewards, dtype), "response_mask": mask, "index": index,
           "garbage": draw(st.sampled_from(GARBAGE))}
    if estimator == "remax":
        out["reward_baselines"] = S.round_to(rng.choice([0.0, 0.5, 1.0], size=b) + rng.standard_normal(b) * 0.1,
                                             dtype)
    if estimator == "gdpo":
        k = draw(st.integers(1, 3))
        comps = np.zeros((k, b, t))
        comps[:, np.arange(b), last] = rng.choice([0.0, 1.0, 0.5], size=(k, b)) * (lengths > 0)
        out["reward_components"] = S.round_to(comps, dtype)
    return out


@st.composite
def gae_inputs(draw, dtype: str):
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    b, t = draw(st.integers(1, 6)), draw(st.sampled_from([1, 4, 16, 64]))
    lengths = rng.integers(0, t + 1, size=b)
    mask = S.loss_masks(draw, rng, b, t, lengths)  # right padding or multi-turn rows
    rewards = np.zeros((b, t))
    rewards[np.arange(b), last_valid(mask)] = rng.choice([0.0, 1.0, -1.0], size=b) * mask.any(-1)
    if draw(st.booleans()):
        rewards += rng.standard_normal((b, t)) * 0.01
    values = rng.standard_normal((b, t)) * draw(st.sampled_from([0.1, 1.0]))
    gamma, lam = draw(st.sampled_from([(1.0, 1.0), (0.99, 0.95), (1.0, 0.9)]))
    return {"token_level_rewards": S.round_to(rewards, dtype), "values": S.round_to(values, dtype),
            "response_mask": mask, "gamma": gamma, "lam": lam, "garbage": draw(st.sampled_from(GARBAGE))}


@st.composite
def whiten_inputs(draw, dtype: str, regime: str):
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    b, t = draw(st.integers(1, 6)), draw(st.sampled_from([1, 4, 16, 64]))
    if regime == "few_tokens":  # 0 or 1 valid tokens in the whole batch
        mask = np.zeros((b, t), bool)
        if draw(st.booleans()):
            mask[rng.integers(0, b), rng.integers(0, t)] = True
    else:
        mask = draw(S.masks((b, t), draw(st.sampled_from(["padded", "multi_turn"])), rng))
    offset = 1e4 if regime == "offset" else 0.0
    values = offset + rng.standard_normal((b, t)) * draw(st.sampled_from([1e-3, 1.0, 30.0]))
    return {"values": S.round_to(values, dtype), "mask": mask, "shift_mean": draw(st.booleans()),
            "garbage": draw(st.sampled_from(GARBAGE))}


def strategy(op: OpInfo, dtype: str, regime: str):
    if op.name == "outcome_advantage":
        estimator, data = split_regime(regime)
        return outcome_inputs(dtype, estimator, data)
    if op.name == "gae":
        return gae_inputs(dtype)
    return whiten_inputs(dtype, regime)


# ------------------------------------------------------------------------------------ faithful path
def _zero(x):
    return torch.zeros((), dtype=x.dtype)


def faithful_masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """fp32 (fp64 stays) two-pass whitening over the unmasked entries; masked outputs 0; nnz ≤ 1 as the
    reference defines it (σ² := 0)."""
    cd = compute_dtype(values.dtype)
    keep = mask != 0
    x = torch.where(keep, values.to(cd), torch.zeros((), dtype=cd))
    n = keep.sum()
    if int(n) == 0:
        return torch.zeros_like(x).to(values.dtype)
    mean = x.sum() / n
    dev = torch.where(keep, x - mean, torch.zeros((), dtype=cd))
    var = (dev * dev).sum() / (n - 1) if int(n) > 1 else torch.zeros((), dtype=cd)
    out = dev * torch.rsqrt(var + WHITEN_EPS)
    if not shift_mean:
        out = out + mean
    return torch.where(keep, out, torch.zeros((), dtype=cd)).to(values.dtype)


def _suffix(x: torch.Tensor, keep: torch.Tensor, c: float) -> torch.Tensor:
    """y_t = x_t + c·y_{t'} over unmasked positions (t' the next unmasked one); masked outputs 0."""
    y = torch.zeros(x.shape[0], dtype=x.dtype)
    out = torch.zeros_like(x)
    for t in range(x.shape[1] - 1, -1, -1):
        y = torch.where(keep[:, t], x[:, t] + c * y, y)
        out[:, t] = torch.where(keep[:, t], y, _zero(x))
    return out


def _group_rows(index) -> list:
    groups: dict = {}
    for i, g in enumerate(np.asarray(index).reshape(-1).tolist()):
        groups.setdefault(g, []).append(i)
    return [torch.tensor(rows) for rows in groups.values()]


def _grpo(s: torch.Tensor, rows: torch.Tensor, norm: bool) -> torch.Tensor:
    g = s[rows]
    if g.numel() == 1:
        return torch.zeros_like(g)
    dev = g - g.mean()
    if not norm:
        return dev
    std = torch.sqrt((dev * dev).sum() / (g.numel() - 1))
    return dev / (std + EPSILON)


def faithful_outcome_advantage(estimator: str, rewards: torch.Tensor, mask: torch.Tensor, index,
                               reward_baselines=None, reward_components=None, singleton: str = "zero"):
    """The estimator in fp32 (fp64 stays) with two-pass group statistics: (advantages, returns) in the
    rewards' dtype, masked outputs 0 (formulas: reference.advantage_estimators.ESTIMATOR_DOCS;
    ``singleton="raw"``: a group of one row has μ := 0, σ := 1, the reference's S3)."""
    raw = singleton == "raw"
    cd = compute_dtype(rewards.dtype)
    keep = mask != 0
    r = torch.where(keep, rewards.to(cd), torch.zeros((), dtype=cd))
    lengths = keep.sum(-1)
    b = r.shape[0]
    if estimator == "remax":
        ret = _suffix(r, keep, 1.0)
        adv = torch.where(keep, ret - reward_baselines.to(cd)[:, None], torch.zeros((), dtype=cd))
        return adv.to(rewards.dtype), ret.to(rewards.dtype)
    if estimator == "reinforce_plus_plus":
        ret = _suffix(r, keep, 1.0)
        return faithful_masked_whiten(ret, keep).to(rewards.dtype), ret.to(rewards.dtype)
    s = r.sum(-1)
    groups = _group_rows(index)
    a = torch.zeros(b, dtype=cd)
    if estimator == "gdpo":
        comps = reward_components if reward_components is not None else r[None]
        for comp in comps:
            sk = torch.where(keep, comp.to(cd), torch.zeros((), dtype=cd)).sum(-1)
            for rows in groups:
                a[rows] += (sk[rows] / (1 + EPSILON)) if raw and len(rows) == 1 else _grpo(sk, rows, True)
    for rows in groups:
        g = s[rows]
        n = g.numel()
        if estimator == "gdpo":
            break
        if n == 1:
            if raw and estimator != "grpo_passk":
                alpha = b / max(int(torch.count_nonzero(s)), 1) if estimator == "gpg" else 1.0
                a[rows] = g / (1 + EPSILON) if estimator == "grpo" else alpha * g
            continue
        mu = g.mean()
        dev = g - mu
        if estimator in ("grpo", "drgrpo"):
            a[rows] = _grpo(s, rows, estimator == "grpo")
        elif estimator == "rloo":
            a[rows] = dev * n / (n - 1)
        elif estimator == "opo":
            w = lengths[rows].to(cd)
            a[rows] = g - ((w * g).sum() / w.sum() if float(w.sum()) else torch.zeros((), dtype=cd))
        elif estimator == "gpg":
            alpha = b / max(int(torch.count_nonzero(s)), 1)
            a[rows] = alpha * dev
        elif estimator == "maxrl":
            a[rows] = torch.where(dev == 0, torch.zeros((), dtype=cd), dev / (mu + EPSILON))
        elif estimator == "grpo_passk":
            top = torch.sort(g, descending=True).values
            if top[0] > top[1]:
                std = torch.sqrt((dev * dev).sum() / (n - 1))
                out = torch.zeros_like(g)
                out[int(torch.argmax(g))] = (top[0] - top[1]) / (std + EPSILON)
                a[rows] = out
        elif estimator == "reinforce_plus_plus_baseline":
            a[rows] = dev
        else:
            raise ValueError(f"unknown estimator {estimator!r}")
    adv = torch.where(keep, a[:, None].expand_as(r), torch.zeros((), dtype=cd))
    if estimator in ("reinforce_plus_plus_baseline", "gdpo"):
        adv = faithful_masked_whiten(adv, keep).to(cd)
    return adv.to(rewards.dtype), adv.to(rewards.dtype)


def faithful_gae(rewards, values, mask, gamma: float, lam: float):
    """GAE over unmasked positions in fp32 (fp64 stays), whitened: (advantages, returns)."""
    cd = compute_dtype(rewards.dtype)
    keep = mask != 0
    r = torch.where(keep, rewards.to(cd), torch.zeros((), dtype=cd))
    v = torch.where(keep, values.to(cd), torch.zeros((), dtype=cd))
    b, t = r.shape
    a_next = torch.zeros(b, dtype=cd)
    v_next = torch.zeros(b, dtype=cd)
    adv = torch.zeros_like(r)
    for i in range(t - 1, -1, -1):
        delta = r[:, i] + gamma * v_next - v[:, i]
        a_new = delta + gamma * lam * a_next
        a_next = torch.where(keep[:, i], a_new, a_next)
        v_next = torch.where(keep[:, i], v[:, i], v_next)
        adv[:, i] = torch.where(keep[:, i], a_next, torch.zeros((), dtype=cd))
    ret = torch.where(keep, adv + v, torch.zeros((), dtype=cd))
    return faithful_masked_whiten(adv, keep).to(rewards.dtype), ret.to(rewards.dtype)


# --------------------------------------------------------------------------------------- evaluate
_TOKEN_INPUTS = {"outcome_advantage": ("token_level_rewards",), "gae": ("token_level_rewards", "values"),
                 "masked_whiten": ("values",)}
_MASK = {"outcome_advantage": "response_mask", "gae": "response_mask", "masked_whiten": "mask"}
#: inputs besides the token inputs with a time dim (padded with the mask by mask_invariant)
_TIME_EXTRAS = ("reward_components",)


def _impl(binding, case):
    impl = binding.resolve(case.op)
    if case.op == "outcome_advantage":
        estimator, _ = split_regime(case.regime)
        return impl.get(case.op, estimator, binding.name), estimator
    return impl, None


def _call(case, fn, estimator, arrs: dict, dtype: str, *, guard=False):
    """Call the engine on tensors made from ``arrs``; returns (outputs tuple, tensors given)."""
    mask = torch.from_numpy(arrs[_MASK[case.op]].astype(bool))
    t = {k: to_tensor(arrs[k], dtype) for k in _TOKEN_INPUTS[case.op]}
    if case.op == "outcome_advantage":
        extras = {k: to_tensor(arrs[k], dtype) for k in ("reward_baselines", "reward_components") if k in arrs}
        given = dict(t, response_mask=mask, **extras)
        out = call_engine(f"outcome_advantage[{estimator}]", fn, t["token_level_rewards"], mask,
                          np.asarray(arrs["index"]), **extras)
    elif case.op == "gae":
        given = dict(t, response_mask=mask)
        out = call_engine("gae", fn, t["token_level_rewards"], t["values"], mask, arrs["gamma"], arrs["lam"])
    else:
        given = dict(t, mask=mask)
        out = call_engine("masked_whiten", fn, t["values"], mask, bool(arrs["shift_mean"]))
        out = (out,)
    return out, given


def _reference(case, estimator, arrs, conventions=()):
    mask = arrs[_MASK[case.op]].astype(bool)
    if case.op == "outcome_advantage":
        extras = {k: arrs[k] for k in ("reward_baselines", "reward_components") if k in arrs}
        return R.outcome_advantage(arrs["token_level_rewards"], mask, arrs["index"], estimator=estimator,
                                   epsilon=EPSILON, norm_adv_by_std=estimator != "drgrpo", **extras,
                                   **followed(conventions, case.op, case.regime))
    if case.op == "gae":
        return R.gae(arrs["token_level_rewards"], arrs["values"], mask, arrs["gamma"], arrs["lam"])
    return (R.masked_whiten(arrs["values"], mask, bool(arrs["shift_mean"])),)


def _faithful(case, estimator, arrs, dtype, conventions=()):
    mask = torch.from_numpy(arrs[_MASK[case.op]].astype(bool))
    clean = {k: to_tensor(np.where(arrs[_MASK[case.op]], arrs[k], 0.0), dtype) for k in _TOKEN_INPUTS[case.op]}
    if case.op == "outcome_advantage":
        extras = {k: to_tensor(arrs[k], dtype) for k in ("reward_baselines", "reward_components") if k in arrs}
        return faithful_outcome_advantage(estimator, clean["token_level_rewards"], mask, arrs["index"], **extras,
                                          **followed(conventions, case.op, case.regime))
    if case.op == "gae":
        return faithful_gae(clean["token_level_rewards"], clean["values"], mask, arrs["gamma"], arrs["lam"])
    return (faithful_masked_whiten(clean["values"], mask, bool(arrs["shift_mean"])),)


_LABELS = {"outcome_advantage": ("advantages", "returns"), "gae": ("advantages", "returns"),
           "masked_whiten": ("whitened",)}


def _compare(case, outs, refs, fas, mask, dtype, suffix, ev) -> list[Compared]:
    compared = []
    if len(outs) != len(refs):
        ev.problems.append(problem_clause("missing output", f"the engine returned {len(outs)} output(s), expected "
                                                            f"{len(refs)} ({', '.join(_LABELS[case.op])})"))
        return compared
    for label, got, ref, fa in zip(_LABELS[case.op], outs, refs, fas):
        problem = shape_problem(label + suffix, as_numpy(got), np.shape(ref))
        if problem:
            ev.problems.append(problem)
            continue
        odt = out_dtype(got, dtype)
        compared.append(Compared(label + suffix, as_numpy(got), np.asarray(ref, np.float64),
                                 as_numpy(round_to(fa, odt)), odt, "advantage", only_where=mask))
    return compared


def evaluate(binding, case) -> Evaluation:
    fn, estimator = _impl(binding, case)
    arrs = dict(case.inputs)
    mname = _MASK[case.op]
    arrs[mname] = np.asarray(arrs[mname]).astype(bool)
    if case.property == MASK_INVARIANT:  # garbage needs a masked position: a padding column, not a valid one
        arrs = with_masked_column(arrs, mname, _TOKEN_INPUTS[case.op] + _TIME_EXTRAS)
    # the layout the engine's callers give the mask (SkyRL right-aligns it), each row's data moved with it
    layout, layout_name = mask_layout(getattr(binding, "declared", ()), case.op, case.regime)
    arrs = apply_layout(layout, arrs, mname, _TOKEN_INPUTS[case.op] + _TIME_EXTRAS)
    mask = arrs[mname]
    ev = Evaluation()
    ev.declared = layout_name or None
    if case.property == NON_DESTRUCTIVE:
        tensors = {k: to_tensor(arrs[k], case.dtype) for k in _TOKEN_INPUTS[case.op]}
        tensors[mname] = torch.from_numpy(mask)
        guard = InputGuard(**tensors)
        mask_t = tensors.pop(mname)
        if case.op == "outcome_advantage":
            extras = {k: to_tensor(arrs[k], case.dtype) for k in ("reward_baselines", "reward_components") if k in arrs}
            call_engine(f"outcome_advantage[{estimator}]", fn, tensors["token_level_rewards"], mask_t,
                        np.asarray(arrs["index"]), **extras)
        elif case.op == "gae":
            call_engine("gae", fn, tensors["token_level_rewards"], tensors["values"], mask_t, arrs["gamma"],
                        arrs["lam"])
        else:
            call_engine("masked_whiten", fn, tensors["values"], mask_t, bool(arrs["shift_mean"]))
        ev.mutations += [m.clause() for m in guard.check("forward")]
        return ev
    declared = getattr(binding, "declared", ())
    refs = _reference(case, estimator, arrs, declared)  # a declared convention (verl's singleton) is followed
    fas = _faithful(case, estimator, arrs, case.dtype, declared)
    if followed(declared, case.op, case.regime):
        ev.declared = ev.declared or next(d.name for d in declared if d.kind == "convention" and d.reference
                                          and d.concerns(case.op, (estimator or "").split("+", 1)[0]))
    outs, _ = _call(case, fn, estimator, arrs, case.dtype)
    outs = tuple(outs) if isinstance(outs, (tuple, list)) else (outs,)
    ev.values = _compare(case, outs, refs, fas, mask, case.dtype, "", ev)
    if case.property == MASK_INVARIANT:
        garbage = float(case.inputs.get("garbage", np.nan))
        clean, kept = zero_where_masked(getattr(binding, "declared", ()), case.op, case.regime)
        dirty_keys = [k for k in _TOKEN_INPUTS[case.op] if k not in clean]
        if kept is not None:
            ev.declared = kept.name
        if not dirty_keys:
            ev.undefined = (f"declared precondition {kept.name}: {kept.what}; no other input holds masked "
                            "positions to write garbage into")
            return ev
        dirty = dict(arrs)
        for k in dirty_keys:
            dirty[k] = np.where(mask, arrs[k], garbage)
        outs, _ = _call(case, fn, estimator, dirty, case.dtype)
        outs = tuple(outs) if isinstance(outs, (tuple, list)) else (outs,)
        ev.alternatives.append((f"masked positions set to {garbage!r}",
                                _compare(case, outs, refs, fas, mask, case.dtype, f" (masked = {garbage!r})", ev)))
    return ev


def trigger(case, clauses=(), kind: str = "") -> str | None:
    """The trigger of a failing outcome-advantage case (:mod:`rlconform.harness.core.triggers`): ``a group of
    one sample``, ``a group with equal scores`` (σ = 0: the GRPO normalisation's 0/0 + ε), else None (the
    generic reading: a row with no valid token, …). GAE and whitening: always None."""
    inputs = case.inputs if isinstance(case.inputs, dict) else {}
    if case.property in ("mask_invariant", "partition_invariant") or kind in ("inexact value", "mutation"):
        return None
    index, rewards = inputs.get("index"), inputs.get("token_level_rewards")
    if index is None or rewards is None:
        return None
    one = group_trigger(index)
    if one:
        return one
    ids = np.asarray(index).astype(str).ravel()
    scores = np.asarray(rewards, dtype=np.float64).reshape(len(ids), -1).sum(axis=1)
    if any(np.ptp(scores[ids == g]) == 0 for g in np.unique(ids)):
        return "a group with equal scores"
    return None


FAMILY = OpFamily("advantages", OPS, strategy, evaluate, order=55, trigger=trigger,
                  doc="outcome-reward advantage estimators (a variant each), GAE and masked whitening")
