"""Token statistics over the vocab: ``logsumexp``, ``token_logprobs``, ``entropy``, ``sum_pi_squared``.

Canonical signatures (torch in, torch out): ``logsumexp(logits [..., V]) -> [...]``,
``token_logprobs(logits [..., V], labels int64 [...]) -> [...]``, ``entropy(logits) -> [...]``,
``sum_pi_squared(logits) -> [...]`` (Σπ²), ``smoothed_token_logprobs(logits, labels, label_smoothing: float)
-> [...]`` (minus a label-smoothed cross-entropy, PyTorch's convention). Any float dtype in; a ``-inf`` logit is a legal masked vocab
entry (p = 0, 0·log 0 = 0). Gradients are compared with the closed forms of :mod:`rlconform.reference`
(d log p_y = e_y − p; dH = −p ⊙ (log p + H); dΣπ² = 2p ⊙ (p − Σπ²)) for a random ``grad_output``.

Regimes: ``moderate`` (scale 0.1–30), ``peaked``, ``near_uniform_offset`` (±1e4), ``neg_inf_padded``,
``fp16_extreme`` (near ±65504), ``bf16_coarse``; see :func:`rlconform.harness.core.strategies.logits`.
``real_shapes`` (``nightly`` profile only): ``[T, V]`` logits with V ∈ {151 936, 128 256}
(Qwen, Llama 3), T up to 4096, bf16 and fp32, a peaked head over a long Gaussian tail, described by a
seed (:class:`~rlconform.harness.core.generated.LogitsGen`) and materialised in the dtype under test when the
case runs; the reference and the faithful path read it back in row chunks (:func:`_evaluate_generated`).
The label-smoothed op has no ``real_shapes`` regime (the fused reference does not cover it).

Alternative implementations (:data:`IMPLEMENTATIONS`): ``entropy`` ``chunked`` (rows in
chunks of ``chunk_size``), ``token_logprobs`` ``naive`` (log_softmax then gather) and ``rowwise``
(x_y − logsumexp(x) one row at a time). Each is checked under ``impl@data`` regimes against the same
reference with the same properties, in every input rank its binding declares, with its declared output
dtype (:mod:`rlconform.harness.core.impl_contract`); a chunked one on row counts around its chunk boundaries.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from hypothesis import strategies as st

import rlconform.reference as R
from rlconform.harness.core import faithful as F
from rlconform.harness.core import impl_contract as IC
from rlconform.harness.core import strategies as S
from rlconform.harness.core import tape
from rlconform.harness.core.evaluation import Compared, EngineCrash, Evaluation, call_engine, shape_problem
from rlconform.harness.core.failure import mutation as mutation_clause
from rlconform.harness.core.failure import problem as problem_clause
from rlconform.harness.core.generated import LogitsGen
from rlconform.harness.core.guards import InputGuard, produce
from rlconform.harness.core.opinfo import (
    FINITE,
    FLOAT_DTYPES,
    MATCHES_REFERENCE,
    NON_DESTRUCTIVE,
    OpInfo,
    implementation_regimes,
    reference_function,
    split_regime,
)
from rlconform.harness.core.profiles import profile_regimes
from rlconform.harness.core.tensors import as_numpy, out_dtype, round_to, to_tensor
from rlconform.harness.core.tolerance import compare
from rlconform.harness.families import OpFamily

#: Logits regimes (see :func:`rlconform.harness.core.strategies.logits`), with the dtypes each applies to.
LOGITS_REGIMES = {
    "moderate": FLOAT_DTYPES,
    "peaked": FLOAT_DTYPES,
    "near_uniform_offset": FLOAT_DTYPES,
    "neg_inf_padded": FLOAT_DTYPES,
    "fp16_extreme": ("float16",),
    "bf16_coarse": ("bfloat16",),
}


#: label smoothing is smoothed over every vocab entry, so a ``-inf``-padded vocab is no input for it
SMOOTHED_REGIMES = {k: v for k, v in LOGITS_REGIMES.items() if k != "neg_inf_padded"}

#: the profile-only regime at real shapes (:data:`rlconform.harness.core.profiles.PROFILE_ONLY_REGIMES`)
REAL_SHAPES = "real_shapes"
REAL_SHAPES_DTYPES = ("bfloat16", "float32")
#: real vocab sizes: Qwen 2/2.5/3 (151 936), Llama 3 (128 256). Tests shrink these (monkeypatch) to run the
#: generator path in seconds; a real-size check never runs inside the self-tests.
REAL_VOCABS = (151936, 128256)
#: tokens per case (rows of logits); the first is the first, derandomized, example's
REAL_ROWS = (1024, 4096, 256, 1)
#: rows of one chunk of the reference/faithful pass over generated logits: ≤ this many bytes of float64
REAL_CHUNK_BYTES = 8 << 20
#: the label smoothing α drawn for the smoothed ops (PyTorch convention: α spread over all V classes)
LABEL_SMOOTHING = (0.1, 0.01, 0.5, 0.9)


#: alternative implementations the catalog knows, per op: name -> what it is
IMPLEMENTATIONS = {
    "entropy": {"chunked": "rows in chunks of chunk_size, each chunk's entropy written into an output buffer "
                           "(verl entropy_from_logits_with_chunking)"},
    "token_logprobs": {"naive": "log_softmax over the vocab, then gather the label (verl logprobs_from_logits_naive)",
                       "rowwise": "x_y − logsumexp(x), the logsumexp one row at a time (verl logprobs_from_logits_v2)"},
}
#: the implementations that take a chunk size (their cases are drawn around chunk boundaries)
CHUNKED = ("chunked",)


def _op(name: str, arity: int, source: str, regimes=None, parameters=None) -> OpInfo:
    regimes = regimes or dict(LOGITS_REGIMES, **{REAL_SHAPES: REAL_SHAPES_DTYPES})
    impls = IMPLEMENTATIONS.get(name, {})
    # the alternative implementations run on the regimes every profile has (not on real_shapes' generated logits)
    in_every_profile = {k: v for k, v in regimes.items() if k not in profile_regimes(regimes)}
    return OpInfo(name, "token_stat", arity, (MATCHES_REFERENCE, NON_DESTRUCTIVE, FINITE),
                  dict(regimes, **implementation_regimes(in_every_profile, impls)),
                  reference_function(name), reference_function(name + "_grad"), differentiable=True,
                  source=source, family="token_stats", implementations=dict(impls), parameters=parameters or {},
                  profile_regimes=profile_regimes(regimes))


OPS = (
    _op("logsumexp", 1, "log Σ_v exp(x_v), shifted by the row max"),
    _op("token_logprobs", 2, "log softmax(x)_y; d/dx = e_y − p"),
    _op("entropy", 1, "H = logsumexp(x) − Σ p x; dH = −p ⊙ (log p + H)"),
    _op("sum_pi_squared", 1, "Σπ² (verl PR #6153); dΣπ² = 2p ⊙ (p − Σπ²)"),
    _op("smoothed_token_logprobs", 3, "(1 − α)·log p_y + α·mean_v log p_v = −F.cross_entropy(label_smoothing=α) "
        "(Megatron vocab_parallel_cross_entropy with α·(V − 1)/V); d/dx = (1 − α)e_y + α/V − p",
        SMOOTHED_REGIMES, {"label_smoothing": LABEL_SMOOTHING}),
)


@st.composite
def real_logits(draw, vocabs=None, rows=None):
    """``{"logits": LogitsGen [T, V], "labels": int64 [T], "grad_output": float64 [T]}`` at real shapes.

    Labels are the row's top head token half of the time (a sampled response token), else uniform over V."""
    seed = draw(st.integers(0, 2**32 - 1))
    v = draw(st.sampled_from(vocabs or REAL_VOCABS))
    t = draw(st.sampled_from(rows or REAL_ROWS))
    gen = LogitsGen(seed, (t, v), peak=draw(st.floats(8.0, 30.0)), tail_scale=draw(st.floats(1.0, 4.0)),
                    decay=draw(st.sampled_from([0.5, 0.9, 0.2])), offset=draw(st.sampled_from([0.0, -15.0, 30.0])),
                    head_tokens=draw(st.integers(1, min(4, v))))
    rng = np.random.default_rng(seed ^ 0x5EED)
    labels = np.where(rng.random(t) < 0.5, gen.head()[:, 0], rng.integers(0, v, size=t)).astype(np.int64)
    return {"logits": gen, "labels": labels, "grad_output": rng.uniform(-1.0, 1.0, size=t)}


