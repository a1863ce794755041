"""Masked reductions over tokens: ``masked_sum``, ``masked_count`` (nnz), ``masked_mean``,
``masked_var`` / ``masked_std`` (population and unbiased), ``masked_min``, ``masked_max``.

Canonical signatures: ``(values [B, T], mask [B, T]) -> 0-d`` (``masked_count(mask)``;
``masked_var/std(values, mask, unbiased: bool)``). The float64 references are exactly rounded
(:mod:`rlconform.reference.reductions`). A reduction over no tokens is undefined (NaN in the
reference) except the sum (0) and the count (0): there any result, or a loud error, is accepted.

Regimes are mask regimes (``all_on``, ``padded``, ``random``, ``all_off``, ``multi_turn``: tool-observation
spans between trainable tokens, rows that are all observation), and ``real_shapes``
(``nightly`` profile only): sequences of up to 32 768 tokens, more than 2^24 unmasked tokens
in all (where an fp32 count or a float32 running sum stops being exact), described by a seed
(:class:`~rlconform.harness.core.generated.TokensGen`; ~150 MB of float64 values when materialised). ``mask_invariant``
overwrites the masked positions with NaN, ±inf or 1e30 (a reduction computed as ``Σ values·mask``
turns NaN·0 into NaN).
"""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import strategies as st

from rlconform.harness.core import faithful as F
from rlconform.harness.core import strategies as S
from rlconform.harness.core.evaluation import Compared, EngineCrash, Evaluation, call_engine, shape_problem
from rlconform.harness.core.generated import TokensGen
from rlconform.harness.core.guards import InputGuard
from rlconform.harness.core.opinfo import (
    FINITE,
    FLOAT_DTYPES,
    MASK_INVARIANT,
    MATCHES_REFERENCE,
    NON_DESTRUCTIVE,
    OpInfo,
    reference_function,
)
from rlconform.harness.core.profiles import profile_regimes
from rlconform.harness.core.tensors import as_numpy, out_dtype, round_to, to_tensor
from rlconform.harness.families import OpFamily

#: Mask regimes for token reductions.
MASK_REGIMES = {name: FLOAT_DTYPES for name in ("all_on", "padded", "random", "all_off", "multi_turn")}
#: the profile-only regime at real sizes
REAL_SHAPES = "real_shapes"
REGIMES = dict(MASK_REGIMES, **{REAL_SHAPES: ("float32", "bfloat16")})
#: sequence lengths of real_shapes (the first is the first, derandomized, example's); tests shrink them
REAL_SEQUENCES = (32768, 8192)
#: real_shapes batches hold more than this many unmasked tokens (2^24: float32's last exact integer + 1)
REAL_MIN_TOKENS = 1 << 24
#: what mask_invariant writes into masked positions (each example draws one)
GARBAGE = (np.nan, np.inf, -np.inf, 1e30, -1e30)


def _op(name: str, arity: int, source: str) -> OpInfo:
    props = (MATCHES_REFERENCE, NON_DESTRUCTIVE, FINITE) + ((MASK_INVARIANT,) if name != "masked_count" else ())
    return OpInfo(name, "reduction", arity, props, REGIMES, reference_function(name), source=source,
                  family="reductions", property_regimes={MASK_INVARIANT: ("padded", "random", "multi_turn")},
                  profile_regimes=profile_regimes(REGIMES))


OPS = (
    _op("masked_sum", 2, "Σ values·mask, exactly rounded (math.fsum)"),
    _op("masked_count", 1, "nnz = Σ mask"),
    _op("masked_mean", 2, "Σ values·mask / nnz"),
    _op("masked_var", 3, "unbiased: Σ(x−μ)²/(nnz−1); population: /nnz"),
    _op("masked_std", 3, "sqrt(masked_var)"),
    _op("masked_min", 2, "min over unmasked"),
    _op("masked_max", 2, "max over unmasked"),
)


