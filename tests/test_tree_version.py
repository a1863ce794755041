"""A report of a fork or an older commit on ``--engine-path`` names the version its tree declares, not the
installed distribution's (a verl tree of early 2026 declares 0.8.0.dev while verl 0.9.1 is installed)."""

from __future__ import annotations

from rlconform.harness.bindings.load import tree_version


def test_each_engines_layout_is_read_without_importing(tmp_path):
    (tmp_path / "verl" / "version").mkdir(parents=True)
    (tmp_path / "verl" / "version" / "version").write_text("0.8.0.dev\n")
    (tmp_path / "verl" / "__init__.py").write_text("raise ImportError('never imported')\n")
    assert tree_version("verl", str(tmp_path)) == "0.8.0.dev"
    (tmp_path / "skyrl").mkdir()
    (tmp_path / "skyrl" / "__init__.py").write_text('__version__ = "0.2.0"\nraise ImportError("never imported")\n')
    assert tree_version("skyrl", str(tmp_path)) == "0.2.0"
    (tmp_path / "megatron" / "core").mkdir(parents=True)
    (tmp_path / "megatron" / "core" / "package_info.py").write_text(
        'MAJOR = 0\nMINOR = 18\nPATCH = 1\nPRE_RELEASE = "rc0"\n__version__ = ".".join(map(str, (MAJOR,)))\n')
    assert tree_version("megatron.core", str(tmp_path)) == "0.18.1rc0"


def test_a_tree_that_declares_no_version_gives_none(tmp_path):
    (tmp_path / "verl").mkdir()
    (tmp_path / "verl" / "__init__.py").write_text("from .version import __version__\n")
    assert tree_version("verl", str(tmp_path)) is None
    assert tree_version("verl", str(tmp_path / "missing")) is None
