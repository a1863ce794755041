"""Label smoothing: the float64 reference against mpmath and PyTorch's
``F.cross_entropy(label_smoothing=α)``, the reference engine on one device and over TP vocab shards, the
two mutants, and the Megatron-core 0.19.2 faults pinned as regression cases (per-shard smoothing under
TP; −inf from log of an underflowed softmax)."""

from __future__ import annotations

import importlib.util

import mpmath
import numpy as np
import pytest
import torch

from rlconform.harness.bindings.load import load_engine
from rlconform.properties.case import Case
from rlconform.reference import smoothed_token_logprobs, smoothed_token_logprobs_grad


@pytest.fixture(scope="module", autouse=True)
def _no_worker_outlives_the_module():
    """The session's gloo pool is closed after this module: its ranks must not outlive it into other
    tests of the same xdist worker (tests/test_robustness_interrupt.py counts this process's children)."""
    yield
    from rlconform.harness.workers.pool import close_all_pools

    close_all_pools()


def exact(row, label, alpha):
    mpmath.mp.dps = 50
    r = [mpmath.mpf(float(v)) for v in row]
    lse = mpmath.log(mpmath.fsum(mpmath.exp(v) for v in r))
    logp = [v - lse for v in r]
    return (1 - mpmath.mpf(alpha)) * logp[label] + mpmath.mpf(alpha) * mpmath.fsum(logp) / len(r)


@pytest.mark.parametrize("offset", [0.0, 1e4, -1e4])
@pytest.mark.parametrize("scale", [1e-3, 1.0, 30.0])
def test_reference_within_a_few_ulps_of_mpmath(offset, scale):
    rng = np.random.default_rng(abs(int(scale * 7 + offset)))
    for _ in range(20):
        v = int(rng.integers(2, 40))
        x = offset + rng.standard_normal((1, v)) * scale
        label, alpha = int(rng.integers(0, v)), float(rng.choice([0.01, 0.1, 0.5, 0.9]))
        want = exact(x[0], label, alpha)
        got = smoothed_token_logprobs(x, np.array([label]), alpha)[0]
        assert abs(float((mpmath.mpf(got) - want) / want)) < 8 * 2.0**-53, (x, label, alpha)


def test_reference_is_pytorchs_convention_value_and_gradient():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 9)) * 5
    y = np.array([0, 3, 8, 2])
    for alpha in (0.0, 0.1, 0.7):
        t = torch.tensor(x, requires_grad=True)
        torch_value = -torch.nn.functional.cross_entropy(t, torch.tensor(y), label_smoothing=alpha, reduction="none")
        g = rng.standard_normal(4)
        (torch_value * torch.tensor(g)).sum().backward()
        np.testing.assert_allclose(smoothed_token_logprobs(x, y, alpha), torch_value.detach().numpy(), rtol=1e-13)
        np.testing.assert_allclose(smoothed_token_logprobs_grad(x, y, alpha, g), t.grad.numpy(), rtol=1e-12,
                                   atol=1e-15)


def test_reference_rejects_alpha_outside_the_unit_interval():
    with pytest.raises(ValueError, match="label_smoothing"):
        smoothed_token_logprobs(np.zeros((1, 3)), np.array([0]), 1.5)


def tp_case(prop: str) -> Case:
    """Logits [2, 0, 1, −1] (label 0) and [0, 3, −2, 1] (label 3), α = 0.5, over TP = 2."""
    return Case("vocab_parallel_smoothed_token_logprobs", prop, "float32", "tp2_moderate",
                {"logits": np.array([[2.0, 0.0, 1.0, -1.0], [0.0, 3.0, -2.0, 1.0]]), "labels": np.array([0, 3]),
                 "grad_output": np.array([1.0, 0.5]), "vocab": 4, "label_smoothing": 0.5})


@pytest.mark.distributed
@pytest.mark.parametrize("prop", ["matches_reference", "partition_invariant", "non_destructive"])
def test_reference_engine_over_tp_shards(prop):
    from rlconform.distributed_tests.checks import run_check

    outcome = run_check(load_engine("reference"), tp_case(prop))
    assert outcome.ok, outcome.message


@pytest.mark.distributed
def test_per_shard_smoothing_is_caught_with_the_documented_numbers():
    from rlconform.distributed_tests.checks import run_check

    outcome = run_check(load_engine("mutants.vp_smoothing_per_shard"), tp_case("partition_invariant"))
    # row 1 (label 3 on TP rank 1): −2.4255 on the whole vocab; rank 0's shard mean gives −1.9255
    assert not outcome.ok and "unsharded (TP = 1) = -2.42551" in outcome.message, outcome.message
    assert "tp2 = -1.92551" in outcome.message, outcome.message


def test_log_of_underflowed_softmax_is_caught():
    from rlconform.properties.checks import run_check

    case = Case("smoothed_token_logprobs", "finite_where_reference_finite", "float32", "moderate",
                {"logits": np.array([[0.0, -120.0]]), "labels": np.array([0]), "grad_output": np.array([1.0]),
                 "label_smoothing": 0.1})
    assert run_check(load_engine("reference"), case).ok
    outcome = run_check(load_engine("mutants.smoothing_log_of_softmax"), case)
    assert not outcome.ok and "-inf" in outcome.message, outcome.message


@pytest.mark.engines
@pytest.mark.distributed
@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_megatron_smoothing_is_per_shard_under_tp_pinned():
    """Megatron-core 0.19.2 `_VocabParallelCrossEntropy.forward` smooths over the local shard with the
    partition's vocab size: TP = 1 is right, TP = 2 is not (regression case)."""
    if importlib.util.find_spec("megatron") is None:
        pytest.skip("megatron-core is not installed: run `install/engines.sh .venv/bin/python megatron`")
    from rlconform.distributed_tests.checks import run_check

    outcome = run_check(load_engine("megatron"), tp_case("partition_invariant"))
    assert not outcome.ok and "unsharded (TP = 1) = -2.42551" in outcome.message, outcome.message
    assert "reference -2.42551" in outcome.message, outcome.message


@pytest.mark.engines
@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_megatron_smoothing_is_minus_inf_on_an_underflowed_softmax_pinned():
    if importlib.util.find_spec("megatron") is None:
        pytest.skip("megatron-core is not installed: run `install/engines.sh .venv/bin/python megatron`")
    from rlconform.harness.bindings.megatron import release_single_rank_group
    from rlconform.properties.checks import run_check

    case = Case("smoothed_token_logprobs", "finite_where_reference_finite", "float32", "moderate",
                {"logits": np.array([[0.0, -120.0]]), "labels": np.array([0]), "grad_output": np.array([1.0]),
                 "label_smoothing": 0.1})
    try:
        outcome = run_check(load_engine("megatron"), case)
    finally:
        release_single_rank_group()
    assert not outcome.ok and "-inf" in outcome.message, outcome.message
