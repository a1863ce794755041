"""verl's and SkyRL's policy-loss and KL registries are bound completely: every registered name is either
bound to a catalog variant or listed unchecked with a reason."""

from __future__ import annotations

import pytest

from rlconform.harness.catalog.ops import OPS


@pytest.mark.engines
def test_verl_policy_loss_registry_fully_listed():
    from verl.trainer.ppo import core_algos

    from rlconform.harness.bindings import verl

    impl = verl.binding.resolve("policy_loss")
    assert set(impl.impls) <= set(OPS["policy_loss"].variants)
    registered = set(core_algos.POLICY_LOSS_REGISTRY)
    listed = set(verl.POLICY_LOSS_NAMES[n] for n in registered if n in verl.POLICY_LOSS_NAMES) | set(impl.unchecked)
    missing = {n for n in registered if verl.POLICY_LOSS_NAMES.get(n) not in impl.impls and n not in impl.unchecked}
    assert not missing, f"registered but neither bound nor unchecked: {missing}"
    assert all(reason for reason in impl.unchecked.values())
    assert listed


@pytest.mark.engines
def test_skyrl_policy_loss_registry_fully_listed():
    from rlconform.harness.bindings import skyrl
    from rlconform.harness.bindings._compat import import_skyrl

    registry = import_skyrl("skyrl.backends.skyrl_train.utils.ppo_utils").PolicyLossRegistry
    impl = skyrl.binding.resolve("policy_loss")
    assert set(impl.impls) <= set(OPS["policy_loss"].variants)
    for name in registry.list_available():
        bound = [v for v, _ in skyrl.POLICY_LOSS_NAMES.get(name, []) if v in impl.impls]
        assert bound or impl.unchecked.get(name), f"SkyRL {name!r} neither bound nor unchecked"


@pytest.mark.engines
@pytest.mark.parametrize("engine", ["verl", "skyrl"])
def test_kl_estimators_are_catalog_variants(engine):
    import importlib

    binding = importlib.import_module(f"rlconform.harness.bindings.{engine}").binding
    impl = binding.resolve("kl_estimator")
    assert impl.impls and set(impl.impls) <= set(OPS["kl_estimator"].variants)
