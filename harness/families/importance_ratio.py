"""Importance ratios ``importance_ratio``: token-level, sequence-level (product / GSPO geometric mean),
truncated (TIS) or not, with the engines' ±20 log-ratio clamp; value and gradient w.r.t. the log-probs.

Canonical form: a :class:`~rlconform.harness.core.contracts.Variants` registry, one callable per catalog
variant ``(log_prob [B, T], old_log_prob [B, T], mask [B, T] bool) -> ratio [B, T]`` (the sequence
levels broadcast the row's value over its tokens). ``log_prob`` is the numerator policy (verl's
rollout correction: the training policy's ``old_log_prob``; SkyRL's TIS: ``old_log_probs``),
``old_log_prob`` the denominator (the rollout policy's log-probs). Only valid tokens are compared.
The gradient is that of Σ_valid ratio (the output backpropagated with the mask as ``grad_output``),
compared with :func:`rlconform.reference.importance_ratio_grad`; engines that detach their IS weights
by design (verl ``rollout_corr_helper.compute_rollout_correction_weights``: ``rollout_is_weights.detach()``,
"mathematically required by IS theory"; SkyRL ``compute_tis_ratio``) bind the op ``detached``: a gradient that reaches log_prob non-zero fails, no gradient or a zero one passes.

==========================  ================================  =============================================
variant                     reference kwargs                  engines
==========================  ================================  =============================================
``token``                   level token, clamp ±20            the PPO ratio inside the engines' losses
``token_tis``               token, clamp ±20, cap 2.0         verl rollout_is="token" (threshold 2.0);
                                                              SkyRL tis_ratio_type="token" (clip_high 2.0)
``sequence_product``        sequence_product, clamp ±20       (verl/SkyRL only expose it truncated)
``sequence_tis``            sequence_product, clamp ±20,      verl rollout_is="sequence" (threshold 5.0);
                            cap 5.0                           SkyRL tis_ratio_type="sequence" (clip_high 5.0)
``sequence_geometric``      sequence_geometric, log s ≤ 10    GSPO's sequence ratio (inline in the gspo losses)
``token_icepop``            token, clamp ±20, band [0.5, 2]   verl rollout_is="token" with
                                                              rollout_is_threshold="0.5_2.0" (IcePop: a
                                                              ratio outside the band weighs 0)
==========================  ================================  =============================================

Sources: Schulman et al. 2017 (PPO ratio); Zheng et al. 2025, arXiv:2507.18071 eq. 7 (GSPO); Yao et al.
2025, "Your efficient RL framework secretly brings you off-policy RL training" (TIS); verl 0.9.1
``trainer/ppo/rollout_corr_helper.compute_rollout_correction_weights``; SkyRL 0.4.0
``utils/off_policy_correction_utils.compute_tis_ratio``.

Regimes ``<variant>@moderate`` (|Δ| ≤ 1; fp32, fp64) and ``<variant>@extreme_log_ratios`` (Δ = ±100 in
fp32, ±20 in bf16 and fp16, where e^20 > 65504 overflows fp16 even after the ±20 clamp: the clamp and the
cap decide; gradients must stay finite where the exact one is finite and representable). ``mask_invariant`` writes NaN, ±inf
or 1e30 at masked positions of both inputs. Yardstick (faithful): the reference with every valid
log-ratio shifted by one fp32 rounding of its operands, ε·(|log_prob| + |old_log_prob|) (ε = 2⁻²⁴, 2⁻⁵³
for fp64), the same sign at every token (so a sequence's sum carries n such roundings): what a
correct fp32 computation can differ by, exp's amplification included; bf16 engines are held to fp32
compute rounded to bf16, as everywhere in the catalog.
"""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import strategies as st

import rlconform.reference as R
from rlconform.harness.core import strategies as S
from rlconform.harness.core.branches import Branch, place_in_regions, place_rows_in_regions
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
from rlconform.harness.core.tensors import as_numpy, out_dtype, to_tensor
from rlconform.harness.families import OpFamily
from rlconform.harness.families import _log_ratio as L

