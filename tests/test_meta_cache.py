"""The cache of an installed engine's metadata (harness/bindings/meta_cache.py): read back while nothing it is
keyed by changes, read afresh after an edit of the engine's files, never kept when reading it failed, off with
``RLCONFORM_NO_CACHE``, and never used for a fork (``--engine-path``) or a user's binding."""

from __future__ import annotations

import os

import pytest

from rlconform.harness.bindings import meta_cache


@pytest.fixture()
def engine(tmp_path, monkeypatch):
    """A fake installed engine package ``fakeeng`` bound as the built-in engine ``fake``; the cache in tmp."""
    pkg = tmp_path / "site" / "fakeeng"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("def f():\n    return 1\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setitem(meta_cache.ENGINE_PACKAGES, "fake", "fakeeng")
    monkeypatch.setenv("RLCONFORM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("RLCONFORM_NO_CACHE", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return pkg


class Probe:
    def __init__(self):
        self.calls = 0

    def __call__(self):
        self.calls += 1
        return {"name": "fake", "ops": ["entropy"], "configs": {"sites": {"f": [[("k", 1)]]}}, "n": self.calls}


def test_read_back_until_the_engines_code_changes(engine):
    probe = Probe()
    first = meta_cache.cached_probe("fake", None, False, probe)
    assert first["n"] == 1 and first["configs"]["sites"]["f"] == [[["k", 1]]]  # as JSON, whether read back or not
    assert meta_cache.cached_probe("fake", None, False, probe) == first and probe.calls == 1
    assert meta_cache.cached_probe("fake", None, True, probe)["n"] == 2  # with engine sites: another entry
    init = engine / "__init__.py"
    init.write_text("def f():\n    return 2  # a fork's fix\n")
    os.utime(init, ns=(init.stat().st_atime_ns, init.stat().st_mtime_ns + 10**9))
    assert meta_cache.cached_probe("fake", None, False, probe)["n"] == 3
    (engine / "extra.py").write_text("X = 1\n")  # a new module
    assert meta_cache.cached_probe("fake", None, False, probe)["n"] == 4
    assert len(list((engine.parent.parent / "cache" / "engine-meta").iterdir())) == 2  # replaced, not added


def test_the_environment_of_the_run_keys_it(engine, monkeypatch):
    probe = Probe()
    meta_cache.cached_probe("fake", None, False, probe)
    monkeypatch.setenv("RLCONFORM_SOMETHING", "1")
    meta_cache.cached_probe("fake", None, False, probe)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    meta_cache.cached_probe("fake", None, False, probe)
    monkeypatch.setenv("UNRELATED_VARIABLE", "1")
    meta_cache.cached_probe("fake", None, False, probe)
    assert probe.calls == 3


def test_a_failed_read_is_never_kept(engine):
    def broken():
        raise RuntimeError("the engine did not import")

    for _ in range(2):
        with pytest.raises(RuntimeError):
            meta_cache.cached_probe("fake", None, False, broken)
    probe = Probe()
    assert meta_cache.cached_probe("fake", None, False, probe)["n"] == 1


def test_a_damaged_entry_is_read_afresh(engine, tmp_path):
    probe = Probe()
    meta_cache.cached_probe("fake", None, False, probe)
    (entry,) = (tmp_path / "cache" / "engine-meta").iterdir()
    entry.write_text("{not json")
    assert meta_cache.cached_probe("fake", None, False, probe)["n"] == 2


def test_off_and_not_for_forks_or_users_bindings(engine, monkeypatch, tmp_path):
    probe = Probe()
    assert meta_cache.key("fake", str(tmp_path), False) is None  # --engine-path: a fork
    assert meta_cache.key("my_binding.py", None, False) is None and meta_cache.key("pkg.mod:b", None, False) is None
    assert meta_cache.key("nosuchengine", None, False) is None
    meta_cache.cached_probe("fake", str(tmp_path), False, probe)
    meta_cache.cached_probe("fake", str(tmp_path), False, probe)
    assert probe.calls == 2
    monkeypatch.setenv("RLCONFORM_NO_CACHE", "1")
    meta_cache.cached_probe("fake", None, False, probe)
    meta_cache.cached_probe("fake", None, False, probe)
    assert probe.calls == 4 and not (tmp_path / "cache").exists()
