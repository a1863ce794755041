"""The token_stats family's faithful fp32 path in row chunks (issue 13, part 3): real-shape logits run
chunk by chunk, each chunk a view of the input, with the values and gradients of the one-shot path."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlconform.harness.families import token_stats as TS


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("op", ["logsumexp", "token_logprobs", "entropy", "sum_pi_squared"])
def test_chunked_faithful_equals_one_shot(monkeypatch, op, dtype):
    rng = np.random.default_rng(1)
    x = torch.from_numpy(rng.standard_normal((2, 9, 301)) * 4).to(dtype)
    x[1, 2, 7:40] = float("-inf")
    inputs = {"labels": rng.integers(0, 301, (2, 9))}
    go = torch.from_numpy(rng.standard_normal((2, 9)))
    before = x.clone()
    v0, g0 = TS.faithful(op, x, inputs, go)
    monkeypatch.setattr(TS, "FAITHFUL_CHUNK_ABOVE", 0)
    monkeypatch.setattr(TS, "FAITHFUL_CHUNK_BYTES", 4 * 301 * x.element_size())  # 4 rows per chunk
    v1, g1 = TS.faithful(op, x, inputs, go)
    assert torch.equal(x, before)
    assert v1.shape == (2, 9) and g1.shape == x.shape and v1.dtype == g1.dtype == dtype
    assert torch.equal(v0, v1) and torch.equal(g0, g1)
