"""Per-token KL estimators ``kl_estimator`` (k1, abs, k2, k3 with the engines' clamps, straight-through
``+`` modes): value and gradient w.r.t. the log-probs.

Canonical form: a :class:`~rlconform.harness.core.contracts.Variants` registry (one callable per estimator
name of :data:`rlconform.reference.KL_ESTIMATORS`) ``(logprob [B, T], ref_logprob [B, T], mask [B, T]
bool) -> [B, T]``; an engine whose estimator takes no mask (verl ``kl_penalty``) ignores it. Only valid
tokens are compared; the gradient is that of Σ_valid kl (the output backpropagated with the mask as
``grad_output``), compared with :func:`rlconform.reference.kl_estimator_grad` (Schulman 2020; verl
0.9.1 ``core_algos.kl_penalty``; SkyRL 0.4.0 ``ppo_utils.compute_approx_kl``).

Regimes ``<mode>@moderate`` (|Δ| ≤ 1; fp32, fp64) and ``<mode>@extreme_log_ratios`` (Δ = ±100 in fp32,
±20 in bf16: k3's clamps decide). ``mask_invariant`` writes NaN, ±inf or 1e30 at masked positions.
Yardstick: the float64 reference rounded to the output dtype (:func:`faithful`).
"""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import strategies as st

import rlconform.reference as R
from rlconform.harness.core import strategies as S
from rlconform.harness.core.branches import Branch, place_in_regions
from rlconform.harness.core.contracts import Variants
from rlconform.harness.core.evaluation import Compared, Evaluation, call_engine, shape_problem
from rlconform.harness.core.failure import problem as problem_clause
from rlconform.harness.core.guards import InputGuard
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
from rlconform.harness.core.tensors import as_numpy, out_dtype, to_tensor
from rlconform.harness.families import OpFamily

MODES = tuple(R.KL_ESTIMATORS)
GARBAGE = (np.nan, np.inf, -np.inf, 1e30)
EXTREME = {"float32": 100.0, "float64": 100.0, "bfloat16": 20.0, "float16": 20.0}
_MODERATE = tuple(variant_regime(v, "moderate") for v in MODES)

OPS = (
    OpInfo("kl_estimator", "kl_estimator", None, (MATCHES_REFERENCE, NON_DESTRUCTIVE, FINITE, MASK_INVARIANT),
           {**{variant_regime(v, "moderate"): ("float32", "float64") for v in MODES},
            **{variant_regime(v, "extreme_log_ratios"): ("float32", "bfloat16") for v in MODES}},
           reference_function("kl_estimator"), reference_function("kl_estimator_grad"), differentiable=True,
           source="Schulman 2020 (joschu.net/blog/kl-approx.html); verl core_algos.kl_penalty; "
                  "SkyRL ppo_utils.compute_approx_kl",
           family="kl_estimator", variants=MODES,
           property_regimes={NON_DESTRUCTIVE: _MODERATE, MASK_INVARIANT: _MODERATE,
                             FINITE: tuple(variant_regime(v, "extreme_log_ratios") for v in MODES)}),
)


#: k3's outer clamp (|k3| ≤ 10) binds for Δ below / above these (reference.kl module doc)
K3_LOW, K3_HIGH = -2.6108686, 10.9999833
#: log-ratio intervals the moderate regime places tokens in: k3 clamped low, interior, clamped high
REGIONS = ((-5.0, K3_LOW - 0.05), (-0.9, 0.9), (K3_HIGH + 0.5, 18.0))
_ANY = (Branch("any valid token", lambda x: np.ones(x["mask"].shape, bool)),)
_SIGN = (Branch("Δ > 0", lambda x: x["logprob"] > x["ref_logprob"]),
         Branch("Δ < 0", lambda x: x["logprob"] < x["ref_logprob"]))
_K3 = (Branch("k3 inside its clamps", lambda x: np.abs(x["logprob"] - x["ref_logprob"] - 4.2) < 6.8),
       Branch("k3 clamped at 10, Δ < −2.61 (gradient 0)", lambda x: x["logprob"] - x["ref_logprob"] < K3_LOW),
       Branch("k3 clamped at 10, Δ > 11.0 (gradient 0)", lambda x: x["logprob"] - x["ref_logprob"] > K3_HIGH))
#: mode -> the branches of its definition (reference.kl): the CI profile's moderate examples take each one
BRANCHES = {m: _K3 if m.rstrip("+") in ("k3", "low_var_kl") else _SIGN if m.rstrip("+") == "abs" else _ANY
            for m in MODES}