@st.composite
def inputs(draw, dtype: str, regime: str):
    """``{"values": [B, T], "mask": [B, T], "unbiased": bool, "garbage": float}``."""
    b = draw(st.integers(1, 6))
    t = draw(st.sampled_from([1, 2, 5, 16, 100, 1000]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    return {"values": draw(S.values((b, t), dtype, rng)), "mask": draw(S.masks((b, t), regime, rng)),
            "unbiased": draw(st.booleans()), "garbage": draw(st.sampled_from(GARBAGE))}


@st.composite
def real_inputs(draw):
    """``{"tokens": TokensGen [B, T], "unbiased": bool}``: rows of T ∈ REAL_SEQUENCES tokens, B rows so that
    more than ``REAL_MIN_TOKENS`` tokens stay unmasked (the short rows are extra rows)."""
    t = draw(st.sampled_from(REAL_SEQUENCES))
    short = draw(st.integers(1, 4))
    extra = draw(st.integers(1, 3))
    b = -(-REAL_MIN_TOKENS // t) + extra + short
    gen = TokensGen(draw(st.integers(0, 2**32 - 1)), (b, t), scale=draw(st.sampled_from([1.0, 30.0, 1e-3])),
                    offset=draw(st.sampled_from([-5.0, 100.0, 0.0])), short_rows=short)
    return {"tokens": gen, "unbiased": draw(st.booleans())}


def strategy(op: OpInfo, dtype: str, regime: str):
    if regime == REAL_SHAPES:
        return real_inputs()
    return inputs(dtype, regime)


def with_garbage(values64: np.ndarray, mask: np.ndarray, garbage: float) -> np.ndarray:
    """``values64`` with every masked position overwritten by ``garbage`` (NaN, ±inf, ±1e30)."""
    return np.where(mask, values64, garbage)


def _args(op: str, values: torch.Tensor, mask: torch.Tensor, inputs: dict) -> tuple:
    if op == "masked_count":
        return (mask,)
    if op in ("masked_var", "masked_std"):
        return (values, mask, bool(inputs.get("unbiased", True)))
    return (values, mask)


def _run(fn, op: str, values64: np.ndarray, mask_np: np.ndarray, inputs: dict, dtype: str, label: str,
         ref: np.float64, ev: Evaluation) -> Compared | None:
    values, mask = to_tensor(values64, dtype), torch.from_numpy(mask_np)
    args = _args(op, values, mask, inputs)
    out = call_engine(op, fn, *args)
    problem = shape_problem(label, as_numpy(out).reshape(-1)[:2], (1,), "expected a scalar") \
        if as_numpy(out).size != 1 else None
    if problem:
        ev.problems.append(problem)
        return None
    odt = out_dtype(out, dtype)
    clean = _args(op, to_tensor(np.where(mask_np, values64, 0.0), dtype), mask, inputs)
    faithful = as_numpy(round_to(getattr(F, op)(*clean), odt))
    # a masked sum/mean/var of ``dtype`` values is resolved in ``dtype`` even when returned wider (verl's
    # masked_mean sums fp16 values in fp16 and returns float32): its bound is never below half an ulp of
    # ``dtype``; a count is exact
    return Compared(label, as_numpy(out).reshape(()), np.asarray(ref), faithful, odt, "reduction",
                    only_where=~np.isnan(ref), resolution=None if op == "masked_count" else dtype)


def evaluate(binding, case) -> Evaluation:
    op = next(o for o in OPS if o.name == case.op)
    fn = binding.resolve(case.op)
    if isinstance(case.inputs.get("tokens"), TokensGen):  # real_shapes: materialised from its seed
        values64, mask_np = case.inputs["tokens"].materialise(case.dtype)
    else:
        values64, mask_np = case.inputs["values"], case.inputs["mask"].astype(bool)
    if case.property == MASK_INVARIANT and mask_np.all():  # garbage needs a masked position
        mask_np = mask_np.copy()
        mask_np[-1, -1] = False
    ev = Evaluation()
    ref_args = (mask_np,) if case.op == "masked_count" else (values64, mask_np) + (
        (bool(case.inputs.get("unbiased", True)),) if case.op in ("masked_var", "masked_std") else ())
    ref = np.float64(op.reference(*ref_args))
    undefined = bool(np.isnan(ref))
    if undefined:
        ev.undefined = f"{case.op} of no unmasked token is undefined (any result, or a loud error, is accepted)"

    if case.property == NON_DESTRUCTIVE:
        values, mask = to_tensor(values64, case.dtype), torch.from_numpy(mask_np)
        guard = InputGuard(values=values, mask=mask)
        try:
            call_engine(case.op, fn, *_args(case.op, values, mask, case.inputs))
        except EngineCrash:
            if not undefined:
                raise
        ev.mutations += [m.clause() for m in guard.check("forward")]
        ev.undefined = None  # the inputs must survive even where the value is undefined
        return ev
    try:
        base = _run(fn, case.op, values64, mask_np, case.inputs, case.dtype, "value", ref, ev)
    except EngineCrash:
        if undefined:
            return ev
        raise
    if base is not None:
        ev.values.append(base)
    if case.property == MASK_INVARIANT and base is not None and not undefined:
        garbage = float(case.inputs.get("garbage", np.nan))
        dirty = with_garbage(values64, mask_np, garbage)
        alt = _run(fn, case.op, dirty, mask_np, case.inputs, case.dtype, "value", ref, ev)
        if alt is not None:
            ev.alternatives.append((f"masked positions set to {garbage!r}", [alt]))
    return ev


FAMILY = OpFamily("reductions", OPS, strategy, evaluate, order=20,
                  doc="masked reductions over tokens (values [B, T], mask [B, T] -> 0-d)")
