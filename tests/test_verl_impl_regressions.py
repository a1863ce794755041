"""verl 0.9.1's alternative implementations: the defects the implementation regimes found,
pinned with their numbers. Each test states what verl does today; a fix makes it fail, and the pin is then
replaced by the passing check."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

from rlconform.harness.bindings.load import load_engine
from rlconform.properties.case import Case
from rlconform.reference import entropy, fused_linear_token_stats

pytestmark = pytest.mark.skipif(importlib.util.find_spec("verl") is None, reason="verl not installed")


@pytest.fixture(scope="module", autouse=True)
def _no_worker_outlives_the_module():
    yield
    from rlconform.harness.workers.pool import close_all_pools

    close_all_pools()


@pytest.mark.engines
def test_entropy_from_logits_with_chunking_computes_float64_in_float32():
    """Documented ('Converts chunks to float32'), and costly for float64 callers: logits [1e4, 1e4] give
    0.693359375 instead of ln 2 = 0.6931471805599453 (abs err 2.1e-4, the float32 ulp of 1e4 through
    logsumexp(x) − Σ p·x); the result is float32 for a float64 input."""
    import verl.utils.torch_functional as vf

    x = torch.tensor([[1e4, 1e4], [1e4, 1e4 + 1.0]], dtype=torch.float64)
    got = vf.entropy_from_logits_with_chunking(x, chunk_size=2)
    assert got.dtype == torch.float32
    assert got.tolist() == [0.693359375, 0.58203125]
    np.testing.assert_allclose(entropy(x.numpy()), [0.6931471805599453, 0.582203108888218], rtol=1e-15)


@pytest.mark.engines
def test_fused_linear_for_ppo_float64_entropy_has_float32_precision():
    """FusedLinearForPPO with float64 hidden states and weight: the entropy is float64-typed but computed from
    float32 logits (``logits.to(torch.float32)``): [3.1106655597686768, 2.3851242065429688, 1.9228754043579102]
    against the exact [3.110665647422206, 2.385123936918778, 1.9228756549693211] (max abs err 2.7e-7, ~1e9
    float64 ulps); the log-probs are float32 (as its code comment says)."""
    verl = load_engine("verl")
    hidden = np.array([[0.5], [-1.25], [2.0]])
    weight = np.linspace(-3.0, 3.0, 31)[:, None]
    labels = np.array([3, 17, 30])
    lp, ent = verl.resolve("fused_linear_token_stats").fn(torch.tensor(hidden), torch.tensor(weight),
                                                        torch.tensor(labels), 1.0, 3)
    ref_lp, ref_ent = fused_linear_token_stats(hidden, weight, labels, 1.0)
    assert ent.dtype == torch.float64 and lp.dtype == torch.float32
    assert ent.tolist() == [3.1106655597686768, 2.3851242065429688, 1.9228754043579102]
    np.testing.assert_allclose(ref_ent, [3.110665647422206, 2.385123936918778, 1.9228756549693211], rtol=1e-15)
    assert 2e-7 < np.abs(ent.detach().numpy() - ref_ent).max() < 3e-7


def test_vocab_parallel_entropy_with_chunking_rejects_the_2d_input_its_docstring_allows():
    """Docstring: '(batch_size, seq_len, vocab_size // tp_size) or (total_nnz, vocab_size // tp_size)'; the loop
    indexes ``[:, i : i + chunk_size, :]``, so a 2-D input raises before any collective."""
    from rlconform.harness.bindings._compat import import_megatron

    fn = import_megatron("verl.utils.megatron.tensor_parallel").vocab_parallel_entropy_with_chunking
    with pytest.raises(IndexError, match="too many indices"):
        fn(torch.zeros(5, 6), chunk_size=2)


def _vp_case(prop, dtype, rows, chunk, v=6, seed=0):
    rng = np.random.default_rng(seed)
    x = np.asarray(torch.tensor(rng.standard_normal((rows, v)) * 3).to(getattr(torch, dtype)).double())
    return Case("vocab_parallel_entropy", prop, dtype, "chunked@tp2_moderate",
                {"logits": x, "grad_output": rng.uniform(-1, 1, rows), "vocab": v, "chunk_size": chunk})


@pytest.mark.engines
def test_vocab_parallel_entropy_with_chunking_on_tp2_ranks():
    """On 2 gloo TP ranks (parallel_state initialised), with the 3-D input it takes: (a) one chunk, float64 in:
    float32 out (``torch.zeros(output_shape)``; its docstring documents no dtype, so that is no contract breach) and the 2-D rank refused;
    (b) two chunks: the backward raises 'modified by an inplace operation': ``_VocabParallelEntropy.backward``
    does ``sub_``/``add_`` on its saved logits chunk, a view of the caller's tensor, which bumps the version
    the next chunk's saved view checks. verl's Megatron engine calls it with entropy_from_logits_chunk_size
    (2048) on [1, total_nnz, V/tp] logits: any micro-batch over 2048 tokens with an entropy term in the loss."""
    from rlconform.harness.core.evaluation import EngineCrash
    from rlconform.harness.run.dispatch import run_check

    verl = load_engine("verl")
    one_chunk = run_check(verl, _vp_case("matches_reference", "float64", 3, 4))
    assert not one_chunk.ok
    assert "contract: vocab_parallel_entropy@chunked's output is" not in one_chunk.message
    assert "contract: a rank-2 input (3, 6)" in one_chunk.message and "IndexError" in one_chunk.message
    with pytest.raises(EngineCrash, match="modified by an inplace operation"):
        run_check(verl, _vp_case("matches_reference", "float32", 5, 2))
