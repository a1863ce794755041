"""The real-engine bindings (verl, SkyRL, megatron-core) resolve, run with the canonical signatures,
and show the discrepancies docs/bug-kinds.md predicts for the released versions.

Needs the engines installed (``install/engines.sh .venv/bin/python all``); each engine's tests are
skipped, with the command to run, when it is not installed.
"""

from __future__ import annotations

import importlib.util
import math
import sys

import pytest
import torch

from rlconform.harness.catalog.binding import AggLoss, BatchInfo, MetricPipeline

pytestmark = [
    pytest.mark.engines,
    # the engines' own import-time notices (no Transformer Engine / Apex / absl on this machine)
    pytest.mark.filterwarnings("ignore::UserWarning:megatron.*"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning:megatron.*"),
    pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning"),
]


@pytest.fixture(scope="module", autouse=True)
def _release_process_group():
    """The Megatron binding (and the SkyRL all-reduce test) initialise a world-size-1 gloo group in
    this process; destroy it afterwards so other tests may initialise torch.distributed themselves."""
    yield
    from rlconform.harness.bindings.megatron import release_single_rank_group

    release_single_rank_group()


def _need(dist_name: str, module: str, engine: str):
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{dist_name} is not installed: run `install/engines.sh .venv/bin/python {engine}`")


@pytest.fixture(scope="module")
def verl():
    _need("verl 0.9.1", "verl", "verl")
    from rlconform.harness.bindings.verl import binding

    return binding


@pytest.fixture(scope="module")
def skyrl():
    _need("skyrl 0.4.0", "skyrl", "skyrl")
    from rlconform.harness.bindings.skyrl import binding

    return binding


@pytest.fixture(scope="module")
def megatron():
    _need("megatron-core 0.19.2", "megatron", "megatron")
    from rlconform.harness.bindings.megatron import binding

    return binding


def _logits(dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(2, 3, 7, generator=g) * 3).to(dtype)


def _labels():
    return torch.tensor([[0, 3, 6], [1, 2, 5]])


def _values_mask():
    g = torch.Generator().manual_seed(1)
    values = torch.randn(2, 4, generator=g)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    return values, mask


def _run_pipeline(mp: MetricPipeline, minis):
    """minis: list (mini-batches) of lists (DP ranks) of lists (micro-batches) of (values, mask)."""
    reduce_mini = mp.reduce_mini or mp.reduce_micro
    per_mini = []
    for ranks in minis:
        per_rank = [mp.reduce_micro([mp.emit(v, m) for v, m in micros]) for micros in ranks]
        per_mini.append(mp.reduce_dp(per_rank))
    return mp.finalize(reduce_mini(per_mini))


def _check_token_ops(binding):
    x, y = _logits(), _labels()
    for op in ("entropy", "sum_pi_squared", "logsumexp"):
        if op in binding.ops:
            out = binding.resolve(op)(x.clone())
            assert out.shape == (2, 3) and torch.isfinite(out).all(), op
    if "token_logprobs" in binding.ops:
        lp = binding.resolve("token_logprobs")(x.clone(), y)
        ref = torch.log_softmax(x.double(), -1).gather(-1, y.unsqueeze(-1)).squeeze(-1)
        torch.testing.assert_close(lp.double(), ref, rtol=1e-5, atol=1e-5)
    if "entropy" in binding.ops:
        p = torch.softmax(x.double(), -1)
        ref = -(p * torch.log_softmax(x.double(), -1)).sum(-1)
        torch.testing.assert_close(binding.resolve("entropy")(x.clone()).double(), ref, rtol=1e-5, atol=1e-5)


def _check_reductions(binding):
    values, mask = _values_mask()
    sel = values[mask.bool()].double()
    if "masked_sum" in binding.ops:
        assert math.isclose(float(binding.resolve("masked_sum")(values, mask)), float(sel.sum()), rel_tol=1e-6)
    if "masked_mean" in binding.ops:
        assert math.isclose(float(binding.resolve("masked_mean")(values, mask)), float(sel.mean()), rel_tol=1e-6)
    if "masked_var" in binding.ops:
        var = binding.resolve("masked_var")
        assert math.isclose(float(var(values, mask, True)), float(sel.var(unbiased=True)), rel_tol=1e-5)
        assert math.isclose(float(var(values, mask, False)), float(sel.var(unbiased=False)), rel_tol=1e-5)


def _check_agg_loss(binding):
    """Mean of micro-batch means: micro A 1 token at 1.0, micro B 3 tokens at 2.0 -> token-mean 7/4 (both engines
    normalise by the global token count, so they are right here), on 1 and 2 DP ranks."""
    agg = binding.resolve("agg_loss")
    assert isinstance(agg, AggLoss) and agg.micro_combine == "sum" and agg.dp_combine == "mean"
    a = (torch.tensor([[1.0, 0.0, 0.0]]), torch.tensor([[1, 0, 0]]))
    b = (torch.tensor([[2.0, 2.0, 2.0]]), torch.tensor([[1, 1, 1]]))
    one_rank = BatchInfo(dp_size=1, global_nnz=4, global_batch_size=2, global_nonempty_seqs=2, num_micro_batches=2)
    two_ranks = BatchInfo(dp_size=2, global_nnz=4, global_batch_size=2, global_nonempty_seqs=2, num_micro_batches=1)
    micro_sum = agg.loss(*a, "token-mean", one_rank) + agg.loss(*b, "token-mean", one_rank)
    dp_mean = (agg.loss(*a, "token-mean", two_ranks) + agg.loss(*b, "token-mean", two_ranks)) / 2
    assert math.isclose(float(micro_sum), 1.75, rel_tol=1e-6)
    assert math.isclose(float(dp_mean), 1.75, rel_tol=1e-6)
    for mode in agg.modes:
        assert torch.isfinite(agg.loss(*b, mode, one_rank))


# ----------------------------------------------------------------------------------------- verl
def test_verl_ops_resolve_and_run(verl):
    assert verl.version == "0.9.1"
    for op in verl.ops:
        verl.resolve(op)  # raises OpUnavailable / BindingError
    _check_token_ops(verl)
    _check_reductions(verl)
    _check_agg_loss(verl)
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    index = torch.tensor([0, 0, 1])
    logp = torch.full((3, 3), math.log(0.5))
    spi2 = torch.full((3, 3), 0.5)
    adv, ret = verl.resolve("optimal_token_baseline")(rewards, mask, index, logp, spi2)
    assert adv.shape == ret.shape == (3, 3)
    torch.testing.assert_close(adv[2], ret[2] * mask[2])  # a group of size 1 has no baseline


def test_verl_pg_clipfrac_is_mean_of_rank_means(verl):
    """Mean of ratios across DP ranks: rank 0 clips 3 of 12 tokens, rank 1 3 of 4 -> verl logs 0.5, not 6/16."""
    mp = verl.resolve("metric_pipeline")
    r0 = torch.tensor([[1.0] * 3 + [0.0] * 9])
    r1 = torch.tensor([[1.0] * 3 + [0.0]])
    final = _run_pipeline(mp, [[[(r0, torch.ones_like(r0))], [(r1, torch.ones_like(r1))]]])
    assert math.isclose(final["actor/pg_clipfrac"], 0.5)
    assert not math.isclose(final["actor/pg_clipfrac"], 6 / 16)


# ---------------------------------------------------------------------------------------- SkyRL
def test_skyrl_ops_resolve_and_run(skyrl):
    import typing

    assert skyrl.version == "0.4.0"
    for op in skyrl.ops:
        skyrl.resolve(op)
    assert typing.TypedDict.__module__ == "typing"  # the pydantic shim was undone
    _check_token_ops(skyrl)
    _check_reductions(skyrl)
    _check_agg_loss(skyrl)


@pytest.mark.parametrize("layout", ["two_dp_ranks", "two_micro_batches", "two_mini_batches"])
def test_skyrl_entropy_mean_of_means(skyrl, layout):
    """Mean of per-shard means: shard A 1 token of entropy 1.0, shard B 100 tokens of entropy 2.0. The
    released SkyRL logs the mean of the shards' means, 1.5; the token-weighted value is 201/101."""
    mp = skyrl.resolve("metric_pipeline")
    a = (torch.tensor([[1.0]]), torch.ones(1, 1))
    b = (torch.full((1, 100), 2.0), torch.ones(1, 100))
    minis = {
        "two_dp_ranks": [[[a], [b]]],
        "two_micro_batches": [[[a, b]]],
        "two_mini_batches": [[[a]], [[b]]],
    }[layout]
    final = _run_pipeline(mp, minis)
    reference = (1 * 1.0 + 100 * 2.0) / 101
    assert math.isclose(reference, 1.990099, rel_tol=1e-6)
    # every key the worker logs (the loss and its metrics too: the worker's own _forward_backward_micro runs)
    assert "policy/policy_entropy" in final and all(key.startswith("policy/") for key in final), final
    assert isinstance(final["policy/policy_entropy"], float)
    assert final["policy/policy_entropy"] == 1.5  # the released bug (“mean of per-shard means”)


def test_skyrl_real_all_reduce_on_cpu_group(skyrl):
    """SkyRL's own all_reduce_metrics over a real (world-size-1) gloo group, through the CUDA->CPU
    shim; min/max/sum routing by key name as in worker_utils."""
    from rlconform.harness.bindings.megatron import single_rank_group
    from rlconform.harness.bindings.skyrl import dp_all_reduce_metrics

    original = torch.cuda.current_device
    out = dp_all_reduce_metrics({"policy_entropy": 1.5, "a_max": 2.0, "a_min": -1.0, "policy_loss": 0.25},
                                group=single_rank_group())
    assert out == {"policy_entropy": 1.5, "a_max": 2.0, "a_min": -1.0, "policy_loss": 0.25}
    assert torch.cuda.current_device is original  # the shim is undone after the call


# ------------------------------------------------------------------------------------- Megatron
def test_megatron_ops_resolve_and_run(megatron):
    assert megatron.version == "0.19.2"
    for op in megatron.ops:
        megatron.resolve(op)
    assert "triton" not in sys.modules
    assert "megatron.core.transformer.moe.ops.paged_stash" not in sys.modules  # stand-in removed
    _check_token_ops(megatron)


def test_megatron_token_logprobs_mutates_fp32_logits_not_bf16(megatron):
    """Forward overwrites fp32 logits in place: fp32 logits [2, 0] become the softmax [0.8808, 0.1192] in place; bf16 is
    copied by .float() and stays [2, 0]. The value itself is right: log p_0 = -log(1 + e^-2)."""
    token_logprobs = megatron.resolve("token_logprobs")
    expected = -math.log1p(math.exp(-2.0))

    x32 = torch.tensor([[2.0, 0.0]])
    v0 = x32._version
    out = token_logprobs(x32, torch.tensor([0]))
    assert math.isclose(out.item(), expected, rel_tol=1e-6)
    assert out.dtype == torch.float32
    torch.testing.assert_close(x32, torch.tensor([[0.880797, 0.119203]]), rtol=0, atol=1e-6)
    assert x32._version > v0

    xbf = torch.tensor([[2.0, 0.0]], dtype=torch.bfloat16)
    vbf = xbf._version
    out = token_logprobs(xbf, torch.tensor([0]))
    assert math.isclose(out.item(), expected, rel_tol=1e-6)
    assert torch.equal(xbf, torch.tensor([[2.0, 0.0]], dtype=torch.bfloat16)) and xbf._version == vbf
