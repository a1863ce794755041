"""Declared conventions the reference follows: verl's group of one sample keeps its score
(μ := 0, σ := 1). The reference computes the convention, the check follows the binding's declaration, and
an engine that stops following a declared convention fails."""

from __future__ import annotations

import dataclasses
import importlib.util

import numpy as np
import pytest
import torch

import rlconform.reference as R
from rlconform.harness.catalog.binding import Binding, Declared, Variants
from rlconform.harness.core.declared import followed
from rlconform.properties.case import Case
from rlconform.properties.checks import run_check

verl_only = pytest.mark.skipif(importlib.util.find_spec("verl") is None, reason="verl not installed")

# group 0: two rows (scores 1, 0); group 1: one row (score 0.5)
REWARDS = np.array([[0.0, 1.0], [0.0, 0.0], [0.0, 0.5]])
MASK = np.ones((3, 2), bool)
INDEX = np.array([0, 0, 1])
RAW = Declared("singleton_raw", "convention", ("outcome_advantage",), "a group of one keeps its score",
               "μ := 0, σ := 1", "e.py:3", variants=("grpo", "rloo"), reference=(("singleton", "raw"),))


def test_the_reference_computes_the_singleton_convention():
    for est, want in (("grpo", 0.5 / (1 + 1e-6)), ("drgrpo", 0.5), ("rloo", 0.5), ("opo", 0.5), ("gpg", 0.75),
                      ("maxrl", 0.5)):
        adv, _ = R.outcome_advantage(REWARDS, MASK, INDEX, estimator=est, norm_adv_by_std=est != "drgrpo",
                                     singleton="raw")
        zero, _ = R.outcome_advantage(REWARDS, MASK, INDEX, estimator=est, norm_adv_by_std=est != "drgrpo")
        assert adv[2, 1] == pytest.approx(want, rel=1e-15) and zero[2, 1] == 0.0, est
        assert np.array_equal(adv[:2], zero[:2])  # the group of two is untouched
    passk, _ = R.outcome_advantage(REWARDS, MASK, INDEX, estimator="grpo_passk", singleton="raw")
    assert passk[2, 1] == 0.0  # verl raises there (a declared guard), no convention
    with pytest.raises(ValueError, match="singleton"):
        R.outcome_advantage(REWARDS, MASK, INDEX, estimator="grpo", singleton="score")


def test_followed_conventions_hold_second_implementations_to_their_variant():
    assert followed((RAW,), "outcome_advantage", "grpo@singleton_groups") == {"singleton": "raw"}
    assert followed((RAW,), "outcome_advantage", "rloo+vectorized@singleton_groups") == {"singleton": "raw"}
    assert followed((RAW,), "outcome_advantage", "opo@singleton_groups") == {}
    with pytest.raises(ValueError, match="only a convention"):
        Declared("x", "guard", ("gae",), "w", "r", "f.py:1", when=lambda c: True, raises="ValueError", match="x",
                 reference=(("singleton", "raw"),))


def _engine(singleton: str):
    def grpo(token_level_rewards, response_mask, index):
        adv, ret = R.outcome_advantage(token_level_rewards.double().numpy(), response_mask.numpy(), index,
                                       estimator="grpo", singleton=singleton)
        dt = token_level_rewards.dtype
        return torch.from_numpy(adv).to(dt), torch.from_numpy(ret).to(dt)
    return grpo


def _case(dtype="float64"):
    return Case("outcome_advantage", "matches_reference", dtype, "grpo@singleton_groups",
                {"token_level_rewards": REWARDS, "response_mask": MASK, "index": INDEX, "garbage": 0.0})


def test_an_engine_that_stops_following_a_declared_convention_fails():
    follows = Binding("e", ops={"outcome_advantage": Variants({"grpo": _engine("raw")})}, declared=(RAW,))
    breaks = Binding("e", ops={"outcome_advantage": Variants({"grpo": _engine("zero")})}, declared=(RAW,))
    out = run_check(follows, _case())
    assert out.ok and out.declared == "singleton_raw"
    assert not run_check(breaks, _case()).ok  # a singleton given 0 where the engine declares its raw score
    undeclared = Binding("e", ops={"outcome_advantage": Variants({"grpo": _engine("raw")})})
    assert not run_check(undeclared, _case()).ok  # undeclared, the same difference stays a failure


@pytest.mark.engines
@verl_only
def test_verl_follows_its_singleton_convention_and_fails_without_it():
    from rlconform.harness.bindings.load import load_engine

    verl = load_engine("verl")
    conv = next(d for d in verl.declared if d.name == "singleton_group_raw_score")
    assert conv.source.startswith("verl/trainer/ppo/core_algos.py:") and conv.reference == (("singleton", "raw"),)
    for est in ("grpo", "rloo", "opo", "gpg"):
        case = dataclasses.replace(_case("float32"), regime=f"{est}@singleton_groups")
        assert run_check(verl, case).ok, est
        assert not run_check(dataclasses.replace(verl, declared=()), case).ok, est


@pytest.mark.engines
@pytest.mark.skipif(importlib.util.find_spec("skyrl") is None, reason="SkyRL not installed")
def test_skyrl_follows_its_singleton_convention_and_fails_without_it():
    from rlconform.harness.bindings.load import load_engine

    skyrl = load_engine("skyrl")
    conv = next(d for d in skyrl.declared if d.name == "singleton_group_raw_score")
    assert conv.source.startswith("skyrl/") and "rloo" not in conv.variants  # SkyRL's rloo gives 0, as the reference
    for est in ("grpo", "maxrl"):
        case = dataclasses.replace(_case("float32"), regime=f"{est}@singleton_groups")
        assert run_check(skyrl, case).ok, est
        assert not run_check(dataclasses.replace(skyrl, declared=()), case).ok, est


@pytest.mark.engines
@verl_only
def test_verl_follows_its_log_ratio_clamp_convention_and_fails_without_it():
    """verl clamps the IS / χ² log-ratios to ±20 (SAFETY_BOUND): declared, the reference follows it; without
    the declaration the exact χ² (e^44 where verl gives e^40) fails."""
    from rlconform.harness.bindings.load import load_engine

    verl = load_engine("verl")
    conv = next(d for d in verl.declared if d.name == "is_log_ratio_clamp_20")
    assert conv.source.startswith("verl/trainer/ppo/rollout_corr_helper.py:") and \
        conv.reference == (("log_ratio_clamp", 20.0),)
    old = np.array([[-23.0, -1.0]])
    case = Case("rollout_rejection_mask", "matches_reference", "float32", "token_k1@moderate",
                {"log_prob": old + np.array([[22.0, 0.1]]), "old_log_prob": old, "mask": np.ones((1, 2), bool),
                 "garbage": 0.0, "variant": "token_k1"})
    assert run_check(verl, case).ok
    assert not run_check(dataclasses.replace(verl, declared=()), case).ok
