"""Optimal token baseline advantages (verl PR #6153 / ``compute_optimal_token_baseline_advantage``).

Canonical signature: ``optimal_token_baseline(rewards [B, T], mask [B, T], index [B], old_log_probs [B, T],
sum_pi_squared [B, T]) -> (advantages [B, T], returns [B, T])``. w_t = 1 − 2π_t + Σπ², cumulative
weights, a per-group weighted baseline; groups of size 1, fully masked rows and near-zero weights.
"""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import strategies as st

import rlconform.reference as R
from rlconform.harness.core import faithful as F
from rlconform.harness.core import strategies as S
from rlconform.harness.core.declared import zero_where_masked
from rlconform.harness.core.evaluation import Compared, Evaluation, call_engine, shape_problem
from rlconform.harness.core.garbage import with_masked_column
from rlconform.harness.core.guards import InputGuard
from rlconform.harness.core.opinfo import (
    FINITE,
    MASK_INVARIANT,
    MATCHES_REFERENCE,
    NON_DESTRUCTIVE,
    OpInfo,
    reference_function,
)
from rlconform.harness.core.tensors import TORCH_DTYPES, as_numpy, to_tensor
from rlconform.harness.families import OpFamily

NAMES = ("rewards", "mask", "old_log_probs", "sum_pi_squared")
GARBAGE = (np.nan, np.inf, -np.inf, 1e30)

OPS = (
    OpInfo("optimal_token_baseline", "advantage", 5, (MATCHES_REFERENCE, NON_DESTRUCTIVE, FINITE, MASK_INVARIANT),
           {"groups": ("float32", "float64")}, reference_function("optimal_token_baseline"),
           source="verl PR #6153 / compute_optimal_token_baseline_advantage", family="optimal_token_baseline"),
)


#: the dtypes a case of this op is drawn in, as NumPy types (for the ulp steps of :func:`consistent_spp`)
_NP = {"float32": np.float32, "float64": np.float64}


