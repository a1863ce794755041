"""Megatron-core's binding binds a release whose ``vocab_parallel_cross_entropy`` takes no ``tp_group``
(0.14 - 0.18: it reads ``parallel_state``'s TP group), exercised on the installed 0.19 with the
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


def test_the_triton_module_is_read_from_the_installed_layout(tmp_path, monkeypatch):
    """0.19 imports triton from ``moe/ops/paged_stash.py``, 0.18 from ``moe/paged_stash.py`` itself: the
    stand-in is for the module of the installed layout, and 0.18's answers every name with a stand-in that
    raises when called."""
    import types

    from rlconform.harness.bindings import _compat

    moe = tmp_path / "megatron" / "core" / "transformer" / "moe"
    moe.mkdir(parents=True)
    (moe / "paged_stash.py").write_text("import torch\nimport triton\nimport triton.language as tl\n")
    real_find_spec = _compat.importlib.util.find_spec
    monkeypatch.setattr(_compat.importlib.util, "find_spec", lambda name, *a: types.SimpleNamespace(
        submodule_search_locations=[str(tmp_path / "megatron")]) if name == "megatron" else real_find_spec(name, *a))
    name, stand_in = _compat._triton_module_of_this_megatron()
    assert name == _compat.PAGED_STASH_MODULE_018
    mod = stand_in()
    assert mod.GLOBAL_BLOCK_SIZE == 1024
    with pytest.raises(RuntimeError, match="triton"):
        mod.paged_stash_reset()
    (moe / "ops").mkdir()
    (moe / "ops" / "paged_stash.py").write_text("import triton\n")
    assert _compat._triton_module_of_this_megatron()[0] == _compat.PAGED_STASH_MODULE
