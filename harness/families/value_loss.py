"""The clipped value-function (critic) loss ``value_loss``: loss, gradient w.r.t. the value predictions,
and the clip fraction ``vf_clipfrac``.

Canonical form: a :class:`~rlconform.harness.core.contracts.LossVariants` registry whose callables are one
micro-batch's call ``(vpreds [b, T], values [b, T], returns [b, T], response_mask [b, T] bool, info:
BatchInfo) -> (loss 0-d, metrics: dict[str, float])`` (``values``: the critic's values at rollout time,
``returns``: the targets). Micro-batch losses are summed (gradient accumulation); the result must
equal :func:`rlconform.reference.value_loss` over the whole mini-batch (½·agg_loss of
max((v − R)², (clip(v, v_old ± ε) − R)²)) for every partition, and the gradient w.r.t. vpreds
:func:`rlconform.reference.value_loss_grad`. ``vf_clipfrac`` (the valid tokens where the clipped term
is strictly larger) is a token-weighted metric: its fold over micro-batches must be Σ clipped / Σ tokens
(``partition_invariant``), never a mean of micro-batch means.

==============================  ==================================================================
variant                         reference kwargs
==============================  ==================================================================
``token-mean`` … ``seq-mean-``  ``cliprange_value=0.2``, that ``loss_agg_mode`` (verl's five;
``token-sum-norm``              ``loss_scale_factor`` = T, passed explicitly)
``unclipped``                   ``cliprange_value=None``, ``seq-mean-token-mean`` (SkyRL's
                                ``value_clip=None``)
==============================  ==================================================================

Sources: OpenAI baselines ppo2 (clipped value loss); verl 0.9.1 ``core_algos.compute_value_loss``
(from TRL's PPOTrainer); SkyRL 0.4.0 ``ppo_utils.ppo_critic_loss`` and ``CriticWorkerBase``.

Regimes ``<variant>@moderate`` (values O(1), padded rows, some empty; fp32, fp64) and
``<variant>@large_errors`` (a few tokens with |v − R| up to 1e15 in fp32, 1e10 in bf16: squares near
the top of the range; fp32, bf16). ``mask_invariant`` writes NaN, ±inf or 1e30 into every input at
masked positions. Yardstick (per element, the farther from the reference of two correct computations):
the float64 reference with vpreds moved away from the returns by one fp32 rounding of the operands,
ε·(|v| + |v_old| + |R|), and the textbook formula computed in fp32 (:func:`fp32_path`: where |R| ≫
|v − v_clip| fp32 rounds the two squared errors to a tie, torch.maximum splits the gradient and the clip
decision is lost; a correct fp32 engine does the same). Rounded to the engine's output dtype; metrics are
compared at float32 precision at most.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from hypothesis import strategies as st

import rlconform.reference as R
from rlconform.harness.core import strategies as S
from rlconform.harness.core.branches import Branch
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
from rlconform.harness.families.policy_loss import token_weighted
from rlconform.reference._policy_common import agg_weights
from rlconform.reference.exact_sum import exact_sum

CLIPRANGE_VALUE = 0.2
#: catalog variant -> (cliprange_value, loss_agg_mode)
VARIANTS = {mode: (CLIPRANGE_VALUE, mode) for mode in R.LOSS_AGG_MODES}
VARIANTS["unclipped"] = (None, "seq-mean-token-mean")
#: metrics an engine must log when the reference defines them
REQUIRED_METRICS = ("vf_clipfrac",)
GARBAGE = (np.nan, np.inf, -np.inf, 1e30)
LARGE = {"float32": 1e15, "float64": 1e15, "bfloat16": 1e10, "float16": 100.0}
COMPUTE_EPS = {"float64": 2.0**-53, "float32": 2.0**-24, "bfloat16": 2.0**-24, "float16": 2.0**-24}

_MODERATE = tuple(variant_regime(v, "moderate") for v in VARIANTS)
OPS = (
    OpInfo("value_loss", "value_loss", None,
           (MATCHES_REFERENCE, PARTITION_INVARIANT, NON_DESTRUCTIVE, FINITE, MASK_INVARIANT),
           {**{variant_regime(v, "moderate"): ("float32", "float64") for v in VARIANTS},
            **{variant_regime(v, "large_errors"): ("float32", "bfloat16") for v in VARIANTS}},
           reference_function("value_loss"), reference_function("value_loss_grad"), differentiable=True,
           source="OpenAI baselines ppo2; verl 0.9.1 core_algos.compute_value_loss; SkyRL 0.4.0 "
                  "ppo_utils.ppo_critic_loss",
           family="value_loss", variants=tuple(VARIANTS),
           property_regimes={PARTITION_INVARIANT: _MODERATE, NON_DESTRUCTIVE: _MODERATE, MASK_INVARIANT: _MODERATE,
                             FINITE: tuple(variant_regime(v, "large_errors") for v in VARIANTS)}),
)


# ------------------------------------------------------------------------------------ branches
def _vc(x):
    """(v − R)², (v_clip − R)², and where v is above / below the clip range [v_old − ε, v_old + ε]."""
    v, old, ret = x["vpreds"], x["values"], x["returns"]
    vc = np.clip(v, old - CLIPRANGE_VALUE, old + CLIPRANGE_VALUE)
    return (v - ret) ** 2, (vc - ret) ** 2, v > old + CLIPRANGE_VALUE, v < old - CLIPRANGE_VALUE


_CLIPPED = (
    Branch("v inside the clip range (both terms equal)", lambda x: ~_vc(x)[2] & ~_vc(x)[3]),
    Branch("v above v_old + ε, clipped term larger (clip binds)", lambda x: _vc(x)[2] & (_vc(x)[1] > _vc(x)[0])),
    Branch("v above v_old + ε, unclipped term larger", lambda x: _vc(x)[2] & (_vc(x)[1] < _vc(x)[0])),
    Branch("v below v_old − ε, clipped term larger (clip binds)", lambda x: _vc(x)[3] & (_vc(x)[1] > _vc(x)[0])),
    Branch("v below v_old − ε, unclipped term larger", lambda x: _vc(x)[3] & (_vc(x)[1] < _vc(x)[0])),
)
#: variant -> the branches of its definition (reference.value_loss): the CI profile's moderate examples take
#: each one; the aggregation modes share the per-token branches
BRANCHES = {v: (_CLIPPED if eps is not None else (Branch("any valid token", lambda x: np.ones(x["mask"].shape, bool)),))
            for v, (eps, _) in VARIANTS.items()}


# ------------------------------------------------------------------------------------ inputs
@st.composite
def inputs(draw, dtype: str, variant: str, data: str):
    """``{"vpreds", "values", "returns": [B, T] float64 exact in dtype, "mask": [B, T] bool (right-padded
    or multi-turn rows, some rows empty, at least one valid token), "partitions": 2 lists of micro-batch row ranges,
    "garbage", "variant"}``; B ≤ 8, T ≤ 64. |v − v_old| spans both sides of ε = 0.2."""
    b = draw(st.integers(1, 8))
    t = draw(st.sampled_from([1, 4, 16, 64]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    lengths = rng.integers(0, t + 1, size=b)
    lengths[rng.integers(0, b)] = rng.integers(1, t + 1)
    mask = S.loss_masks(draw, rng, b, t, lengths)  # right padding or multi-turn rows
    if not mask.any():
        mask[rng.integers(0, b), rng.integers(0, t)] = True
    scale = draw(st.sampled_from([0.1, 1.0, 10.0]))
    old = rng.standard_normal((b, t)) * scale
    vpreds = old + rng.uniform(-0.5, 0.5, (b, t))
    returns = old + rng.standard_normal((b, t)) * draw(st.sampled_from([0.05, 0.5, 2.0]))
    if data == "large_errors":
        hits = rng.random((b, t)) < draw(st.sampled_from([0.05, 0.3]))
        hits[rng.integers(0, b), rng.integers(0, t)] = True
        big = LARGE[dtype] * rng.uniform(0.1, 1.0, (b, t)) * rng.choice([-1.0, 1.0], size=(b, t))
        returns = np.where(hits, big, returns)
    parts = []
    for _ in range(2):
        k = draw(st.integers(1, min(b, 4)))
        parts.append(draw(S.composition(b, k)))
    return {"vpreds": S.round_to(vpreds, dtype), "values": S.round_to(old, dtype),
            "returns": S.round_to(returns, dtype), "mask": mask, "partitions": parts,
            "garbage": draw(st.sampled_from(GARBAGE)), "variant": variant}


def strategy(op: OpInfo, dtype: str, regime: str):
    variant, data = split_regime(regime)
    return inputs(dtype, variant, data)


# ----------------------------------------------------------------------------- the reference
def reference(variant: str, v, v_old, ret, mask):
    """(loss, gradient w.r.t. vpreds [B, T], metrics {key: SumCount}) of the float64 reference."""
    eps, mode = VARIANTS[variant]
    lsf = mask.shape[-1]
    loss, metrics = R.value_loss(v, v_old, ret, mask, eps, mode, loss_scale_factor=lsf)
    grad = R.value_loss_grad(v, v_old, ret, mask, eps, mode, loss_scale_factor=lsf)
    return loss, grad, metrics


def row_weights(mode: str, mask: np.ndarray, info: BatchInfo) -> np.ndarray:
    """Weight of each row's token sum ½·Σ_t L in the mini-batch loss (``[b]``), from the mini-batch's totals
    in ``info`` (global normalisers, the reference's definitions: n_seq counts non-empty rows)."""
    counts = mask.sum(-1).astype(np.float64)
    nseq = max(info.global_nonempty_seqs, 1)
    if mode == "token-mean":
        return np.full(counts.shape, 1.0 / max(info.global_nnz, 1))
    if mode == "token-sum":
        return np.ones(counts.shape)
    if mode == "seq-mean-token-sum":
        return np.full(counts.shape, 1.0 / nseq)
    if mode == "seq-mean-token-sum-norm":
        return np.full(counts.shape, 1.0 / (nseq * mask.shape[-1]))
    return np.where(counts > 0, 1.0 / (np.maximum(counts, 1) * nseq), 0.0)  # seq-mean-token-mean


class _Faithful(torch.autograd.Function):
    """The float64 reference of one micro-batch as an autograd op: each row's ½·Σ_t L (reference
    ``token-sum``) weighted by :func:`row_weights`, rounded to vpreds' dtype."""

    @staticmethod
    def forward(ctx, vpreds, values, returns, mask, variant, info):
        eps, mode = VARIANTS[variant]
        v, v_old, ret = (as_numpy(x) for x in (vpreds, values, returns))
        m = mask.detach().cpu().numpy().astype(bool)
        w = row_weights(mode, m, info)
        parts, grad = [], np.zeros(m.shape)
        for i in range(m.shape[0]):
            if not m[i].any():
                continue
            row = (v[i:i + 1], v_old[i:i + 1], ret[i:i + 1], m[i:i + 1], eps, "token-sum")
            parts.append(w[i] * R.value_loss(*row)[0])
            grad[i] = w[i] * R.value_loss_grad(*row)[0]
        ctx.grad = torch.from_numpy(grad)
        ctx.dtype = vpreds.dtype
        return torch.tensor(exact_sum(parts), dtype=torch.float64).to(vpreds.dtype)

    @staticmethod
    def backward(ctx, grad_output):
        return (ctx.grad * grad_output.double()).to(ctx.dtype), None, None, None, None, None


def faithful_loss(variant: str):
    """The reference engine's binding of ``variant``: :class:`_Faithful`; the metric is the call's mean
    over its valid tokens, folded token-weighted by :func:`~rlconform.harness.families.policy_loss.token_weighted`."""

    def loss(vpreds, values, returns, response_mask, info):
        out = _Faithful.apply(vpreds, values, returns, response_mask, variant, info)
        m = response_mask.detach().cpu().numpy().astype(bool)
        eps, _ = VARIANTS[variant]
        metrics = {}
        if m.any():
            _, sc = R.value_loss(as_numpy(vpreds), as_numpy(values), as_numpy(returns), m, eps, "token-sum")
            metrics = {k: v.mean for k, v in sc.items()}
        return out, metrics

    loss.__qualname__ = f"reference.value_loss[{variant}]"
    return loss


def reference_variants() -> LossVariants:
    return LossVariants({v: faithful_loss(v) for v in VARIANTS}, combine_metrics=token_weighted)


# ------------------------------------------------------------------------------ the engine run
ARRAYS = ("vpreds", "values", "returns")


def _info(mask: np.ndarray, parts: int = 1) -> BatchInfo:
    return BatchInfo(dp_size=1, global_nnz=int(mask.sum()), global_batch_size=int(mask.shape[0]),
                     global_nonempty_seqs=int((mask.sum(-1) > 0).sum()), num_micro_batches=parts,
                     loss_scale_factor=float(mask.shape[-1]))


def run(impl: LossVariants, fn, arrays: dict, mask: np.ndarray, dtype: str, partition, ev: Evaluation):
    """Drive ``fn`` over the micro-batches of ``partition``
    (:func:`~rlconform.harness.families._token_loss.drive_micro_batches`): (loss, gradient [B, T] or None,
    metrics, output dtype), or None after a problem."""
    info = _info(mask, len(partition))
    return drive_micro_batches("value_loss", lambda t, m: fn(t["vpreds"], t["values"], t["returns"], m, info), arrays, "vpreds",
                               impl.combine_metrics, mask, dtype, partition, ev)


def _round(x, dtype: str) -> np.ndarray:
    return S.round_to(np.asarray(x, dtype=np.float64), dtype)


def fp32_path(variant: str, arrays: dict, mask: np.ndarray, dtype: str):
    """The textbook formula in the compute dtype (fp32; fp64 for fp64): masked positions zeroed first,
    ``torch.clamp``, ``torch.maximum`` (a tie of the two terms, which fp32 rounding creates when |R| ≫ |v −
    v_clip|, splits the gradient), per-token weights of the aggregation in float64. (loss, gradient,
    metrics) like :func:`reference`."""
    eps, mode = VARIANTS[variant]
    cd = torch.float64 if dtype == "float64" else torch.float32
    m = torch.from_numpy(mask)
    z = torch.zeros((), dtype=cd)
    v64, old64, ret64 = (np.where(mask, arrays[k], 0.0) for k in ARRAYS)
    v = torch.from_numpy(v64).to(cd).requires_grad_(True)
    v_old, ret = torch.from_numpy(old64).to(cd), torch.from_numpy(ret64).to(cd)
    l1 = (v - ret) ** 2
    metrics = {}
    if eps is None:
        per_token = l1
    else:
        l2 = (torch.clamp(v, v_old - eps, v_old + eps) - ret) ** 2
        per_token = torch.maximum(l1, l2)
        clipped = ((l2 > l1) & m).double().sum().item()
        metrics["vf_clipfrac"] = R.SumCount(clipped, int(mask.sum()))
    w = torch.from_numpy(agg_weights(mask, mode, mask.shape[-1]))
    loss = 0.5 * (torch.where(m, per_token, z).double() * w).sum()
    loss.backward()
    return float(loss.detach()), as_numpy(v.grad), metrics


def yardstick(variant: str, arrays: dict, mask: np.ndarray, dtype: str, ref):
    """Per element the farther from the reference of two correct computations (module doc): the reference
    at vpreds shifted by ε·(|v| + |v_old| + |R|) away from the returns, and :func:`fp32_path`."""
    v, v_old, ret = arrays["vpreds"], arrays["values"], arrays["returns"]
    shifted = v + COMPUTE_EPS[dtype] * (np.abs(v) + np.abs(v_old) + np.abs(ret)) * np.sign(v - ret)
    try:
        a = reference(variant, shifted, v_old, ret, mask)
    except ValueError:
        a = ref
    b = fp32_path(variant, arrays, mask, dtype)

    def far(x, y, r):
        x, y, r = (np.asarray(t, dtype=np.float64) for t in (x, y, r))
        with np.errstate(invalid="ignore", over="ignore"):
            return np.where(np.abs(y - r) > np.abs(x - r), y, x)

    metrics = dict(a[2])
    for k, sc in b[2].items():
        if k in metrics and k in ref[2] and abs(sc.mean - ref[2][k].mean) > abs(metrics[k].mean - ref[2][k].mean):
            metrics[k] = sc
    return float(far(a[0], b[0], ref[0])), far(a[1], b[1], ref[1]), metrics


def _compared(label, out, ref, mask, ev, faithful):
    loss, grad, metrics, odt = out
    r_loss, r_grad, r_metrics = ref
    f_loss, f_grad, f_metrics = faithful
    mdt = "float32" if odt == "float64" else odt
    res = [Compared(f"{label}loss", np.float64(loss), np.float64(r_loss), _round(f_loss, odt), odt, "pipeline")]
    for key in sorted(r_metrics):
        want = r_metrics[key].mean
        if math.isnan(want):
            continue
        if key not in metrics or metrics[key] is None:
            if key in REQUIRED_METRICS:
                ev.problems.append(problem_clause("lost metric", f"metric {key!r} missing: the engine logged "
                                                                  f"{sorted(metrics)}", key=f"metric {key}"))
            continue
        f_want = f_metrics[key].mean if key in f_metrics else want
        res.append(Compared(f"{label}metric {key}", np.float64(float(metrics[key])), np.float64(want),
                            _round(f_want, mdt), mdt, "pipeline", quantity="metric"))
    grads = []
    if grad is not None:
        grads.append(Compared(f"{label}gradient w.r.t. vpreds", grad, r_grad, _round(f_grad, odt), odt, "pipeline",
                              only_where=mask))
    return res, grads


def evaluate(binding, case) -> Evaluation:
    impl = binding.resolve("value_loss")
    variant = case.inputs["variant"]
    fn = impl.get("value_loss", variant, binding.name)
    mask = loss_mask(case)
    arrays = {k: case.inputs[k] for k in ARRAYS}
    ev = Evaluation()
    if case.property == NON_DESTRUCTIVE:
        return guarded_call("value_loss", fn, arrays, "vpreds", mask, case.dtype,
                            lambda f, t, m: f(t["vpreds"], t["values"], t["returns"], m, _info(mask)), ev)
    if not mask.any():
        ev.undefined = "the value loss of a mini-batch with no valid token is undefined"
        return ev
    try:
        ref = reference(variant, arrays["vpreds"], arrays["values"], arrays["returns"], mask)
    except ValueError as exc:
        ev.undefined = f"the reference is undefined here: {exc}"
        return ev
    fa = yardstick(variant, arrays, mask, case.dtype, ref)
    out = run(impl, fn, arrays, mask, case.dtype, [(0, mask.shape[0])], ev)
    if out is None:
        return ev
    ev.values, ev.gradients = _compared("", out, ref, mask, ev, fa)
    ev.base_label = "one micro-batch"
    second_looks(case, arrays, mask, ev, lambda a, p: run(impl, fn, a, mask, case.dtype, p, ev),
                 lambda label, alt: _compared(label, alt, ref, mask, ev, fa))
    return ev


FAMILY = OpFamily("value_loss", OPS, strategy, evaluate, order=65,
                  doc="clipped PPO value (critic) loss: loss, gradient w.r.t. vpreds, vf_clipfrac")