@st.composite
def _chunked_logits(draw, dtype: str, data: str):
    """Logits ``[rows, V]`` with rows around a chunk boundary, and the ``chunk_size``."""
    chunk, rows = draw(IC.chunked_rows())
    vocab = IC.LARGE_CHUNK_VOCAB if rows > 64 else S.VOCAB_SIZES
    d = draw(S.logits(dtype, data, with_labels=True, batch_shapes=[(rows,)], vocab_sizes=vocab))
    return dict(d, chunk_size=chunk)


def strategy(op: OpInfo, dtype: str, regime: str):
    impl, regime = split_regime(regime)
    if regime == REAL_SHAPES:
        return S.with_parameters(op, real_logits())
    logits = _chunked_logits(dtype, regime) if impl in CHUNKED else S.logits(dtype, regime, with_labels=True)
    return S.with_parameters(op, logits)


def engine_args(op: OpInfo, logits: torch.Tensor, inputs: dict) -> tuple:
    """The canonical positional arguments of ``op``: the logits, the labels for the token log-probs, then
    the op's scalar parameters (the label smoothing α of the smoothed log-probs)."""
    labels = (torch.from_numpy(np.asarray(inputs["labels"])).long(),) if op.name.endswith("token_logprobs") else ()
    return (logits, *labels, *op.parameter_values(inputs))


