"""Fused-linear token statistics: log-probs and entropy from hidden states and the
LM-head weight, computed chunk by chunk without materialising all logits.

Canonical signature: ``fused_linear_token_stats(hidden [..., H], weight [V, H], labels int64 [...],
temperature: float, chunk_size: int) -> (logprobs [...], entropy [...])``; an engine without a chunk size
ignores it. Reference: :func:`rlconform.reference.fused_linear_token_stats` (logits = hidden @ Wᵀ / τ
in float64, then the exact token statistics); gradients w.r.t. ``hidden`` and ``weight`` for random
upstream gradients of both outputs, against the closed forms (dL/dz @ W, (dL/dz)ᵀ @ hidden).

The op is bound as a callable or as an :class:`~rlconform.harness.core.contracts.Implementation` (its
contract: the ranks of ``hidden`` it takes, default 2 and 3; the output dtypes, per output name
``logprobs`` / ``entropy``, default the input's). Every case is presented in every declared rank; a
rank that raises or an output dtype off the contract is a problem of the case
(:mod:`rlconform.harness.core.impl_contract`). Rows are drawn around chunk boundaries (``CHUNK_SIZES``: small
sizes and 512, the default of verl's ``FusedLinearForPPO`` and the only value verl's models use).

Regimes: ``moderate`` (logit scale 0.1–10), ``peaked`` (logit scale 10–40: p near one-hot), in float32 and
float64 (see ``FUSED_DTYPES`` for why not in half precision yet).
"""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import strategies as st

import rlconform.reference as R
from rlconform.harness.core import faithful as F
from rlconform.harness.core import impl_contract as IC
from rlconform.harness.core import strategies as S
from rlconform.harness.core.contracts import Implementation
from rlconform.harness.core.evaluation import Compared, EngineCrash, Evaluation, call_engine, shape_problem
from rlconform.harness.core.failure import problem as problem_clause
from rlconform.harness.core.guards import InputGuard
from rlconform.harness.core.opinfo import (
    FINITE,
    MATCHES_REFERENCE,
    NON_DESTRUCTIVE,
    OpInfo,
    implementation_regimes,
    reference_function,
    split_regime,
)
from rlconform.harness.core.tensors import as_numpy, out_dtype, round_to, to_tensor
from rlconform.harness.families import OpFamily

NAME = "fused_linear_token_stats"
#: float32 and float64 only: in float16 / bfloat16 the logits are an intermediate that every implementation
#: rounds to the input dtype (verl twice: the product, then the division by τ), and one ulp of a logit moves
#: a log-prob by up to that ulp; the elementwise yardstick C·|faithful − ref| can vanish at an element by
#: chance, so half-precision cases need a tolerance for intermediate rounding first (left open).
FUSED_DTYPES = ("float32", "float64")
REGIMES = {"moderate": FUSED_DTYPES, "peaked": FUSED_DTYPES}
#: alternative implementations, checked under ``impl@data``; ``triton``: a fused Triton kernel
#: (verl's ``linear_cross_entropy``), bound with ``needs="cuda"``: ``unavailable: needs CUDA`` on a CPU run
IMPLEMENTATIONS = {"triton": "a fused Triton kernel of the same computation (verl utils/kernel linear_cross_entropy; "
                             "CUDA only)"}
#: chunk sizes drawn (rows one short of, at, one past one and two chunks); 512 = FusedLinearForPPO's default
CHUNK_SIZES = (1, 2, 3, 512)
HIDDEN_SIZES = (1, 3, 16)
VOCAB_SIZES = (1, 2, 5, 31, 64)
TEMPERATURES = (1.0, 0.7, 1.5)
OUTPUTS = ("logprobs", "entropy")

OPS = (
    OpInfo(NAME, "fused_linear", 5, (MATCHES_REFERENCE, NON_DESTRUCTIVE, FINITE),
           dict(REGIMES, **implementation_regimes(REGIMES, IMPLEMENTATIONS)),
           reference_function(NAME), reference_function(NAME + "_grad"), differentiable=True,
           source="z = hidden @ Wᵀ / τ in float64; log softmax(z)_y and H(softmax(z)); d_hidden = G @ W / τ, "
           "d_weight = Gᵀ @ hidden / τ with G = g_lp·(e_y − p) − g_H·p ⊙ (log p + H) (verl FusedLinearForPPO)",
           family="fused_linear", implementations=dict(IMPLEMENTATIONS)),
)


