"""The token_stats family at real shapes: the faithful fp32 path runs in row chunks (each a
view of the input) with the values and gradients of the one-shot path, and large logits get their
reference from the fused float64 pass, equal to the separate references to within their bounds."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlconform.harness.families import token_stats as TS


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("op", TS.OPS, ids=lambda o: o.name)
def test_chunked_faithful_equals_one_shot(monkeypatch, op, dtype):
    """Every op of the family, its scalar parameters (the label smoothing α) included in each chunk."""
    rng = np.random.default_rng(1)
    x = torch.from_numpy(rng.standard_normal((2, 9, 301)) * 4).to(dtype)
    if not op.parameters:  # label smoothing averages over every vocab entry: no -inf vocab for it
        x[1, 2, 7:40] = float("-inf")
    inputs = {"labels": rng.integers(0, 301, (2, 9)), **{k: v[0] for k, v in op.parameters.items()}}
    go = torch.from_numpy(rng.standard_normal((2, 9)))
    before = x.clone()
    v0, g0 = TS.faithful(op, x, inputs, go)
    monkeypatch.setattr(TS, "FAITHFUL_CHUNK_ABOVE", 0)
    monkeypatch.setattr(TS, "FAITHFUL_CHUNK_BYTES", 4 * 301 * x.element_size())  # 4 rows per chunk
    v1, g1 = TS.faithful(op, x, inputs, go)
    assert torch.equal(x, before)
    assert v1.shape == (2, 9) and g1.shape == x.shape and v1.dtype == g1.dtype == dtype
    assert torch.equal(v0, v1) and torch.equal(g0, g1)


#: the four statistics the fused pass computes (the label-smoothed log-probs keep their own reference)
FUSED_OPS = [o for o in TS.OPS if o.name in ("logsumexp", "token_logprobs", "entropy", "sum_pi_squared")]


def test_fused_ops_are_the_four_statistics():
    assert len(FUSED_OPS) == 4


@pytest.mark.parametrize("op", FUSED_OPS, ids=lambda o: o.name)
def test_fused_reference_above_the_threshold(monkeypatch, op):
    rng = np.random.default_rng(2)
    logits = rng.standard_normal((3, 2, 500)) * 7
    logits[0, 1, 250:] = -np.inf
    inputs = {"labels": rng.integers(0, 250, (3, 2))}
    go = rng.uniform(-1, 1, (3, 2))
    separate = (TS._reference(op, inputs, logits, None), TS._reference(op, inputs, logits, go))
    monkeypatch.setattr(TS, "FUSED_REFERENCE_ABOVE", 0)
    fused = (TS._reference(op, inputs, logits, None), TS._reference(op, inputs, logits, go))
    np.testing.assert_allclose(fused[0], separate[0], rtol=2**-49, atol=0)
    assert fused[1].shape == separate[1].shape
    np.testing.assert_allclose(fused[1], separate[1], rtol=0, atol=2**-45)