@st.composite
def inputs(draw, dtype: str, mode: str, data: str):
    """``{"logprob", "ref_logprob": [B, T] float64 exact in dtype, "mask": [B, T] bool, "garbage", "mode"}``,
    B ≤ 8, T ≤ 64. ``moderate``: |Δ| ≤ 1, and in half the examples tokens placed in :data:`REGIONS` (k3's
    clamps bind at Δ < −2.61 and Δ > 11: ordinary magnitudes)."""
    b = draw(st.integers(1, 8))
    t = draw(st.sampled_from([1, 4, 16, 64]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    lengths = rng.integers(0, t + 1, size=b)
    mask = S.loss_masks(draw, rng, b, t, lengths)  # right padding or multi-turn rows
    ref = np.log(rng.uniform(0.05, 1.0, (b, t)))
    delta = rng.uniform(-1.0, 1.0, (b, t)) * draw(st.sampled_from([1e-3, 0.1, 1.0]))
    if data == "extreme_log_ratios":
        hits = rng.random((b, t)) < draw(st.sampled_from([0.05, 0.3]))
        hits[rng.integers(0, b), rng.integers(0, t)] = True
        delta = np.where(hits, rng.choice([-1.0, 1.0], size=(b, t)) * EXTREME[dtype], delta)
    elif draw(st.booleans()):
        delta, _ = place_in_regions(rng, delta, REGIONS, where=mask)
        ref = np.minimum(ref, -delta - rng.uniform(0.05, 0.5, (b, t)))  # keep logprob ≤ 0
    return {"logprob": S.round_to(ref + delta, dtype), "ref_logprob": S.round_to(ref, dtype), "mask": mask,
            "garbage": draw(st.sampled_from(GARBAGE)), "mode": mode}


def strategy(op: OpInfo, dtype: str, regime: str):
    mode, data = split_regime(regime)
    return inputs(dtype, mode, data)


class _Faithful(torch.autograd.Function):
    """The float64 reference as an autograd op, rounded to the input dtype (masked entries 0)."""

    @staticmethod
    def forward(ctx, logprob, ref_logprob, mask, mode):
        lp, ref = as_numpy(logprob), as_numpy(ref_logprob)
        m = mask.detach().cpu().numpy().astype(bool)
        ctx.grad = torch.from_numpy(R.kl_estimator_grad(lp, ref, mode, mask=m))
        ctx.dtype = logprob.dtype
        return torch.from_numpy(R.kl_estimator(lp, ref, mode, mask=m)).to(logprob.dtype)

    @staticmethod
    def backward(ctx, grad_output):
        return (ctx.grad * grad_output.double()).to(ctx.dtype), None, None, None


def faithful(mode: str):
    """The reference engine's estimator ``mode``: :class:`_Faithful`."""

    def kl(logprob, ref_logprob, mask):
        return _Faithful.apply(logprob, ref_logprob, mask, mode)

    kl.__qualname__ = f"reference.kl_estimator[{mode}]"
    return kl


def reference_variants() -> Variants:
    return Variants({mode: faithful(mode) for mode in MODES})


def _run(fn, lp64, ref64, mask, dtype, label, refs, ev) -> list[Compared]:
    """Call the engine and backpropagate the mask; ``refs`` = (reference value, reference gradient)."""
    lp = to_tensor(lp64, dtype).requires_grad_(True)
    ref = to_tensor(ref64, dtype)
    m = torch.from_numpy(mask.copy())
    out = call_engine("kl_estimator", fn, lp, ref, m)
    problem = shape_problem(f"{label}value", as_numpy(out), mask.shape)
    if problem:
        ev.problems.append(problem)
        return []
    odt = out_dtype(out, dtype)
    mode_ref = refs
    res = [Compared(f"{label}value", as_numpy(out), mode_ref[0], S.round_to(mode_ref[0], odt), odt, "pipeline",
                    only_where=mask, quantity="value")]
    if not isinstance(out, torch.Tensor) or not out.requires_grad:
        ev.problems.append(problem_clause("missing gradient", f"{label}gradient: the estimate has no autograd graph: no gradient reaches logprob"))
        return res
    call_engine("kl_estimator backward", out.backward, m.to(out.dtype))
    if lp.grad is None:
        ev.problems.append(problem_clause("missing gradient", f"{label}gradient: backward ran but no gradient reached logprob"))
        return res
    res.append(Compared(f"{label}gradient w.r.t. logprob", as_numpy(lp.grad), mode_ref[1],
                        S.round_to(mode_ref[1], odt), odt, "pipeline", only_where=mask, quantity="gradient"))
    return res


def evaluate(binding, case) -> Evaluation:
    mode = case.inputs["mode"]
    fn = binding.resolve("kl_estimator").get("kl_estimator", mode, binding.name)
    mask = case.inputs["mask"].astype(bool)
    if case.property == MASK_INVARIANT and mask.all():
        mask = mask.copy()
        mask[-1, -1] = False
    lp64, ref64 = case.inputs["logprob"], case.inputs["ref_logprob"]
    ev = Evaluation()
    if case.property == NON_DESTRUCTIVE:
        lp, ref = to_tensor(lp64, case.dtype).requires_grad_(True), to_tensor(ref64, case.dtype)
        m = torch.from_numpy(mask.copy())
        guard = InputGuard(logprob=lp, ref_logprob=ref, mask=m)
        out = call_engine("kl_estimator", fn, lp, ref, m)
        ev.mutations += [x.clause() for x in guard.check("forward")]
        if isinstance(out, torch.Tensor) and out.requires_grad:
            call_engine("kl_estimator backward", out.backward, m.to(out.dtype))
            ev.mutations += [x.clause() for x in guard.check("backward")]
        return ev
    if not mask.any():
        ev.undefined = "no valid token: nothing is defined"
        return ev
    refs = (R.kl_estimator(lp64, ref64, mode, mask=mask), R.kl_estimator_grad(lp64, ref64, mode, mask=mask))
    split = _run(fn, lp64, ref64, mask, case.dtype, "", refs, ev)
    ev.values = [c for c in split if c.quantity != "gradient"]
    ev.gradients = [c for c in split if c.quantity == "gradient"]
    if case.property == MASK_INVARIANT:
        garbage = float(case.inputs.get("garbage", np.nan))
        alt = _run(fn, np.where(mask, lp64, garbage), np.where(mask, ref64, garbage), mask, case.dtype,
                   f"masked = {garbage!r}: ", refs, ev)
        ev.alternatives.append((f"masked positions set to {garbage!r}", alt))
    return ev


FAMILY = OpFamily("kl_estimator", OPS, strategy, evaluate, order=55,
                  doc="per-token KL estimators k1/abs/k2/k3 and straight-through modes: value and gradient")