def token_distributions(rng, shape, near_one: bool, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """(log π_t, Σπ²) in ``dtype`` of real distributions, one per position of ``shape``: π_t the probability
    of the sampled token, Σπ² the sum of squares of the whole distribution, so that
    w_t = 1 − 2π_t + Σπ² = (1 − π_t)² + Σ_{j≠t} π_j² ≥ 0 (kept after rounding by :func:`consistent_spp`).

    Otherwise a Dirichlet distribution over 2..8 tokens. ``near_one``: near-zero weights; Σπ² = 1 − δ
    (δ ∈ [1e-6, 1e-4], rounded to ``dtype``) is drawn first and π_t inside the interval a distribution with
    that Σπ² allows, π_t ∈ [(1 + √(2Σπ² − 1)) / 2, √Σπ²] (the rest of the mass on one token, on
    infinitely many): π_t ≈ 1 − δ/2, w_t between δ²/4 and δ²/2."""
    if near_one:
        spp = S.round_to(1.0 - rng.uniform(1e-6, 1e-4, shape), dtype)
        lo, hi = (1.0 + np.sqrt(2.0 * spp - 1.0)) / 2.0, np.sqrt(spp)
        pi = lo + rng.uniform(0, 1, shape) * (hi - lo)
        return consistent_spp(S.round_to(np.log(pi), dtype), spp, dtype)
    v = int(rng.integers(2, 9))
    p = rng.dirichlet(np.full(v, float(rng.choice([0.3, 1.0, 3.0]))), size=shape)
    p = np.maximum(p, 1e-12)
    p /= p.sum(axis=-1, keepdims=True)
    pick = rng.integers(0, v, size=shape)
    pi = np.take_along_axis(p, pick[..., None], axis=-1)[..., 0]
    return consistent_spp(S.round_to(np.log(pi), dtype), S.round_to(np.sum(p**2, axis=-1), dtype), dtype)


def consistent_spp(log_pi: np.ndarray, spp: np.ndarray, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """``(old_log_probs, sum_pi_squared)`` in ``dtype`` that some distribution has, given both already
    rounded to ``dtype``: with π = exp(old_log_probs) as the engine and the reference read it, Σπ² must lie in
    [π², π² + (1 − π)²] (the rest of the mass 1 − π on one token at most, on infinitely many at least).
    A Σπ² the rounding put outside is moved into the interval by ulps of ``dtype``; where the interval holds
    no value of ``dtype`` (π within an ulp of 1), the position becomes the one-hot distribution (log π = 0,
    Σπ² = 1, w = 0)."""
    lp, out = log_pi.copy(), spp.copy()
    pi = np.exp(lp)
    lo, hi = pi**2, pi**2 + (1.0 - pi) ** 2
    np_t = _NP[dtype]
    for idx in zip(*np.nonzero((out < lo) | (out > hi))):
        x = np_t(out[idx])
        for _ in range(4):
            x = np.nextafter(x, np_t(np.inf) if out[idx] < lo[idx] else np_t(-np.inf))
            if lo[idx] <= float(x) <= hi[idx]:
                break
        if lo[idx] <= float(x) <= hi[idx]:
            out[idx] = float(x)
        else:
            lp[idx], out[idx] = 0.0, 1.0
    return lp, out


@st.composite
def inputs(draw, dtype: str):
    """Groups of size 1..4 (shuffled index), fully masked rows; π_t and Σπ² of real distributions
    (:func:`token_distributions`), half the time with π_t near 1 (near-zero weights w_t = 1 − 2π_t + Σπ²)."""
    n_groups = draw(st.integers(1, 4))
    sizes = draw(st.lists(st.integers(1, 4), min_size=n_groups, max_size=n_groups))
    b = sum(sizes)
    t = draw(st.sampled_from([1, 3, 8, 64]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    index = np.repeat(np.arange(n_groups), sizes)
    rng.shuffle(index)
    lengths = rng.integers(0, t + 1, size=b)
    if draw(st.booleans()):
        lengths[rng.integers(0, b)] = 0
    mask = np.arange(t)[None, :] < lengths[:, None]
    # the score on the last valid token of a zero tensor, as reward managers write it (never at a masked
    # position: engines declare it, e.g. verl's rewards_zero_outside_mask)
    rewards = np.zeros((b, t))
    last = np.maximum(lengths - 1, 0)
    rewards[np.arange(b), last] = rng.choice([0.0, 1.0, -1.0, 0.5], size=b) * (lengths > 0)
    if draw(st.booleans()):
        rewards += rng.standard_normal((b, t)) * 0.1 * mask
    lp, spp = token_distributions(rng, (b, t), draw(st.booleans()), dtype)
    return {
        "rewards": S.round_to(rewards, dtype), "mask": mask, "index": index.astype(np.int64),
        "old_log_probs": lp, "sum_pi_squared": spp,
        "garbage": draw(st.sampled_from(GARBAGE)),
    }


def strategy(op: OpInfo, dtype: str, regime: str):
    return inputs(dtype)


def _tensors(arrs: dict, dtype: str) -> dict:
    t = {k: to_tensor(arrs[k], dtype) for k in NAMES}
    t["mask"] = torch.from_numpy(arrs["mask"].astype(bool)).to(TORCH_DTYPES[dtype])
    return t


def _args(t: dict, index) -> tuple:
    return (t["rewards"], t["mask"], index, t["old_log_probs"], t["sum_pi_squared"])


def _run(fn, arrs, index, dtype, refs, label, ev) -> list[Compared]:
    t = _tensors(arrs, dtype)
    adv, ret = call_engine("optimal_token_baseline", fn, *_args(t, index))
    clean = dict(arrs)
    for k in ("rewards", "old_log_probs", "sum_pi_squared"):
        clean[k] = np.where(arrs["mask"], arrs[k], 0.0)
    f_adv, f_ret = F.optimal_token_baseline(*_args(_tensors(clean, dtype), index))
    out = []
    for name, got, ref, fa in (("advantages", adv, refs[0], f_adv), ("returns", ret, refs[1], f_ret)):
        problem = shape_problem(f"{name}{label}", as_numpy(got), np.shape(ref))
        if problem:
            ev.problems.append(problem)
            continue
        out.append(Compared(f"{name}{label}", as_numpy(got), ref, as_numpy(fa), dtype, "advantage",
                            only_where=arrs["mask"].astype(bool)))
    return out


def evaluate(binding, case) -> Evaluation:
    fn = binding.resolve(case.op)
    arrs = {k: case.inputs[k] for k in NAMES}
    arrs["mask"] = arrs["mask"].astype(bool)
    if case.property == MASK_INVARIANT:  # garbage needs a masked position: a padding column, not a valid one
        arrs = with_masked_column(arrs, "mask", ("rewards", "old_log_probs", "sum_pi_squared"),
                                  fill={"sum_pi_squared": 1.0})  # a one-hot distribution: log π = 0, Σπ² = 1
    # an example must be one the engine's callers can pass: an input a declared precondition keeps zero where
    # masked (verl's rewards: the reward manager writes into a zero tensor) is zero there, and holds no garbage
    clean, kept = zero_where_masked(getattr(binding, "declared", ()), case.op, case.regime)
    clean &= {"rewards", "old_log_probs", "sum_pi_squared"}
    for k in clean:
        arrs[k] = np.where(arrs["mask"], arrs[k], 0.0)
    index = np.asarray(case.inputs["index"])
    ev = Evaluation()
    if kept is not None:
        ev.declared = kept.name
    if case.property == NON_DESTRUCTIVE:
        t = _tensors(arrs, case.dtype)
        guard = InputGuard(**t)
        call_engine(case.op, fn, *_args(t, index))
        ev.mutations += [m.clause() for m in guard.check("forward")]
        return ev
    refs = R.optimal_token_baseline(arrs["rewards"], arrs["mask"], index, arrs["old_log_probs"],
                                    arrs["sum_pi_squared"])
    ev.values = _run(fn, arrs, index, case.dtype, refs, "", ev)
    if case.property == MASK_INVARIANT:
        garbage = float(case.inputs.get("garbage", np.nan))
        dirty = dict(arrs)
        keys = [k for k in ("rewards", "old_log_probs", "sum_pi_squared") if k not in clean]
        for k in keys:
            dirty[k] = np.where(arrs["mask"], arrs[k], garbage)
        ev.alternatives.append((f"masked positions set to {garbage!r}",
                                _run(fn, dirty, index, case.dtype, refs, f" (masked = {garbage!r})", ev)))
    return ev


FAMILY = OpFamily("optimal_token_baseline", OPS, strategy, evaluate, order=50,
                  doc="optimal token baseline advantages (verl PR #6153)")