#: Logits with at least this many elements get their reference from the fused float64 pass
#: (:func:`rlconform.reference.token_stats`: one chunked pass, value and gradient together);
#: smaller ones (every CI case: V ≤ 4096, ≤ 6 rows) from the separate NumPy references, as before.
FUSED_REFERENCE_ABOVE = 1 << 20


def _reference(op: OpInfo, inputs: dict, logits64: np.ndarray, grad_out: np.ndarray | None):
    extra = (inputs["labels"],) if op.name.endswith("token_logprobs") else ()
    extra += op.parameter_values(inputs)
    if np.size(logits64) >= FUSED_REFERENCE_ABOVE and not op.parameters:  # the fused pass has no parameters
        grads = False if grad_out is None else (op.name,)
        out = R.token_stats(logits64, *extra, grads=grads, grad_output=grad_out)
        return out[op.name if grad_out is None else op.name + "_grad"]
    if grad_out is None:
        return op.reference(logits64, *extra)
    return op.reference_grad(logits64, *extra, grad_output=grad_out)


#: Inputs above this many bytes run the faithful path in row chunks (real shapes; CI inputs never do).
FAITHFUL_CHUNK_ABOVE = 64 << 20
#: A chunk is at most this many bytes of the input, and at most 1/32 of it: the fp32 path keeps about
#: 8 chunk-sized tensors alive (upcast, log-softmax, p, products, their gradients), and small chunks
#: also keep glibc's heap from holding on to freed chunk-sized blocks (with 32 MiB chunks a
#: [1024, 151936] fp32 entropy kept 0.48× the input; with 4 MiB 0.09×), so its extra memory stays well
#: under 25 % of the input (measured by benchmarks/bench_reference.py).
FAITHFUL_CHUNK_BYTES = 4 << 20


