"""Memory at real size, at small size: the row-chunked float64 reference of a ``real_shapes``
case equals the unchunked one (≤ 1 ulp of float64), the digest guard that replaces a copy of large logits
still fails the mutants that write into their input, and a spilled tape tensor is read straight into its
tensor, then removed. The measurement at real size is
benchmarks/bench_real_shape_memory.py (benchmarks/results/real_shape_memory.json)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from rlconform.harness.bindings.load import load_engine
from rlconform.harness.core import guards as G
from rlconform.harness.core import tape as T
from rlconform.harness.core.generated import LogitsGen
from rlconform.harness.families import token_stats as TS
from rlconform.properties.case import Case
from rlconform.properties.checks import run_check

ROWS, VOCAB = 5, 1000


def _inputs(seed: int = 7) -> dict:
    gen = LogitsGen(seed, (ROWS, VOCAB), peak=20.0, tail_scale=2.0, decay=0.5, offset=-15.0, head_tokens=2)
    rng = np.random.default_rng(seed)
    return {"logits": gen, "labels": rng.integers(0, VOCAB, ROWS).astype(np.int64),
            "grad_output": rng.uniform(-1.0, 1.0, ROWS)}


def _ulps(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b) / np.spacing(np.maximum(np.abs(a), np.abs(b)))))


@pytest.mark.parametrize("op", ["entropy", "token_logprobs", "sum_pi_squared", "logsumexp"])
def test_row_chunked_reference_equals_unchunked(monkeypatch, op):
    """One row a chunk (the generated path) against the whole float64 logits at once (the stored path)."""
    ref = load_engine("reference", None)
    inputs = _inputs()
    info = next(o for o in TS.OPS if o.name == op)
    x64 = inputs["logits"].materialise("float32").double().numpy()
    monkeypatch.setattr(TS, "FUSED_REFERENCE_ABOVE", 0)  # the fused float64 pass, as at real size
    whole_v = TS._reference(info, inputs, x64, None)
    whole_g = TS._reference(info, inputs, x64, inputs["grad_output"])
    monkeypatch.setattr(TS, "REAL_CHUNK_BYTES", 8 * VOCAB)  # 1 row a chunk
    ev = TS._evaluate_generated(info, ref.resolve(op), ref, Case(op, "matches_reference", "float32",
                                                                 "real_shapes", inputs))
    (value,), (grad,) = ev.values, ev.gradients
    assert _ulps(value.reference, whole_v) <= 1.0
    row = int(grad.label.split("rows ")[1].split(":")[0])  # the chunk kept: the one of worst error / tolerance
    assert _ulps(grad.reference, whole_g[row:row + 1]) <= 1.0


@pytest.mark.parametrize("mutant,op", [("forward_inplace", "token_logprobs"), ("backward_sub_add", "entropy")])
def test_digest_guard_fails_the_mutants_that_write_their_input(monkeypatch, mutant, op):
    """Logits above EXACT_MAX_BYTES are guarded by SHA-256 block digests and ``_version`` (no copy): the
    forward (row 9) and backward (row 10) writers still fail ``non_destructive``; the reference passes."""
    monkeypatch.setattr(G, "EXACT_MAX_BYTES", 1024)  # [5, 1000] fp32 = 20 kB: digested
    monkeypatch.setattr(G, "BLOCK_BYTES", 4096)
    case = Case(op, "non_destructive", "float32", "real_shapes", _inputs())
    bad = run_check(load_engine(f"mutants.{mutant}", None), case)
    # the backward writer also breaks the producer that saved the logits (autograd's version check) first
    assert not bad.ok and ("SHA-256 digests" in bad.message or "could not backprop" in bad.message), bad.message
    good = run_check(load_engine("reference", None), case)
    assert good.ok, good.message


def test_digests_see_the_bits_a_backward_writer_does_not_restore(monkeypatch):
    """backward_sub_add on a plain leaf (no producer to trip): the digest guard finds changed blocks, not only
    a moved ``_version``; the reference's backward leaves every digest equal."""
    monkeypatch.setattr(G, "EXACT_MAX_BYTES", 1024)
    monkeypatch.setattr(G, "BLOCK_BYTES", 4096)
    for spec, changed in (("mutants.backward_sub_add", True), ("reference", False)):
        x = _inputs()["logits"].materialise("float32").requires_grad_(True)
        guard = G.InputGuard(logits=x)
        assert "logits" in guard._digests and "logits" not in guard._bits
        load_engine(spec, None).resolve("entropy")(x).sum().backward()
        found = guard.check("backward")
        assert bool(found and found[0].changed_blocks) == changed, (spec, [m.describe() for m in found])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_spilled_tensor_is_read_in_place_and_removed(monkeypatch, tmp_path, dtype):
    monkeypatch.setattr(T, "INLINE_MAX_BYTES", 16)
    x = torch.randn(7, 11).to(dtype)
    data = T.TensorData.of(x, str(tmp_path))
    path = data.spill
    assert path and os.path.getsize(path) == x.numel() * x.element_size()
    got = data.raw()
    assert got.dtype == dtype and torch.equal(got.view(torch.int16 if dtype == torch.bfloat16 else torch.int32),
                                              x.view(torch.int16 if dtype == torch.bfloat16 else torch.int32))
    assert not os.path.exists(path)  # read once, by the other side: a file left in /dev/shm is memory held


def test_refereed_real_shapes_case_is_judged_by_the_referee_alone(monkeypatch):
    """Under a referee the worker only makes the engine's calls the referee sends it (no float64
    reference, no faithful path: they are the referee's), and the verdicts stand:
    the referee, a fresh process, imports numpy.random for the generator and passes the reference engine,
    fails a wrong gradient in the last row (test_real_shapes' wrong engine)."""
    from rlconform.harness.bindings.reference import binding as reference
    from rlconform.harness.catalog.binding import Binding
    from rlconform.harness.run.dispatch import referee_judge
    from rlconform.harness.workers import referee as referee_process
    from rlconform.properties import referee

    def entropy(logits):
        h = reference.ops["entropy"](logits)
        bump = torch.zeros_like(h)
        bump[-1] = 1.0
        return h + bump * (logits[..., 0] - logits[..., 0].detach())

    wrong = Binding(name="wrong", ops=dict(reference.ops, entropy=entropy))
    calls = []
    fused = TS.R.token_stats
    monkeypatch.setattr(TS.R, "token_stats", lambda *a, **k: calls.append(1) or fused(*a, **k))
    case = Case("entropy", "matches_reference", "float32", "real_shapes", _inputs())
    ref = referee_process.start(referee_judge, referee.check_clean)
    try:
        referee.connect(ref.address, ref.authkey)
        good = run_check(load_engine("reference", None), case)
        bad = run_check(wrong, case)
    finally:
        referee.disconnect()
        ref.close()
    assert good.ok, good.message
    assert not bad.ok and "gradient (rows" in bad.message and "flat index 4000" in bad.message, bad.message  # row 4
    assert calls == []  # the worker's process never computed the fused float64 reference
