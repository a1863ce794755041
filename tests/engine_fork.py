"""A fork of an installed engine for the tests: its package copied and edited as a pull request would edit it."""

from __future__ import annotations

import importlib.util
import shutil

import pytest


def package_dir(name: str, install_hint: str) -> str:
    """The installed package's directory; skips the test (saying how to install it) when it is absent."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        pytest.skip(f"{name} is not installed ({install_hint})")
    return list(spec.submodule_search_locations)[0]


def fork(root, name: str, source: str, edits: dict) -> str:
    """Copy package ``name`` from ``source`` to ``root/name`` and apply ``edits`` (file relative to the package ->
    ``[(old text, new text)]``, each old text occurring exactly once); returns ``root`` for ``--engine-path``.
    The installed byte code is copied too (the checks run with -B, so without it every process compiled the
    engine from source); an edited file's byte code is removed, so it is compiled from the fork's source."""
    shutil.copytree(source, root / name)
    for rel, pairs in edits.items():
        path = root / name / rel
        text = path.read_text()
        for old, new in pairs:
            assert text.count(old) == 1, f"{name}'s {rel} changed; update the edit ({old.strip()[:60]!r})"
            text = text.replace(old, new)
        path.write_text(text)
        for pyc in (path.parent / "__pycache__").glob(path.stem + ".*.pyc"):
            pyc.unlink()
    return str(root)