#: catalog variant -> keyword arguments of :func:`rlconform.reference.importance_ratio`
VARIANTS = {
    "token": dict(level="token", log_ratio_clamp=20),
    "token_tis": dict(level="token", log_ratio_clamp=20, cap=2.0),
    "sequence_product": dict(level="sequence_product", log_ratio_clamp=20),
    "sequence_tis": dict(level="sequence_product", log_ratio_clamp=20, cap=5.0),
    "sequence_geometric": dict(level="sequence_geometric", log_ratio_clamp=(None, 10)),
    "token_icepop": dict(level="token", log_ratio_clamp=20, band=(0.5, 2.0)),
}
#: a drawn token log-ratio this close to an IcePop band edge (log 0.5, log 2) is moved this far past it: the band
#: is a step, and a decision within a float32 rounding of an edge would read as a defect that is not one
BAND_MARGIN = 1e-3
GARBAGE = (np.nan, np.inf, -np.inf, 1e30)
EXTREME = {"float32": 100.0, "float64": 100.0, "bfloat16": 20.0, "float16": 20.0}
#: relative rounding of the compute dtype (fp32 for every input dtype but fp64)
COMPUTE_EPS = {"float64": 2.0**-53, "float32": 2.0**-24, "bfloat16": 2.0**-24, "float16": 2.0**-24}
_MODERATE = tuple(variant_regime(v, "moderate") for v in VARIANTS)

def _parameters(variant: str) -> str:
    """The level, TIS cap and log-ratio clamp ``variant`` is checked with (:data:`VARIANTS`), in words."""
    kw = VARIANTS[variant]
    clamp = kw.get("log_ratio_clamp")
    words = [kw["level"].replace("_", " ")] + ([f"TIS cap {kw['cap']:g}"] if kw.get("cap") is not None else []) + (
        [f"IcePop band [{kw['band'][0]:g}, {kw['band'][1]:g}] (weight 0 outside)"] if kw.get("band") else []) + (
        [f"log-ratio clamp {'±' + format(clamp, 'g') if not isinstance(clamp, tuple) else f'max {clamp[1]:g}'}"]
        if clamp is not None else [])
    return ", ".join(words)


OPS = (
    OpInfo("importance_ratio", "importance_ratio", None, (MATCHES_REFERENCE, NON_DESTRUCTIVE, FINITE, MASK_INVARIANT),
           {**{variant_regime(v, "moderate"): ("float32", "float64") for v in VARIANTS},
            **{variant_regime(v, "extreme_log_ratios"): ("float32", "bfloat16", "float16") for v in VARIANTS}},
           reference_function("importance_ratio"), reference_function("importance_ratio_grad"), differentiable=True,
           source="PPO ratio; GSPO arXiv:2507.18071 eq. 7; TIS (Yao et al. 2025); verl rollout_corr_helper."
                  "compute_rollout_correction_weights; SkyRL off_policy_correction_utils.compute_tis_ratio",
           family="importance_ratio", variants=tuple(VARIANTS),
           property_regimes={NON_DESTRUCTIVE: _MODERATE, MASK_INVARIANT: _MODERATE,
                             FINITE: tuple(variant_regime(v, "extreme_log_ratios") for v in VARIANTS)},
           variant_parameters={v: _parameters(v) for v in VARIANTS}),
)


# ------------------------------------------------------------------------------------ branches
_LOG2, _LOG5 = np.log(2.0), np.log(5.0)  # the TIS caps of token_tis, sequence_tis
#: token log-ratio intervals the moderate regime places tokens in: inside, above the token TIS
#: cap 2, beyond the ±20 clamp (exp(25) = 7.2e10: no overflow in fp32)
TOKEN_REGIONS = ((-0.9, 0.9), (_LOG2 + 0.05, 3.0), (20.5, 25.0), (-25.0, -20.5))
#: the same for the IcePop band [0.5, 2]: also below its lower edge
ICEPOP_REGIONS = TOKEN_REGIONS + ((-3.0, -_LOG2 - 0.05),)
#: row log-ratio intervals (the row's sum for the products, its mean for the geometric mean)
ROW_REGIONS = {
    "sequence_product": ((-1.0, 1.0), (_LOG5 + 0.05, 4.0), (20.5, 25.0), (-25.0, -20.5)),
    "sequence_geometric": ((-1.0, 1.0), (10.5, 13.0)),
}


def _row(x, mean: bool):
    m = x["mask"]
    d = np.where(m, x["log_prob"] - x["old_log_prob"], 0.0).sum(-1)
    if mean:
        d = d / np.maximum(m.sum(-1), 1)
    return d


def _tok(x):
    return x["log_prob"] - x["old_log_prob"]


def _br(name, fn):
    return Branch(name, fn)


