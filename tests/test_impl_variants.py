"""Alternative implementations are checked as the op they implement: chunked / naive /
row-wise implementations under ``impl@data`` regimes with their contract (output dtype, input ranks, chunk
boundaries), the fused-linear op and its reference, the three chunked-entropy mutants, and verl 0.9.1's
implementations on small cases, with the defects found pinned as regression cases."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

from rlconform.harness.bindings.load import load_engine, validate_binding, variant_info
from rlconform.harness.catalog.binding import Binding, BindingError, Implementation
from rlconform.harness.catalog.ops import OPS
from rlconform.harness.core import impl_contract as IC
from rlconform.harness.core.opinfo import OpInfo, split_regime
from rlconform.harness.run.selection import selected_findings
from rlconform.properties.case import Case
from rlconform.properties.checks import run_check
from rlconform.reference import (
    entropy,
    fused_linear_token_stats,
    fused_linear_token_stats_grad,
    token_logprobs,
)

HAS_VERL = importlib.util.find_spec("verl") is not None
FUSED = "fused_linear_token_stats"


def logits_case(op, prop, dtype, regime, rows, vocab=7, chunk=None, seed=0, scale=3.0):
    rng = np.random.default_rng(seed)
    x = np.asarray(torch.tensor(rng.standard_normal((rows, vocab)) * scale).to(getattr(torch, dtype)).double())
    inputs = {"logits": x, "grad_output": rng.uniform(-1, 1, rows), "labels": rng.integers(0, vocab, rows)}
    if chunk is not None:
        inputs["chunk_size"] = chunk
    return Case(op, prop, dtype, regime, inputs)


def fused_case(prop, dtype, rows, h=4, vocab=9, chunk=2, temperature=1.0, seed=0, scale=2.0):
    rng = np.random.default_rng(seed)
    cast = lambda a: np.asarray(torch.tensor(a).to(getattr(torch, dtype)).double())  # noqa: E731
    return Case(FUSED, prop, dtype, "moderate", {
        "hidden": cast(rng.standard_normal((rows, h))), "weight": cast(rng.standard_normal((vocab, h)) * scale),
        "labels": rng.integers(0, vocab, rows), "temperature": temperature, "chunk_size": chunk,
        "grad_logprobs": rng.uniform(-1, 1, rows), "grad_entropy": rng.uniform(-1, 1, rows)})


# ------------------------------------------------------------------------------------------ catalog
def test_catalog_declares_implementation_regimes():
    assert OPS["entropy"].implementations.keys() == {"chunked"}
    assert OPS["token_logprobs"].implementations.keys() == {"naive", "rowwise"}
    for op in ("entropy", "token_logprobs"):
        info = OPS[op]
        plain = [r for r in info.regimes if split_regime(r)[0] is None and r not in info.profile_regimes]
        for impl in info.implementations:
            assert {f"{impl}@{r}" for r in plain} <= set(info.regimes)
            # a profile-only regime (real_shapes' generated logits) has no implementation form
            assert not {f"{impl}@{r}" for r in info.profile_regimes} & set(info.regimes)


def test_an_op_has_variants_or_implementations_not_both():
    with pytest.raises(ValueError, match="not both"):
        OpInfo("x", "k", 1, (), {}, len, variants=("a",), implementations={"b": ""})


def test_implementation_findings_are_selected_only_when_the_binding_has_them():
    ref = load_engine("reference")
    with_impls = selected_findings(ref.provided_ops(), ops=("entropy",), variants=variant_info(ref)[0])
    assert ("entropy", "matches_reference", "float64", "chunked@moderate") in with_impls
    bare = Binding("bare", ops={"entropy": ref.ops["entropy"]})
    without = selected_findings(bare.provided_ops(), ops=("entropy",), variants=variant_info(bare)[0])
    assert without and not any("@" in f[3] for f in without)


def test_malformed_implementations_are_binding_errors():
    ref = load_engine("reference")
    impl = Implementation(ref.implementations["entropy"]["chunked"].fn, chunk_arg="chunk_size")
    with pytest.raises(BindingError, match="no implementation"):
        validate_binding(Binding("b", ops={"entropy": ref.ops["entropy"]}, implementations={"entropy": {"fast": impl}}),
                         "test")
    with pytest.raises(BindingError, match="does not bind"):
        validate_binding(Binding("b", ops={}, implementations={"entropy": {"chunked": impl}}), "test")
    with pytest.raises(BindingError, match="ranks"):
        Implementation(len, ranks=())


def test_an_output_dtype_the_docstring_does_not_state_is_not_checked():
    """Regression: ``Implementation``'s default assumed the input's dtype, so verl's
    ``vocab_parallel_entropy@chunked`` (docstring: shapes only) was reported as breaking a contract it never
    stated. The default is now "not stated, not checked"; a stated one is still checked."""
    unstated = Implementation(len)
    assert unstated.out_dtype is None and unstated.expected_dtype("float64") is None
    assert IC.dtype_problem("out", "float32", "float64", unstated) is None
    assert "not checked" in unstated.dtype_note()
    stated = Implementation(len, out_dtype="input", doc="in the logits' dtype")
    problem = IC.dtype_problem("out", "float32", "float64", stated)
    assert problem.what == "wrong dtype"  # its numbers, compared beside it, decide the severity
    assert "the input's dtype (float64)" in problem.text and "in the logits' dtype" in problem.text
    several = Implementation(len, out_dtype={"logprobs": "float32"})
    assert IC.dtype_problem("lp", "float64", "float64", several, "logprobs")
    assert IC.dtype_problem("ent", "float32", "float64", several, "entropy") is None


def test_chunk_rows_and_rank_shapes():
    assert IC.rows_around(1) == [1, 2, 3]
    assert IC.rows_around(3) == [2, 3, 4, 5, 6, 7]
    assert 2048 in IC.CHUNK_SIZES and 4097 in IC.rows_around(2048)
    assert IC.rank_shape(6, 2) == (6,) and IC.rank_shape(6, 3) == (2, 3) and IC.rank_shape(7, 3) == (1, 7)


@pytest.mark.parametrize("chunk", [1, 2, 3, 2048])
def test_multi_chunk_rows_hold_more_than_one_chunk_in_every_presentation(chunk):
    """Regression: verl's vocab_parallel_entropy_with_chunking fails its backward whenever a sequence holds
    more than one chunk, and its cases shrank to one chunk; the rows drawn now hold two or more in both the
    rank-2 rows and the rank-3 sequences (which verl chunks), so a shrunk example keeps the effect."""
    for rows in IC.rows_past_one_chunk(chunk):
        assert rows > chunk and IC.rank_shape(rows, 3)[1] > chunk, (chunk, rows)


def test_the_engines_own_rank_is_checked_first():
    assert Implementation(len, ranks=(2, 3)).checked_ranks() == (2, 3)
    assert Implementation(len, ranks=(2, 3), called_rank=3).checked_ranks() == (3, 2)
    with pytest.raises(BindingError, match="called_rank"):
        Implementation(len, ranks=(2,), called_rank=3)


# ---------------------------------------------------------------------------- reference and mutants
@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16"])
@pytest.mark.parametrize("rows,chunk", [(1, 2), (3, 2), (4, 2), (5, 3), (4095, 2048)])
def test_reference_chunked_entropy_passes_around_chunk_boundaries(dtype, rows, chunk):
    ref = load_engine("reference")
    for prop in ("matches_reference", "non_destructive", "finite_where_reference_finite"):
        out = run_check(ref, logits_case("entropy", prop, dtype, "chunked@moderate", rows, vocab=3 if rows > 64 else 7,
                                         chunk=chunk))
        assert out.ok, out.message


@pytest.mark.parametrize("impl", ["naive", "rowwise"])
def test_reference_token_logprobs_implementations_pass(impl):
    ref = load_engine("reference")
    out = run_check(ref, logits_case("token_logprobs", "matches_reference", "float32", f"{impl}@moderate", 6))
    assert out.ok, out.message


def test_mutant_chunk_drops_tail_is_caught_one_row_past_a_boundary():
    mutant = load_engine("mutants.chunk_drops_tail")
    assert run_check(mutant, logits_case("entropy", "matches_reference", "float64", "chunked@moderate", 4,
                                         chunk=2)).ok  # a multiple of the chunk: right
    out = run_check(mutant, logits_case("entropy", "matches_reference", "float64", "chunked@moderate", 5, chunk=2))
    assert not out.ok and "value (rank 2)" in out.message


def test_mutant_chunk_fp32_entropy_breaks_the_dtype_contract():
    out = run_check(load_engine("mutants.chunk_fp32_entropy"),
                    logits_case("entropy", "matches_reference", "float64", "chunked@moderate", 4, chunk=2))
    assert not out.ok and "contract: entropy@chunked's output is float32 for a float64 input" in out.message


def test_mutant_chunk_2d_only_breaks_the_rank_contract():
    out = run_check(load_engine("mutants.chunk_2d_only"),
                    logits_case("entropy", "matches_reference", "float32", "chunked@moderate", 4, chunk=2))
    assert not out.ok and "contract: a rank-3 input (2, 2, 7)" in out.message


def test_mutant_fused_linear_last_chunk_grad_is_caught():
    mutant = load_engine("mutants.fused_linear_last_chunk_grad")
    assert run_check(mutant, fused_case("matches_reference", "float64", 4, chunk=2)).ok  # no short last chunk
    out = run_check(mutant, fused_case("matches_reference", "float64", 5, chunk=2))
    assert not out.ok and "d_weight" in out.message


# ------------------------------------------------------------------------------------- fused linear
def test_fused_linear_reference_is_token_stats_of_the_float64_logits():
    c = fused_case("matches_reference", "float64", 6, temperature=0.7).inputs
    z = c["hidden"] @ c["weight"].T / 0.7
    lp, ent = fused_linear_token_stats(c["hidden"], c["weight"], c["labels"], 0.7)
    np.testing.assert_array_equal(lp, token_logprobs(z, c["labels"]))
    np.testing.assert_array_equal(ent, entropy(z))


def test_fused_linear_reference_gradient_matches_autograd_in_float64():
    c = fused_case("matches_reference", "float64", 5, temperature=1.3).inputs
    h = torch.tensor(c["hidden"], requires_grad=True)
    w = torch.tensor(c["weight"], requires_grad=True)
    logp = torch.log_softmax(h @ w.T / 1.3, -1)
    lp = logp.gather(-1, torch.tensor(c["labels"]).unsqueeze(-1)).squeeze(-1)
    ent = -(logp.exp() * logp).sum(-1)
    ((lp * torch.tensor(c["grad_logprobs"])).sum() + (ent * torch.tensor(c["grad_entropy"])).sum()).backward()
    dh, dw = fused_linear_token_stats_grad(c["hidden"], c["weight"], c["labels"], 1.3, c["grad_logprobs"],
                                           c["grad_entropy"])
    np.testing.assert_allclose(dh, h.grad.numpy(), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(dw, w.grad.numpy(), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_reference_fused_linear_passes(dtype):
    ref = load_engine("reference")
    for rows in (1, 4, 5):
        for prop in ("matches_reference", "non_destructive"):
            out = run_check(ref, fused_case(prop, dtype, rows))
            assert out.ok, out.message


# --------------------------------------------------------------------------------------------- verl
verl_only = pytest.mark.skipif(not HAS_VERL, reason="verl not installed")


@pytest.mark.engines
@verl_only
def test_verl_implementations_are_bound_with_their_contracts():
    verl = load_engine("verl")
    chunked = verl.resolve_implementation("entropy", "chunked")
    # its docstring states shapes only ("Converts chunks to float32 ... during computation" is about
    # the computation): no output dtype is checked
    assert chunked.ranks == (2,) and chunked.out_dtype is None and chunked.chunk_arg == "chunk_size"
    # megatron/transformer_impl.py hands the vocab-parallel chunked entropy logits [1, nnz, V/tp]
    assert verl.resolve_implementation("vocab_parallel_entropy", "chunked").checked_ranks() == (3, 2)
    for op, impls in verl.implementations.items():
        for name, impl in impls.items():
            assert "not checked" in impl.doc or impl.out_dtype is not None, (op, name)
    assert set(verl.provided_implementations("token_logprobs")) == {"naive", "rowwise"}


@pytest.mark.engines
@verl_only
@pytest.mark.parametrize("rows,chunk", [(3, 2), (4, 2), (2049, 2048)])
def test_verl_chunked_entropy_matches_around_chunk_boundaries_in_float32(rows, chunk):
    out = run_check(load_engine("verl"), logits_case("entropy", "matches_reference", "float32", "chunked@moderate",
                                                     rows, vocab=3 if rows > 64 else 7, chunk=chunk))
    assert out.ok, out.message


@pytest.mark.engines
@verl_only
@pytest.mark.parametrize("impl", ["naive", "rowwise"])
def test_verl_token_logprobs_implementations_take_2d_and_3d_in_float64(impl):
    out = run_check(load_engine("verl"), logits_case("token_logprobs", "matches_reference", "float64", f"{impl}@moderate",
                                                     6))
    assert out.ok, out.message


@pytest.mark.engines
@verl_only
def test_verl_fused_linear_float64_entropy_has_float32_precision():
    """Regression (verl 0.9.1 FusedLinearForPPO): float64 hidden states give a float64-typed entropy computed
    from float32 logits (``logits.to(torch.float32)`` in ``_fused_linear_for_ppo_fwd``): here 3.142272472381592
    against the exact 3.142272251501452 (abs err 2.2e-7, about 5e8 float64 ulps)."""
    verl = load_engine("verl")
    rng = np.random.default_rng(0)
    hidden = np.array([[0.5], [-1.25], [2.0]])
    weight = np.linspace(-3.0, 3.0, 31)[:, None]
    labels = np.array([3, 17, 30])
    lp, ent = verl.resolve(FUSED).fn(torch.tensor(hidden), torch.tensor(weight), torch.tensor(labels), 1.0, 3)
    ref_lp, ref_ent = fused_linear_token_stats(hidden, weight, labels, 1.0)
    assert ent.dtype == torch.float64 and lp.dtype == torch.float32
    err = np.abs(ent.detach().numpy() - ref_ent)
    assert err.max() > 1e-9, err  # float32 precision (≈1e-7), not float64 (≈1e-15)
    assert err.max() < 1e-5
    out = run_check(verl, fused_case("matches_reference", "float64", 3, chunk=2, seed=int(rng.integers(100))))
    assert not out.ok and "entropy (rank 2)" in out.message


@pytest.mark.engines
def test_skyrl_and_megatron_declare_their_implementations():
    assert load_engine("reference").provided_implementations("vocab_parallel_token_logprobs") == ("fused",)
    if importlib.util.find_spec("skyrl") is not None:
        skyrl = load_engine("skyrl")
        assert skyrl.provided_implementations("token_logprobs") == ("rowwise",)
        validate_binding(skyrl, "test")
    if importlib.util.find_spec("megatron") is not None:
        megatron = load_engine("megatron")
        fused = megatron.implementations["vocab_parallel_token_logprobs"]["fused"]
        assert fused.ranks == (3,) and fused.out_dtype is None  # its docstring states no dtype: not checked
        validate_binding(megatron, "test")
