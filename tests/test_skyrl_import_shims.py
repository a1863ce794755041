"""Import shims for SkyRL commits older than the pinned release (harness/bindings/_compat.py): Ray's
``PlacementGroupSchedulingStrategy`` imported from where an older Ray exported it, and a stand-in for a SkyRL
module outside the numerics (HTTP serving, evaluation) whose third-party package is not installed. Both are
exercised on planted modules, so no old SkyRL is needed (docs/decisions/commits-between-releases.md gives what a
check of an older SkyRL commit found through them)."""

from __future__ import annotations

import importlib.util
import sys
import types

import pytest

from rlconform.harness.bindings import _compat

MISSING = "rlconform_no_such_serving_package"


def test_a_ray_name_that_moved_is_at_its_old_place_only_while_skyrl_imports():
    if importlib.util.find_spec("ray") is None:
        pytest.skip("ray is not installed")
    import ray.util.placement_group as old
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    had = hasattr(old, "PlacementGroupSchedulingStrategy")
    with _compat.ray_scheduling_names():
        from ray.util.placement_group import PlacementGroupSchedulingStrategy as seen
        assert seen is (old.PlacementGroupSchedulingStrategy if had else PlacementGroupSchedulingStrategy)
    assert hasattr(old, "PlacementGroupSchedulingStrategy") == had


def test_a_ray_without_the_class_gets_a_stand_in_that_refuses_to_schedule(monkeypatch):
    old, new = types.ModuleType("planted_ray_old"), types.ModuleType("planted_ray_new")
    monkeypatch.setitem(sys.modules, old.__name__, old)
    monkeypatch.setitem(sys.modules, new.__name__, new)
    monkeypatch.setattr(_compat, "RAY_MOVED_NAMES", {(old.__name__, "Strategy"): (new.__name__, "Strategy")})
    with _compat.ray_scheduling_names():
        with pytest.raises(RuntimeError, match="rlconform stand-in"):
            old.Strategy(placement_group=None)
    assert not hasattr(old, "Strategy")


@pytest.fixture
def planted(tmp_path, monkeypatch):
    """``planted_skyrl_old.worker`` imports ``planted_skyrl_old.serving``, which imports a package that is not
    installed; ``planted_skyrl_old.numerics`` imports it too but is no serving module."""
    pkg = tmp_path / "planted_skyrl_old"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "serving.py").write_text(f"import {MISSING}\n\ndef serve(app):\n    return {MISSING}.run(app)\n")
    (pkg / "worker.py").write_text("from planted_skyrl_old.serving import serve, Endpoint\n\n"
                                   "def loss(x):\n    return 2 * x\n")
    (pkg / "numerics.py").write_text(f"import {MISSING}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(_compat, "SKYRL_SERVING_MODULES", {"planted_skyrl_old.serving": "serves over HTTP"})
    monkeypatch.setattr(_compat, "SERVING_PACKAGES", (MISSING,))
    monkeypatch.setitem(sys.modules, "skyrl.backends", types.ModuleType("skyrl.backends"))  # imported already
    yield
    for name in [n for n in sys.modules if n.startswith("planted_skyrl_old")]:
        del sys.modules[name]


def test_a_serving_module_whose_package_is_missing_is_a_stand_in(planted):
    worker = _compat.import_skyrl("planted_skyrl_old.worker")
    assert worker.loss(3) == 6  # the module itself is the engine's own
    assert sys.modules["planted_skyrl_old.serving"].__rlconform_stand_in__
    with pytest.raises(RuntimeError, match=f"serves over HTTP.*needs {MISSING}"):
        worker.serve("app")
    with pytest.raises(RuntimeError, match="rlconform stand-in"):
        worker.Endpoint()


def test_a_numerics_module_whose_package_is_missing_still_fails_to_import(planted):
    with pytest.raises(ModuleNotFoundError, match=MISSING):
        _compat.import_skyrl("planted_skyrl_old.numerics")