_SEQ = (_br("row log-ratio sum inside ±20", lambda x: x["mask"].any(-1) & (np.abs(_row(x, False)) <= 20)),
        _br("row log-ratio sum beyond +20 (clamped)", lambda x: _row(x, False) > 20),
        _br("row log-ratio sum beyond −20 (clamped)", lambda x: _row(x, False) < -20))
#: variant -> the branches of its definition (reference.importance: clamp, cap); per token ([B, T]) or per row
#: ([B], rows with a valid token): the CI profile's moderate examples take each one
BRANCHES = {
    "token": (_br("log-ratio inside ±20", lambda x: np.abs(_tok(x)) <= 20),
              _br("log-ratio beyond +20 (clamped)", lambda x: _tok(x) > 20),
              _br("log-ratio beyond −20 (clamped)", lambda x: _tok(x) < -20)),
    "token_tis": (_br("ratio below the cap 2", lambda x: _tok(x) < _LOG2),
                  _br("ratio above the cap 2 (truncated)", lambda x: (_tok(x) > _LOG2) & (_tok(x) <= 20)),
                  _br("log-ratio beyond +20 (clamped and truncated)", lambda x: _tok(x) > 20),
                  _br("log-ratio beyond −20 (clamped)", lambda x: _tok(x) < -20)),
    "token_icepop": (_br("ratio inside the band [0.5, 2]", lambda x: np.abs(_tok(x)) < _LOG2),
                     _br("ratio above 2 (weight 0)", lambda x: (_tok(x) > _LOG2) & (_tok(x) <= 20)),
                     _br("ratio below 0.5 (weight 0)", lambda x: (_tok(x) < -_LOG2) & (_tok(x) >= -20)),
                     _br("log-ratio beyond ±20 (clamped, weight 0)", lambda x: np.abs(_tok(x)) > 20)),
    "sequence_product": _SEQ,
    "sequence_tis": _SEQ + (_br("row ratio below the cap 5", lambda x: x["mask"].any(-1) & (_row(x, False) < _LOG5)),
                            _br("row ratio above the cap 5 (truncated)", lambda x: (_row(x, False) > _LOG5)
                                & (_row(x, False) <= 20))),
    "sequence_geometric": (_br("row mean log-ratio ≤ 10", lambda x: x["mask"].any(-1) & (_row(x, True) <= 10)),
                           _br("row mean log-ratio beyond the 10 clamp", lambda x: _row(x, True) > 10)),
}


