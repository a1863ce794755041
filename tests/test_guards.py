"""The bitwise input guard (harness/core/guards.py): exact snapshots for small tensors, block digests for large
ones (real-shape logits must not double the memory)."""

from __future__ import annotations

import pytest
import torch

from rlconform.harness.core import guards as G


@pytest.fixture(params=["exact", "digests"])
def mode(request, monkeypatch):
    if request.param == "digests":  # every tensor over 64 bytes is digested, in blocks of 16 bytes
        monkeypatch.setattr(G, "EXACT_MAX_BYTES", 64)
        monkeypatch.setattr(G, "BLOCK_BYTES", 16)
    return request.param


def test_untouched_inputs_pass(mode):
    x = torch.randn(7, 33)
    x[0, 0] = float("nan")
    lab = torch.arange(7)
    guard = G.InputGuard(logits=x, labels=lab, not_a_tensor=3)
    assert guard.check("forward") == [] and guard.check("backward") == []


def test_a_single_bit_is_found(mode):
    x = torch.randn(7, 33)
    guard = G.InputGuard(logits=x)
    bits = x.view(torch.int32)
    bits.data[3, 5] ^= 1  # one ulp, through .data: the version counter stays
    (m,) = guard.check("forward")
    assert m.bits_changed and m.name == "logits" and m.stage == "forward" and m.version_after == m.version_before
    if mode == "exact":
        assert m.changed_elements == 1 and m.sample[0][0] == 3 * 33 + 5
        assert m.sample[0][1] != m.sample[0][2]
        assert "1 element(s) changed" in m.describe()
    else:
        assert m.changed_blocks == 1 and m.block_elements == 4 and m.changed_elements == -1
        assert m.sample[0][0] == (3 * 33 + 5) // 4 * 4
        assert "1 block(s) of 4 elements changed" in m.describe()


def test_signed_zero_and_version_counter(mode):
    x = torch.zeros(40)
    guard = G.InputGuard(v=x)
    x.mul_(-1.0)  # -0.0: equal as numbers, different bits; bumps _version
    (m,) = guard.check("backward")
    assert m.bits_changed and m.version_after == m.version_before + 1
    y = torch.ones(40)
    guard = G.InputGuard(v=y)
    y.add_(0.0)  # same bits, new version
    (m,) = guard.check("forward")
    assert not m.bits_changed and "_version" in m.describe()


def test_large_tensors_are_digested_not_copied(monkeypatch):
    monkeypatch.setattr(G, "EXACT_MAX_BYTES", 1 << 10)
    x = torch.randn(64, 100)  # 25.6 kB > 1 kB
    guard = G.InputGuard(logits=x)
    assert "logits" not in guard._bits and len(guard._digests["logits"][0]) == 1
    x[63, 99] = 1e30
    (m,) = guard.check("forward")
    assert m.changed_blocks == 1 and m.sample


def test_a_change_becomes_a_mutation_clause_with_its_fields():
    """A guard's change reaches the failure record as fields — the tensor, the pass (and another op's), the
    version change and one changed element — so a reader never parses the sentence."""
    import torch

    from rlconform.harness.core.failure import Clause
    from rlconform.harness.core.guards import InputGuard

    x = torch.tensor([1.0, 2.0, 3.0])
    guard = InputGuard(logits=x)
    x.mul_(2.0)
    (own,) = guard.check("forward")
    c = own.clause()
    assert (c.kind, c.label, c.phase, c.by_op, c.evidence) == ("mutation", "logits", "forward", "", "changed")
    assert (c.versions, c.changed, c.index, c.other, c.engine) == ([0, 1], 3, 0, 1.0, 2.0)
    assert Clause.from_json(c.to_json()) == c  # report.json carries it
    guard = InputGuard(logits=x)
    x.add_(1.0)
    (other,) = guard.check("vocab_parallel_entropy backward")
    assert (other.clause().phase, other.clause().by_op) == ("backward", "vocab_parallel_entropy")
    assert other.record()["sentence"].startswith("input 'logits' mutated during vocab_parallel_entropy backward")