def faithful(op: OpInfo, x: torch.Tensor, inputs: dict, grad_out: torch.Tensor):
    """The fp32 path (:mod:`rlconform.harness.core.faithful`): value and gradient for ``grad_out``.

    x: logits ``[..., V]`` (any float dtype; never written); grad_out: float64 ``[...]``. Returns
    (value ``[...]``, gradient ``[..., V]``), both of x's dtype. Inputs over ``FAITHFUL_CHUNK_ABOVE`` bytes
    run in chunks of rows (each row's softmax is independent of the others), each chunk a leaf that
    views x, so that the extra memory is a few chunks rather than several copies of the logits.
    """
    if x.dim() < 2 or x.numel() * x.element_size() <= FAITHFUL_CHUNK_ABOVE:
        leaf = x.detach().clone().requires_grad_(True)
        out = getattr(F, op.name)(*engine_args(op, leaf, inputs))
        (out.to(torch.float64) * grad_out).sum().backward()
        return out.detach(), leaf.grad.detach()
    vocab = x.shape[-1]
    x2 = x.detach().reshape(-1, vocab)
    n = x2.shape[0]
    g2 = grad_out.reshape(-1)
    labels = np.asarray(inputs["labels"]).reshape(-1) if "labels" in inputs else None
    row_bytes = vocab * x.element_size()
    step = max(1, min(FAITHFUL_CHUNK_BYTES, x.numel() * x.element_size() // 32) // row_bytes)
    value = torch.empty(n, dtype=x.dtype)
    grad = torch.empty(n, vocab, dtype=x.dtype)
    for r0 in range(0, n, step):
        r1 = min(n, r0 + step)
        leaf = x2[r0:r1].detach().requires_grad_(True)  # a view of x: no copy
        chunk_inputs = inputs if labels is None else dict(inputs, labels=labels[r0:r1])
        out = getattr(F, op.name)(*engine_args(op, leaf, chunk_inputs))
        (out.to(torch.float64) * g2[r0:r1]).sum().backward()
        value[r0:r1] = out.detach()
        grad[r0:r1] = leaf.grad
        del leaf, out
    return value.reshape(x.shape[:-1]), grad.reshape(x.shape)


def _backprop(out: torch.Tensor, grad_out: torch.Tensor, *leaves: torch.Tensor) -> None:
    """Σ grad_out · out, backpropagated through the engine's graph (float64 upstream gradient); ``leaves``
    (unused) are where the gradient lands, named so that the referee's tape records their ``.grad``."""
    (out.to(torch.float64) * grad_out).sum().backward()


def backward(op: OpInfo, binding, out, leaf_or_none, grad_out: torch.Tensor, ev: Evaluation, *, saved_producer=False):
    """Backpropagate ``grad_out`` through an engine output when a gradient is part of the contract.

    A missing graph (``requires_grad`` False, not a tensor) or a gradient that never reaches the logits
    is a problem of ``ev`` (“gradient check skipped without a graph”: a detached entropy bonus silently stops training); only
    ``Binding(forward_only=...)`` switches gradients off. Returns whether backward ran.
    """
    if not op.differentiable or op.name in binding.forward_only:
        return False
    if not isinstance(out, torch.Tensor) or not out.requires_grad:
        ev.problems.append(problem_clause("missing gradient", 
            f"gradient: the engine's output has no autograd graph (requires_grad=False): no gradient reaches "
            f"the logits, so a loss built on it would not train; if no gradient is part of the engine's "
            f"contract, bind it with Binding(forward_only={{{op.name!r}}})"))
        return False
    try:  # the engine's backward is an engine call (recorded for the referee)
        call_engine(f"{op.name} backward", _backprop, out, grad_out,
                    *(() if leaf_or_none is None else (leaf_or_none,)))
    except EngineCrash as crash:
        exc = crash.__cause__
        if saved_producer and isinstance(exc, RuntimeError) and ("inplace" in str(exc) or "modified" in str(exc)):
            ev.mutations.append(mutation_clause(
                "logits", "backward", f"a producer that saved the logits for backward could not backprop: {exc}",
                evidence="saved"))
            return False
        raise
    if leaf_or_none is not None and leaf_or_none.grad is None:
        ev.problems.append(problem_clause("missing gradient", "gradient: backward ran but no gradient reached the logits (the graph is cut)"))
        return False
    return True


def _chunk_inputs(inputs: dict, r0: int, r1: int) -> dict:
    """The inputs of rows [r0, r1): the labels sliced, the scalar parameters kept."""
    return dict(inputs, labels=np.asarray(inputs["labels"])[r0:r1]) if "labels" in inputs else inputs


def _evaluate_generated(op: OpInfo, fn, binding, case) -> Evaluation:
    """A case whose logits are a :class:`LogitsGen` (``real_shapes``): the engine sees the whole tensor,
    materialised once in the dtype under test; the float64 reference (:func:`rlconform.reference.token_stats`)
    and the faithful path run over row chunks regenerated from the seed (never a float64 copy of the
    logits, never a second copy of the engine's input: an engine that wrote into its input cannot move the
    reference either). Values are compared whole ([T]); the gradient chunk by chunk, the chunk with the
    worst error / tolerance kept for the judgment (any failing element fails it). Under a referee all of it
    runs in the referee, the engine's calls in the engine's worker. Memory above the engine's own (benchmarks/bench_real_shape_memory.py): ≈ 0 for ``matches_reference`` (chunks of ≤ ``REAL_CHUNK_BYTES``
    float64 after the engine's graph is freed), 1× the logits for ``non_destructive`` (the producer's copy)."""
    gen = case.inputs["logits"]
    t, vocab = gen.shape
    grad_out64 = np.asarray(case.inputs["grad_output"], dtype=np.float64)
    ev = Evaluation()
    if case.property == NON_DESTRUCTIVE:
        leaf = gen.materialise(case.dtype).requires_grad_(True)
        logits = produce(leaf)
        args = engine_args(op, logits, case.inputs)
        guard = InputGuard(logits=logits, **({"labels": args[1]} if len(args) > 1 else {}))
        out = call_engine(f"{case.op} forward", fn, *args)
        ev.mutations += [m.clause() for m in guard.check("forward")]
        if backward(op, binding, out, leaf, torch.from_numpy(grad_out64), ev, saved_producer=True):
            ev.mutations += [m.clause() for m in guard.check("backward")]
        return ev

    leaf = gen.materialise(case.dtype).requires_grad_(True)
    out = call_engine(f"{case.op} forward", fn, *engine_args(op, leaf, case.inputs))
    tape.release(leaf)  # the referee's copy: the worker holds the engine's, and the reference regenerates rows
    value = as_numpy(out)
    problem = shape_problem("value", value, (t,), f"logits {[t, vocab]} -> one value per token")
    if problem:
        ev.problems.append(problem)
        return ev
    odt = out_dtype(out, case.dtype)
    grad = leaf.grad if backward(op, binding, out, leaf, torch.from_numpy(grad_out64), ev) else None
    del out, leaf  # the engine's graph and input: only its gradient stays
    if grad is not None:
        problem = shape_problem("gradient", grad, (t, vocab))
        if problem:
            ev.problems.append(problem)
            grad = None
    gdt = out_dtype(grad, case.dtype) if grad is not None else None
    ref_v, f_v = np.empty(t), np.empty(t)
    worst: tuple[float, Compared] | None = None
    step = max(1, REAL_CHUNK_BYTES // (8 * vocab))
    for r0 in range(0, t, step):
        r1 = min(t, r0 + step)
        xc = gen.rows(case.dtype, r0, r1)
        extra = _chunk_inputs(case.inputs, r0, r1)
        labels = (extra["labels"],) if op.name.endswith("token_logprobs") else ()
        stats = R.token_stats(xc, *labels, grads=(op.name,) if grad is not None else False,
                              grad_output=grad_out64[r0:r1])
        ref_v[r0:r1] = stats[op.name]
        f_out, f_grad = faithful(op, xc, extra, torch.from_numpy(grad_out64[r0:r1]))
        f_v[r0:r1] = as_numpy(round_to(f_out, odt))
        if grad is not None:
            c = Compared(f"gradient (rows {r0}:{r1} of {t}, the chunk of worst error / tolerance)",
                         as_numpy(grad[r0:r1]), stats[op.name + "_grad"], as_numpy(round_to(f_grad, gdt)), gdt,
                         "token_stat")
            ratio = compare(c.engine, c.reference, c.faithful, dtype=gdt, kind="token_stat").worst_ratio
            if worst is None or ratio > worst[0] or (math.isnan(ratio) and not math.isnan(worst[0])):
                worst = (ratio, c)
        del xc, stats, f_out, f_grad
    ev.values.append(Compared("value", value.reshape(t), ref_v, f_v, odt, "token_stat"))
    if worst is not None:
        ev.gradients.append(worst[1])
    return ev


def _flat_inputs(inputs: dict) -> dict:
    """``inputs`` with the logits as ``[N, V]`` and labels / grad_output as ``[N]``."""
    v = inputs["logits"].shape[-1]
    out = dict(inputs, logits=inputs["logits"].reshape(-1, v))
    for key in ("labels", "grad_output"):
        if key in inputs:
            out[key] = np.asarray(inputs[key]).reshape(-1)
    return out


def _shaped(inputs: dict, batch: tuple) -> dict:
    """Flat ``inputs`` (:func:`_flat_inputs`) presented with batch shape ``batch``."""
    v = inputs["logits"].shape[-1]
    out = dict(inputs, logits=inputs["logits"].reshape(batch + (v,)))
    for key in ("labels", "grad_output"):
        if key in inputs:
            out[key] = inputs[key].reshape(batch)
    return out


def _evaluate_implementation(op: OpInfo, binding, case, name: str) -> Evaluation:
    """An alternative implementation ``name`` of the op: the same data in every rank the
    implementation's contract allows, each answer (value, gradient) compared with the reference; an output
    dtype or a rank that breaks the contract is a problem."""
    impl = binding.resolve_implementation(case.op, name)
    kwargs = {impl.chunk_arg: int(case.inputs["chunk_size"])} if impl.chunk_arg else {}
    flat = _flat_inputs(case.inputs)
    if "grad_output" not in flat:
        flat["grad_output"] = np.ones(flat["logits"].shape[0])
    n = flat["logits"].shape[0]
    ev = Evaluation()
    where = f"{case.op}@{name} forward" + (f" ({impl.chunk_arg}={kwargs[impl.chunk_arg]})" if kwargs else "")
    if case.property == NON_DESTRUCTIVE:
        shaped = _shaped(flat, IC.rank_shape(n, impl.checked_ranks()[0]))
        leaf = to_tensor(shaped["logits"], case.dtype).clone().requires_grad_(True)
        logits = produce(leaf)
        args = engine_args(op, logits, shaped)
        guard = InputGuard(logits=logits, **({"labels": args[1]} if len(args) > 1 else {}))
        out = call_engine(where, impl.fn, *args, **kwargs)
        ev.mutations += [m.clause() for m in guard.check("forward")]
        if backward(op, binding, out, leaf, torch.from_numpy(shaped["grad_output"]), ev, saved_producer=True):
            ev.mutations += [m.clause() for m in guard.check("backward")]
        return ev
    ref = _reference(op, flat, flat["logits"], None)
    ref_grad = None
    f_out, f_grad = faithful(op, to_tensor(flat["logits"], case.dtype), flat, torch.from_numpy(flat["grad_output"]))
    crashes = []
    for rank in impl.checked_ranks():
        batch = IC.rank_shape(n, rank)
        shaped = _shaped(flat, batch)
        leaf = to_tensor(shaped["logits"], case.dtype).clone().requires_grad_(True)
        try:
            out = call_engine(where, impl.fn, *engine_args(op, leaf, shaped), **kwargs)
        except EngineCrash as exc:
            crashes.append((rank, shaped["logits"].shape, exc))
            continue
        label = f"value (rank {rank})"
        problem = shape_problem(label, as_numpy(out), batch, f"logits {tuple(shaped['logits'].shape)} -> one value "
                                "per token")
        if problem:
            ev.problems.append(problem)
            continue
        odt = out_dtype(out, case.dtype)
        problem = IC.dtype_problem(f"{case.op}@{name}'s output", odt, case.dtype, impl)
        if problem and problem not in ev.problems:  # the same dtype in every rank: said once
            ev.problems.append(problem)
        grad = leaf.grad if backward(op, binding, out, leaf, torch.from_numpy(shaped["grad_output"]), ev) else None
        ev.values.append(Compared(label, as_numpy(out).reshape(-1), np.asarray(ref, np.float64),
                                  as_numpy(round_to(f_out, odt)), odt, "token_stat"))
        if grad is not None:
            gdt = out_dtype(grad, case.dtype)
            if ref_grad is None:
                ref_grad = _reference(op, flat, flat["logits"], flat["grad_output"])
            problem = shape_problem(f"gradient (rank {rank})", as_numpy(grad), shaped["logits"].shape)
            if problem:
                ev.problems.append(problem)
            else:
                ev.gradients.append(Compared(f"gradient (rank {rank})", as_numpy(grad).reshape(n, -1), ref_grad,
                                             as_numpy(round_to(f_grad, gdt)), gdt, "token_stat"))
    IC.settle_crashes(crashes, impl, ev.problems)
    return ev


def evaluate(binding, case) -> Evaluation:
    op = next(o for o in OPS if o.name == case.op)
    name, _ = split_regime(case.regime)
    if name is not None:
        return _evaluate_implementation(op, binding, case, name)
    fn = binding.resolve(case.op)
    if isinstance(case.inputs["logits"], LogitsGen):
        return _evaluate_generated(op, fn, binding, case)
    logits64 = case.inputs["logits"]
    x = to_tensor(logits64, case.dtype)
    grad_out64 = case.inputs.get("grad_output")
    if grad_out64 is None:
        grad_out64 = np.ones(logits64.shape[:-1])
    grad_out = torch.from_numpy(grad_out64)
    ev = Evaluation()

    if case.property == NON_DESTRUCTIVE:
        leaf = x.clone().requires_grad_(True)
        logits = produce(leaf)
        args = engine_args(op, logits, case.inputs)
        guard = InputGuard(logits=logits, **({"labels": args[1]} if len(args) > 1 else {}))
        out = call_engine(f"{case.op} forward", fn, *args)
        ev.mutations += [m.clause() for m in guard.check("forward")]
        if backward(op, binding, out, leaf, grad_out, ev, saved_producer=True):
            ev.mutations += [m.clause() for m in guard.check("backward")]
        return ev

    ref = _reference(op, case.inputs, logits64, None)
    leaf = x.clone().requires_grad_(True)
    out = call_engine(f"{case.op} forward", fn, *engine_args(op, leaf, case.inputs))
    problem = shape_problem("value", as_numpy(out), np.shape(ref),
                            f"logits {tuple(logits64.shape)} -> one value per token")
    if problem:
        ev.problems.append(problem)
        return ev
    grad = leaf.grad if backward(op, binding, out, leaf, grad_out, ev) else None
    f_out, f_grad = faithful(op, x, case.inputs, grad_out)
    odt = out_dtype(out, case.dtype)
    ev.values.append(Compared("value", as_numpy(out).reshape(np.shape(ref)), np.asarray(ref, np.float64),
                              as_numpy(round_to(f_out, odt)), odt, "token_stat"))
    if grad is not None:
        gdt = out_dtype(grad, case.dtype)
        ref_grad = _reference(op, case.inputs, logits64, grad_out64)
        problem = shape_problem("gradient", as_numpy(grad), np.shape(ref_grad))
        if problem:
            ev.problems.append(problem)
        else:
            ev.gradients.append(Compared("gradient", as_numpy(grad), ref_grad, as_numpy(round_to(f_grad, gdt)),
                                         gdt, "token_stat"))
    return ev


FAMILY = OpFamily("token_stats", OPS, strategy, evaluate, order=10,
                  doc="softmax statistics over the vocab (logits [..., V] -> [...]) and their gradients")