@st.composite
def inputs(draw, dtype: str, variant: str, data: str):
    """``{"log_prob", "old_log_prob": [B, T] float64 exact in dtype (≤ 0), "mask": [B, T] bool (right-padded
    or multi-turn rows, at least one valid token), "garbage", "variant"}``, B ≤ 8, T ≤ 64. ``moderate``: |Δ| ≤ 1, and in
    half the examples tokens (sequence levels: rows) placed in :data:`TOKEN_REGIONS` / :data:`ROW_REGIONS`
    (above the TIS cap, beyond the clamps: ordinary magnitudes)."""
    b = draw(st.integers(1, 8))
    t = draw(st.sampled_from([1, 4, 16, 64]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    lengths = rng.integers(0, t + 1, size=b)
    lengths[rng.integers(0, b)] = rng.integers(1, t + 1)
    mask = S.loss_masks(draw, rng, b, t, lengths)  # right padding or multi-turn rows
    if not mask.any():
        mask[rng.integers(0, b), rng.integers(0, t)] = True
    old = np.log(rng.uniform(0.05, 1.0, (b, t)))
    delta = rng.uniform(-1.0, 1.0, (b, t)) * draw(st.sampled_from([1e-3, 0.1, 1.0]))
    if data == "extreme_log_ratios":
        big = EXTREME[dtype]
        hits = rng.random((b, t)) < draw(st.sampled_from([0.05, 0.3]))
        hits[rng.integers(0, b), rng.integers(0, t)] = True
        sign = rng.choice([-1.0, 1.0], size=(b, t))
        delta = np.where(hits, sign * big, delta)
        old = np.where(hits & (sign > 0), old - big - 0.5, old)  # keep log_prob = old + Δ ≤ 0
    elif draw(st.booleans()):
        level = VARIANTS[variant]["level"]
        if level == "token":
            regions = ICEPOP_REGIONS if VARIANTS[variant].get("band") else TOKEN_REGIONS
            delta, _ = place_in_regions(rng, delta, regions, where=mask)
        else:
            delta, _ = place_rows_in_regions(rng, delta, mask, ROW_REGIONS[level],
                                             reduce="mean" if level == "sequence_geometric" else "sum")
        old = np.minimum(old, -delta - rng.uniform(0.05, 0.5, (b, t)))  # keep log_prob = old + Δ ≤ 0
    if VARIANTS[variant].get("band"):  # away from the band's edges (BAND_MARGIN)
        for edge in np.log(VARIANTS[variant]["band"]):
            near = np.abs(delta - edge) < BAND_MARGIN
            delta = np.where(near, edge + np.where(delta >= edge, 2, -2) * BAND_MARGIN, delta)
        old = np.minimum(old, -delta - 0.05)  # keep log_prob = old + Δ ≤ 0
    lp = old + delta
    lp = np.where(lp > 0, old - np.abs(delta), lp)
    return {"log_prob": S.round_to(lp, dtype), "old_log_prob": S.round_to(old, dtype), "mask": mask,
            "garbage": draw(st.sampled_from(GARBAGE)), "variant": variant}


def strategy(op: OpInfo, dtype: str, regime: str):
    variant, data = split_regime(regime)
    return inputs(dtype, variant, data)


def reference(variant: str, lp, old, mask):
    """(ratio [B, T], gradient of Σ_valid ratio w.r.t. log_prob [B, T]) of the float64 reference."""
    kw = VARIANTS[variant]
    return R.importance_ratio(lp, old, mask, **kw), R.importance_ratio_grad(lp, old, mask, **kw)


def yardstick(variant: str, lp, old, mask, dtype: str):
    """The reference with each valid log-ratio shifted by ε·(|log_prob| + |old_log_prob|) (module doc)."""
    shift = COMPUTE_EPS[dtype] * (np.abs(np.where(mask, lp, 0.0)) + np.abs(np.where(mask, old, 0.0)))
    return reference(variant, np.where(mask, lp + shift, lp), old, mask)


class _Faithful(torch.autograd.Function):
    """The float64 reference as an autograd op, rounded to the input dtype (masked entries 0)."""

    @staticmethod
    def forward(ctx, log_prob, old_log_prob, mask, variant):
        m = mask.detach().cpu().numpy().astype(bool)
        ratio, _ = reference(variant, as_numpy(log_prob), as_numpy(old_log_prob), m)
        ctx.args = (as_numpy(log_prob), as_numpy(old_log_prob), m, variant)
        ctx.dtype = log_prob.dtype
        return torch.from_numpy(ratio).to(log_prob.dtype)

    @staticmethod
    def backward(ctx, grad_output):
        lp, old, m, variant = ctx.args
        g = R.importance_ratio_grad(lp, old, m, grad_output=grad_output.detach().double().cpu().numpy(),
                                    **VARIANTS[variant])
        return torch.from_numpy(g).to(ctx.dtype), None, None, None


def faithful(variant: str):
    """The reference engine's ``variant``: :class:`_Faithful`."""

    def importance_ratio(log_prob, old_log_prob, mask):
        return _Faithful.apply(log_prob, old_log_prob, mask, variant)

    importance_ratio.__qualname__ = f"reference.importance_ratio[{variant}]"
    return importance_ratio


def reference_variants() -> Variants:
    return Variants({v: faithful(v) for v in VARIANTS})


def _detached_problem(out, lp, m, label, ev) -> list:
    """The detached contract: the weight must have no gradient path to log_prob. A backward of
    Σ_valid weight that reaches log_prob non-zero at a valid token is a problem in ``ev``; no graph, no
    gradient or an all-zero one pass. Returns no comparison (the gradient has no reference value)."""
    if not isinstance(out, torch.Tensor) or not out.requires_grad:
        return []
    call_engine("importance_ratio backward", out.backward, m.to(out.dtype))
    if lp.grad is None:
        return []
    g = as_numpy(lp.grad)
    hit = m.numpy() & (g != 0)
    if hit.any():
        pos = tuple(int(i) for i in np.argwhere(hit)[0])
        ev.problems.append(problem_clause("unexpected gradient", f"{label}gradient: the weight is declared detached (no gradient path to log_prob: a "
                           f"constant for the policy gradient) but backward gives {int(hit.sum())} non-zero "
                           f"gradient(s) at valid tokens, e.g. {float(g[pos])!r} at {pos}"))
    return []


def _run(binding, fn, lp64, old64, mask, dtype, label, refs, fa, ev) -> list[Compared]:
    """Call the engine, backpropagate the mask (unless the binding is forward-only for the op)."""
    lp = to_tensor(lp64, dtype).requires_grad_(True)
    old = to_tensor(old64, dtype)
    m = torch.from_numpy(mask.copy())
    out = call_engine("importance_ratio", fn, lp, old, m)
    problem = shape_problem(f"{label}ratio", as_numpy(out), mask.shape)
    if problem:
        ev.problems.append(problem)
        return []
    odt = out_dtype(out, dtype)
    res = [Compared(f"{label}ratio", as_numpy(out), refs[0], S.round_to(fa[0], odt), odt, "pipeline",
                    only_where=mask, quantity="value")]
    if "importance_ratio" in binding.forward_only:
        return res
    if "importance_ratio" in getattr(binding, "detached", ()):
        return res + _detached_problem(out, lp, m, label, ev)
    if not isinstance(out, torch.Tensor) or not out.requires_grad:
        ev.problems.append(problem_clause("missing gradient", f"{label}gradient: the ratio has no autograd graph: no gradient reaches log_prob "
                           "(bind the op forward_only if the engine detaches it by design)"))
        return res
    call_engine("importance_ratio backward", out.backward, m.to(out.dtype))
    if lp.grad is None:
        ev.problems.append(problem_clause("missing gradient", f"{label}gradient: backward ran but no gradient reached log_prob"))
        return res
    res.append(Compared(f"{label}gradient w.r.t. log_prob", as_numpy(lp.grad), refs[1], S.round_to(fa[1], odt),
                        odt, "pipeline", only_where=mask, quantity="gradient"))
    return res


def evaluate(binding, case) -> Evaluation:
    fn, mask, lp64, old64, ev = L.prepare(binding, case, "importance_ratio", "no valid token: no ratio is defined")
    if ev.undefined:
        return ev
    if case.property == NON_DESTRUCTIVE:
        return L.guarded_call("importance_ratio", fn, lp64, old64, mask, case.dtype, ev, differentiable=True)
    variant = case.inputs["variant"]
    refs = reference(variant, lp64, old64, mask)
    fa = yardstick(variant, lp64, old64, mask, case.dtype)
    split = _run(binding, fn, lp64, old64, mask, case.dtype, "", refs, fa, ev)
    ev.values = [c for c in split if c.quantity != "gradient"]
    ev.gradients = [c for c in split if c.quantity == "gradient"]
    if case.property == MASK_INVARIANT:
        prefix, label, lp_g, old_g = L.with_garbage(case, mask, lp64, old64)
        ev.alternatives.append((label, _run(binding, fn, lp_g, old_g, mask, case.dtype, prefix, refs, fa, ev)))
    return ev


def trigger(case, clauses, kind: str):
    """Every valid token's weight 0 — IcePop with every ratio outside its band, or weights that underflow in the
    dtype — is what brings out a crash of a statistic divided by the weights' mean (verl's effective sample
    size); None otherwise (the generic reading decides)."""
    if not kind.startswith("crash:"):
        return None
    x = case.inputs
    m = np.asarray(x["mask"], bool)
    kw = VARIANTS.get(x.get("variant"), {})
    if not kw or not m.any():
        return None
    w = S.round_to(R.importance_ratio(np.asarray(x["log_prob"], np.float64), np.asarray(x["old_log_prob"], np.float64),
                                      m, **kw), case.dtype)[m]
    if (w != 0).any():
        return None
    if kw.get("band") and not (R.importance_ratio(x["log_prob"], x["old_log_prob"], m,
                                                  **{k: v for k, v in kw.items() if k != "band"})[m] == 0).all():
        lo, hi = kw["band"]
        return f"every valid token's ratio outside the IcePop band [{lo:g}, {hi:g}]: every weight 0"
    return f"every weight underflows to 0 in {case.dtype} (every log-ratio ≲ −{-np.log(_TINY[case.dtype]):.3g})"


#: the smallest positive (subnormal) value of each dtype: a ratio below it rounds to 0
_TINY = {"float16": 2.0**-24, "bfloat16": 2.0**-133, "float32": 2.0**-149, "float64": 2.0**-1074}


FAMILY = OpFamily("importance_ratio", OPS, strategy, evaluate, order=57, trigger=trigger,
                  doc="importance ratios: token / sequence (product, GSPO geometric mean), truncated (TIS)")
