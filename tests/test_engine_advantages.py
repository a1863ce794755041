"""The advantage estimators of verl and SkyRL are bound from their registries: every registered name is a
bound variant of ``outcome_advantage`` or listed unchecked with a reason, also a name a fork adds; the
adapters feed the engines what their trainers feed them (GDPO's components through non_tensor_batch).

Needs the engines installed (``install/engines.sh .venv/bin/python verl|skyrl``); skipped otherwise.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

import rlconform.reference as R

pytestmark = [pytest.mark.engines]


def _need(module: str, engine: str):
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{engine} is not installed: run `install/engines.sh .venv/bin/python {engine}`")


def _engine_name(fn) -> str:
    """The registry name an adapter calls: its qualname ends in ``(<engine name>)``."""
    return fn.__qualname__.rsplit("(", 1)[1].rstrip(")")


def _assert_covers(variants, registered: set):
    bound = {_engine_name(fn) for fn in variants.impls.values()}
    second = {_engine_name(fn) for fns in variants.implementations.values() for fn in fns.values()}
    assert bound | second | set(variants.unchecked) == registered, (bound, second, variants.unchecked, registered)
    assert not (bound | second) & set(variants.unchecked) and not bound & second
    assert all(reason.strip() for reason in variants.unchecked.values())


@pytest.fixture
def verl_adv():
    _need("verl", "verl")
    from rlconform.harness.bindings import verl

    return verl


@pytest.fixture
def skyrl_adv():
    _need("skyrl", "skyrl")
    from rlconform.harness.bindings import skyrl

    return skyrl


def test_verl_every_registered_estimator_bound_or_unchecked(verl_adv):
    """grpo / rloo are the default implementations of their variants; grpo_vectorized / rloo_vectorized are
    their second implementations, bound in the same engine 'verl', never unchecked."""
    from verl.trainer.ppo import core_algos

    variants = verl_adv.binding.resolve("outcome_advantage")
    _assert_covers(variants, set(core_algos.ADV_ESTIMATOR_REGISTRY))
    assert {"grpo", "drgrpo", "rloo"} <= set(variants.impls)
    assert {_engine_name(variants.impls[v]) for v in ("grpo", "drgrpo")} == {"grpo"}
    assert _engine_name(variants.impls["rloo"]) == "rloo"
    vectorized = variants.implementations["vectorized"]
    assert set(vectorized) == {"grpo", "drgrpo", "rloo"}
    assert {_engine_name(vectorized[v]) for v in ("grpo", "drgrpo")} == {"grpo_vectorized"}
    assert _engine_name(vectorized["rloo"]) == "rloo_vectorized"
    assert {"grpo+vectorized", "drgrpo+vectorized", "rloo+vectorized"} <= set(variants.variants)
    assert _engine_name(variants.get("outcome_advantage", "rloo+vectorized")) == "rloo_vectorized"


def test_verl_second_implementation_without_its_default_is_unchecked(verl_adv, monkeypatch):
    """A fork that drops 'rloo' but keeps 'rloo_vectorized' has nothing to check it against: listed, with why."""
    from verl.trainer.ppo import core_algos

    monkeypatch.delitem(core_algos.ADV_ESTIMATOR_REGISTRY, "rloo")
    variants = verl_adv._outcome_advantage()
    assert "rloo" not in variants.impls and "rloo" not in variants.implementations["vectorized"]
    assert "second implementation of 'rloo'" in variants.unchecked["rloo_vectorized"]
    _assert_covers(variants, set(core_algos.ADV_ESTIMATOR_REGISTRY))


def test_verl_fork_estimator_is_listed_unchecked(verl_adv, monkeypatch):
    from verl.trainer.ppo import core_algos

    monkeypatch.setitem(core_algos.ADV_ESTIMATOR_REGISTRY, "fork_estimator", lambda **kw: None)
    variants = verl_adv._outcome_advantage()
    assert "not in the catalog" in variants.unchecked["fork_estimator"]
    _assert_covers(variants, set(core_algos.ADV_ESTIMATOR_REGISTRY))


def test_skyrl_every_registered_estimator_bound_or_unchecked(skyrl_adv, monkeypatch):
    registry = skyrl_adv._skyrl(skyrl_adv.PPO_UTILS, "AdvantageEstimatorRegistry")
    names = list(registry.list_available())
    _assert_covers(skyrl_adv.binding.resolve("outcome_advantage"), set(names))
    monkeypatch.setattr(registry, "list_available", classmethod(lambda cls: names + ["fork_estimator"]))
    variants = skyrl_adv._outcome_advantage()
    assert "not in the catalog" in variants.unchecked["fork_estimator"]
    _assert_covers(variants, set(names) | {"fork_estimator"})


def test_verl_gdpo_components_reach_the_estimator(verl_adv):
    """Two reward components at each row's last valid token, through the trainer's non_tensor_batch /
    batch: verl equals the reference (weights 1) to fp32 rounding; with the components ignored (K = 1 on
    the zero token_level_rewards) every advantage would be 0."""
    gdpo = verl_adv.binding.resolve("outcome_advantage").get("outcome_advantage", "gdpo")
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1]], dtype=torch.bool)
    index = np.array([0, 0, 1, 1])
    last = mask.sum(-1) - 1
    comps = torch.zeros(2, 4, 3, dtype=torch.float64)
    comps[0, torch.arange(4), last] = torch.tensor([1.0, 0.0, 0.5, 0.25], dtype=torch.float64)
    comps[1, torch.arange(4), last] = torch.tensor([1.0, 1.0, 3.0, 1.0], dtype=torch.float64)
    adv, _ = gdpo(torch.zeros(4, 3, dtype=torch.float64), mask, index, reward_components=comps)
    ref, _ = R.outcome_advantage(np.zeros((4, 3)), mask.numpy(), index, estimator="gdpo",
                                 reward_components=comps.numpy())
    assert np.abs(ref).max() > 0.5
    np.testing.assert_allclose(adv.double().numpy() * mask.numpy(), ref, rtol=0, atol=1e-5)