@st.composite
def _inputs(draw, dtype: str, regime: str):
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    chunk, rows = draw(IC.chunked_rows(CHUNK_SIZES))
    h_size = draw(st.sampled_from(HIDDEN_SIZES))
    vocab = draw(st.sampled_from(VOCAB_SIZES))
    scale = draw(st.floats(0.1, 10.0) if regime == "moderate" else st.floats(10.0, 40.0))
    hidden = rng.standard_normal((rows, h_size))
    weight = rng.standard_normal((vocab, h_size)) * scale / np.sqrt(h_size)
    return {"hidden": S.round_to(hidden, dtype), "weight": S.round_to(weight, dtype),
            "labels": rng.integers(0, vocab, size=rows).astype(np.int64),
            "temperature": draw(st.sampled_from(TEMPERATURES)), "chunk_size": chunk,
            "grad_logprobs": rng.uniform(-1.0, 1.0, rows), "grad_entropy": rng.uniform(-1.0, 1.0, rows)}


def strategy(op: OpInfo, dtype: str, regime: str):
    _, regime = split_regime(regime)
    if regime not in REGIMES:
        raise ValueError(f"unknown fused-linear regime {regime!r}")
    return _inputs(dtype, regime)


def _contract(binding, case=None) -> Implementation:
    """The implementation ``case`` checks: the one its ``impl@data`` regime names, else the op's own."""
    name = split_regime(case.regime)[0] if case is not None else None
    if name is not None:
        return binding.resolve_implementation(NAME, name)
    impl = binding.resolve(NAME)
    return impl if isinstance(impl, Implementation) else Implementation(impl)


def _args(inputs: dict, hidden: torch.Tensor, weight: torch.Tensor, batch: tuple) -> tuple:
    labels = torch.from_numpy(np.asarray(inputs["labels"]).reshape(batch))
    return hidden, weight, labels, float(inputs["temperature"]), int(inputs["chunk_size"])


def _backprop(lp, ent, g_lp, g_ent) -> None:
    """Σ g_lp·logprobs + Σ g_ent·entropy, backpropagated through the engine's graph."""
    ((lp.to(torch.float64) * g_lp).sum() + (ent.to(torch.float64) * g_ent).sum()).backward()


def _backward(out, leaves, g_lp, g_ent, ev: Evaluation, binding) -> bool:
    """Backpropagate Σ g_lp·logprobs + Σ g_ent·entropy; a missing graph or gradient is a problem."""
    if NAME in binding.forward_only:
        return False
    if not all(isinstance(o, torch.Tensor) and o.requires_grad for o in out):
        ev.problems.append(problem_clause("missing gradient", "gradient: an output has no autograd graph (requires_grad=False): no gradient reaches "
                           "the hidden states or the weight"))
        return False
    # the engine's backward is an engine call (recorded for the referee)
    call_engine(f"{NAME} backward", _backprop, out[0], out[1], g_lp, g_ent)
    missing = [name for name, leaf in zip(("hidden", "weight"), leaves) if leaf.grad is None]
    if missing:
        ev.problems.append(problem_clause("missing gradient", f"gradient: backward ran but no gradient reached {' and '.join(missing)}"))
        return False
    return True


def _faithful(inputs: dict, dtype: str):
    """Values (compute dtype) and gradients (input dtype) of the dtype-faithful path, flat rows."""
    h = to_tensor(inputs["hidden"], dtype).requires_grad_(True)
    w = to_tensor(inputs["weight"], dtype).requires_grad_(True)
    lp, ent = F.fused_linear_token_stats(h, w, torch.from_numpy(inputs["labels"]), float(inputs["temperature"]))
    ((lp.double() * torch.from_numpy(inputs["grad_logprobs"])).sum()
     + (ent.double() * torch.from_numpy(inputs["grad_entropy"])).sum()).backward()
    return lp.detach(), ent.detach(), h.grad, w.grad


