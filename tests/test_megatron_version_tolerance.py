"""Megatron-core's binding binds a release whose ``vocab_parallel_cross_entropy`` takes no ``tp_group``
(0.14 - 0.18: it reads ``parallel_state``'s TP group; issue 23 §2), exercised on the installed 0.19 with the
older signature put in place, so CI needs no old release: the adapters set ``parallel_state``'s TP group to
the group the 0.19 binding passes, for the call only, and compute what 0.19 computes."""

from __future__ import annotations

import importlib.util

import pytest
import torch

pytestmark = [pytest.mark.engines]


@pytest.fixture
def mb():
    if importlib.util.find_spec("megatron") is None:
        pytest.skip("megatron-core is not installed: run `install/engines.sh .venv/bin/python megatron`")
    from rlconform.harness.bindings import megatron as mb

    yield mb
    mb.release_single_rank_group()


def _inputs():
    torch.manual_seed(0)
    return torch.randn(3, 2, 7, dtype=torch.float64).float(), torch.randint(0, 7, (3, 2))


def test_a_release_without_tp_group_reads_parallel_state_set_to_that_group(mb, monkeypatch):
    tp = mb.import_megatron(mb.TP)
    ps = mb.import_megatron("megatron.core.parallel_state")
    real = tp.vocab_parallel_cross_entropy
    assert mb._takes_tp_group(real)
    seen = []

    def old(vocab_parallel_logits, target, label_smoothing=0.0):  # megatron-core 0.18's signature
        seen.append(ps.get_tensor_model_parallel_group())
        return real(vocab_parallel_logits, target, label_smoothing, tp_group=ps.get_tensor_model_parallel_group())

    logits, labels = _inputs()
    want = -real(logits.clone(), labels, 0.0, tp_group=mb.single_rank_group())
    want_smoothed = -real(logits.clone(), labels, mb.megatron_smoothing(0.1, 7), tp_group=mb.single_rank_group())
    before = {name: getattr(ps, name) for name in mb._PS_TP}
    monkeypatch.setattr(tp, "vocab_parallel_cross_entropy", old)
    assert not mb._takes_tp_group(old)
    got = mb.binding.ops["token_logprobs"].load()(logits.clone(), labels)
    got_smoothed = mb.binding.ops["smoothed_token_logprobs"].load()(logits.clone(), labels, 0.1)
    assert torch.equal(got, want) and torch.equal(got_smoothed, want_smoothed)
    assert seen == [mb.single_rank_group()] * 2  # the group 0.19 gets as tp_group
    assert {name: getattr(ps, name) for name in mb._PS_TP} == before  # restored after the call


def test_parallel_state_is_restored_when_the_call_raises(mb):
    ps = mb.import_megatron("megatron.core.parallel_state")
    before = {name: getattr(ps, name) for name in mb._PS_TP}
    with pytest.raises(RuntimeError):
        with mb.parallel_state_tp_group(mb.single_rank_group()):
            assert ps.get_tensor_model_parallel_group() is mb.single_rank_group()
            assert ps.get_tensor_model_parallel_world_size() == 1 and ps.get_tensor_model_parallel_rank() == 0
            raise RuntimeError("engine failed")
    assert {name: getattr(ps, name) for name in mb._PS_TP} == before
