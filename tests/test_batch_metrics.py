"""The batch metrics op: the float64 reference by hand, the float32 path the reference engine runs, and the op on
the engine's batch of an all-aborted and an all-rejected step (a statistic of nothing is undefined; raising is a
crash). verl's ``compute_data_metrics`` raised there before its empty-selection guards (verl PR #5899); the
mutant ``bm_raises_on_empty`` keeps that behaviour (tests/test_mutants.py)."""

from __future__ import annotations

import importlib.util
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings

import rlconform.reference as R
from rlconform.harness.families import batch_metrics as BM

# two rows: row 0 has a 2-token prompt and a 3-token response whose middle token is an observation (out of the
# response mask); row 1 a 1-token prompt and no response (aborted)
ATTENTION = np.array([[1, 1, 1, 1, 1, 0], [0, 1, 0, 0, 0, 0]])
RESPONSE_MASK = np.array([[1, 0, 1, 0], [0, 0, 0, 0]])
SCORES = np.array([[0.0, 0.0, 1.5, 0.0], [0.0, 0.0, 0.0, 0.0]])
ADV = np.array([[2.0, 0.0, -1.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
RET = np.array([[3.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
VAL = np.array([[2.0, 0.0, 2.0, 0.0], [0.0, 0.0, 0.0, 0.0]])


def test_the_reference_by_hand():
    out = R.batch_metrics(SCORES, SCORES, ADV, RET, RESPONSE_MASK, ATTENTION, values=VAL)
    assert out["score_mean"] == out["score_max"] == 1.5  # the aborted row is not a score
    assert (out["advantages_mean"], out["advantages_max"], out["advantages_min"]) == (0.5, 2.0, -1.0)
    assert (out["response_length_mean"], out["response_length_max"], out["response_length_min"]) == (1.5, 3, 0)
    assert out["response_length_clip_ratio"] == 0.0 and out["aborted_ratio"] == 0.5
    assert out["non_aborted_length_mean"] == 3.0
    assert (out["prompt_length_mean"], out["prompt_length_clip_ratio"]) == (1.5, 0.5)
    assert out["values_mean"] == 2.0
    # Var(ret − val) = Var([1, −1]) = 2, Var(ret) = Var([3, 1]) = 2 (unbiased)
    assert out["vf_explained_var"] == pytest.approx(1 - 2 / (2 + 1e-5), rel=1e-15)
    assert set(out) == set(R.BATCH_STATISTICS + R.CRITIC_STATISTICS)


def test_a_statistic_of_nothing_is_nan_and_the_lengths_stay_defined():
    aborted = np.zeros_like(ATTENTION)
    aborted[:, :2] = ATTENTION[:, :2]
    out = R.batch_metrics(SCORES * 0, SCORES * 0, ADV, RET, RESPONSE_MASK * 0, aborted)
    for stat in ("score_mean", "reward_max", "advantages_min", "returns_mean", "non_aborted_length_mean"):
        assert math.isnan(out[stat]), stat
    assert out["aborted_ratio"] == 1.0 and out["response_length_max"] == 0
    with pytest.raises(ValueError, match="attention_mask"):
        R.batch_metrics(SCORES, SCORES, ADV, RET, RESPONSE_MASK, ATTENTION[:, :3])


@settings(max_examples=30, deadline=None)
@given(BM.inputs("critic", "trainer_batches"))
def test_the_float32_path_follows_the_reference(inp):
    ref = R.batch_metrics(inp["token_level_scores"], inp["token_level_rewards"], inp["advantages"], inp["returns"],
                          inp["response_mask"], inp["attention_mask"], values=inp["values"])
    fa = BM.faithful(BM.trainer_batch(inp), critic=True)
    assert set(fa) == set(ref)
    for stat, r in ref.items():
        if math.isnan(r):
            assert math.isnan(fa[stat]), stat
        else:
            assert fa[stat] == pytest.approx(r, rel=1e-4, abs=1e-4), stat
    assert not np.asarray(inp["response_mask"], bool).all()  # mask_invariant always has a masked position


@settings(max_examples=10, deadline=None)
@given(BM.inputs("actor", "all_aborted"))
def test_an_unguarded_max_raises_on_an_all_aborted_batch(inp):
    batch = BM.trainer_batch(inp)
    assert math.isnan(BM.faithful(batch, critic=False)["score_max"])
    with pytest.raises(RuntimeError, match="numel"):
        BM.faithful(batch, critic=False, guarded=False)


@pytest.mark.engines
@pytest.mark.parametrize("data", ["all_aborted", "all_masked"])
def test_verls_batch_metrics_log_a_batch_without_tokens(data):
    if importlib.util.find_spec("verl") is None:
        pytest.skip("verl is not installed (bash install/engines.sh .venv/bin/python verl)")
    from hypothesis import find

    from rlconform.harness.bindings.verl import binding

    inp = find(BM.inputs("critic", data), lambda x: len(x["input_ids"]) >= 2)
    fn = binding.resolve("batch_metrics").get("batch_metrics", "critic", "verl")
    got = fn(BM.trainer_batch(inp))
    ref = R.batch_metrics(inp["token_level_scores"], inp["token_level_rewards"], inp["advantages"], inp["returns"],
                          inp["response_mask"], inp["attention_mask"], values=inp["values"])
    assert math.isnan(got["advantages_max"]) and math.isnan(ref["advantages_max"])
    assert got["response_length_max"] == ref["response_length_max"]
    assert torch.is_tensor(got["response_length_mean"]) or isinstance(got["response_length_mean"], float)