def evaluate(binding, case) -> Evaluation:
    impl = _contract(binding, case)
    inputs = case.inputs
    n, h_size = inputs["hidden"].shape
    ev = Evaluation()
    if case.property == NON_DESTRUCTIVE:
        batch = IC.rank_shape(n, impl.checked_ranks()[0])
        h = to_tensor(inputs["hidden"].reshape(batch + (h_size,)), case.dtype).requires_grad_(True)
        w = to_tensor(inputs["weight"], case.dtype).requires_grad_(True)
        args = _args(inputs, h, w, batch)
        guard = InputGuard(hidden=h, weight=w, labels=args[2])
        out = call_engine(f"{NAME} forward", impl.fn, *args)
        ev.mutations += [m.clause() for m in guard.check("forward")]
        g = [torch.from_numpy(inputs[k].reshape(batch)) for k in ("grad_logprobs", "grad_entropy")]
        if _backward(out, (h, w), *g, ev, binding):
            ev.mutations += [m.clause() for m in guard.check("backward")]
        return ev
    temp = float(inputs["temperature"])
    ref = R.fused_linear_token_stats(inputs["hidden"], inputs["weight"], inputs["labels"], temp)
    ref_grad = R.fused_linear_token_stats_grad(inputs["hidden"], inputs["weight"], inputs["labels"], temp,
                                               inputs["grad_logprobs"], inputs["grad_entropy"])
    f_lp, f_ent, f_dh, f_dw = _faithful(inputs, case.dtype)
    crashes = []
    for rank in impl.checked_ranks():
        batch = IC.rank_shape(n, rank)
        h = to_tensor(inputs["hidden"].reshape(batch + (h_size,)), case.dtype).requires_grad_(True)
        w = to_tensor(inputs["weight"], case.dtype).requires_grad_(True)
        try:
            out = call_engine(f"{NAME} forward", impl.fn, *_args(inputs, h, w, batch))
        except EngineCrash as exc:
            crashes.append((rank, tuple(h.shape), exc))
            continue
        if not (isinstance(out, (tuple, list)) and len(out) == 2):
            ev.problems.append(problem_clause("missing output", f"value: the engine returned {type(out).__name__}, expected (logprobs, entropy)"))
            return ev
        bad = [shape_problem(f"{name} (rank {rank})", as_numpy(o), batch) for name, o in zip(OUTPUTS, out)]
        if any(bad):
            ev.problems += [b for b in bad if b]
            continue
        for name, o, r, f in zip(OUTPUTS, out, ref, (f_lp, f_ent)):
            odt = out_dtype(o, case.dtype)
            problem = IC.dtype_problem(f"{NAME}'s {name}", odt, case.dtype, impl, name)
            if problem and problem not in ev.problems:
                ev.problems.append(problem)
            ev.values.append(Compared(f"{name} (rank {rank})", as_numpy(o).reshape(-1), np.asarray(r, np.float64),
                                      as_numpy(round_to(f, odt)), odt, "token_stat"))
        g = [torch.from_numpy(inputs[k].reshape(batch)) for k in ("grad_logprobs", "grad_entropy")]
        if not _backward(out, (h, w), *g, ev, binding):
            continue
        for name, grad, r, f in (("d_hidden", h.grad, ref_grad[0], f_dh), ("d_weight", w.grad, ref_grad[1], f_dw)):
            gdt = out_dtype(grad, case.dtype)
            got = as_numpy(grad).reshape(np.shape(r)) if np.size(as_numpy(grad)) == np.size(r) else as_numpy(grad)
            problem = shape_problem(f"{name} (rank {rank})", got, np.shape(r))
            if problem:
                ev.problems.append(problem)
                continue
            ev.gradients.append(Compared(f"{name} (rank {rank})", got, r, as_numpy(round_to(f, gdt)), gdt,
                                         "token_stat"))
    IC.settle_crashes(crashes, impl, ev.problems)
    return ev


FAMILY = OpFamily("fused_linear", OPS, strategy, evaluate, order=12,
                  doc="log-probs and entropy from hidden states and the LM-head weight (fused linear, chunked) "
                  "and their gradients w.r.t. both")
