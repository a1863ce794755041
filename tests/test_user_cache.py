"""Where the caches live (harness/core/user_cache.py): ``$RLCONFORM_CACHE_DIR``, else ``$XDG_CACHE_HOME/rlconform``,
else ``~/.cache/rlconform``; none with ``RLCONFORM_NO_CACHE``."""

from __future__ import annotations

import os

from rlconform.harness.core.user_cache import cache_folder


def test_the_cache_folder_follows_the_environment(monkeypatch, tmp_path):
    for name in ("RLCONFORM_NO_CACHE", "RLCONFORM_CACHE_DIR", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_folder("meta") == os.path.join(str(tmp_path / "home"), ".cache", "rlconform", "meta")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_folder("meta") == os.path.join(str(tmp_path / "xdg"), "rlconform", "meta")
    monkeypatch.setenv("RLCONFORM_CACHE_DIR", str(tmp_path / "own"))
    assert cache_folder("discovery") == os.path.join(str(tmp_path / "own"), "discovery")
    assert not os.path.exists(cache_folder("discovery"))  # named, not created
    monkeypatch.setenv("RLCONFORM_NO_CACHE", "1")
    assert cache_folder("meta") is None
