"""Megatron-core 0.19.2 ``fusions.fused_cross_entropy.fused_vocab_parallel_cross_entropy`` (bound as
``vocab_parallel_token_logprobs@fused``): its backward ends with
``grad_input = grad_input.to(torch.bfloat16)`` whatever the logits' dtype, so float32 (and float64) logits get a
gradient rounded to bfloat16 (8 mantissa bits). Pinned with its numbers on a single-rank gloo group."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

from rlconform.reference import token_logprobs, token_logprobs_grad

pytestmark = pytest.mark.skipif(importlib.util.find_spec("megatron") is None, reason="megatron-core not installed")


@pytest.mark.engines
def test_fused_cross_entropy_rounds_a_float32_gradient_to_bfloat16():
    from rlconform.harness.bindings.megatron import _fused_vocab_parallel_token_logprobs, single_rank_group

    fn = _fused_vocab_parallel_token_logprobs()
    x = torch.tensor([[[0.1, -1.3, 2.2, 0.7]], [[1.0, 0.0, -0.5, 3.0]]], dtype=torch.float32)  # [s=2, b=1, V=4]
    y = torch.tensor([[2], [0]])
    leaf = x.clone().requires_grad_(True)
    out = fn(leaf, y, single_rank_group())
    out.sum().backward()
    # the value is right to float32 rounding ...
    np.testing.assert_allclose(out.detach().numpy(), token_logprobs(x.double().numpy(), y.numpy()), rtol=1e-6)
    # ... the gradient is float32-typed but every element is a bfloat16 number
    g = leaf.grad
    assert g.dtype == torch.float32 and torch.equal(g, g.to(torch.bfloat16).to(torch.float32))
    assert g.flatten().tolist() == [-0.0888671875, -0.02197265625, 0.2734375, -0.162109375, 0.88671875,
                                    -0.041015625, -0.02490234375, -0.82421875]
    ref = token_logprobs_grad(x.double().numpy(), y.numpy())
    np.testing.assert_allclose(ref.flatten()[[4, 7]], [0.8886422401150024, -0.8228287348414961], rtol=1e-14)
    assert 1.9e-3 < np.abs(g.numpy() - ref).max() < 2.0e-3  # float32 would be ~1e-7
