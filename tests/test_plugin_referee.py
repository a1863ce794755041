"""The pytest plugin judges in a referee by default, as ``rlconform check`` does:
``--rlconform-no-referee`` (or ``RLCONFORM_REFEREE=0``) opts out, for debugging. A single process (no ``-n``)
gets its own referee, started before it imports the engine. ``tests/bindings/tamper_atol.py`` (0.5× entropy,
every tolerance widened a million-fold in the engine's process) is red only where the referee judges."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import rlconform.properties as P
from rlconform.harness.run.pytest_plugin import use_referee

BINDING = os.path.join(os.path.dirname(__file__), "bindings", "tamper_atol.py")
FID = "entropy.matches_reference.float32.moderate"


def _status(tmp_path, *extra, env=None) -> str:
    ini = tmp_path / "pytest.ini"
    ini.write_text("[pytest]\naddopts =\n")
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "pytest", os.path.dirname(P.__file__), "-c", str(ini), "--rootdir", str(tmp_path),
           "--import-mode=importlib", "-p", "no:cacheprovider", "-p", "rlconform.harness.run.pytest_plugin",
           "--rlconform-engine", BINDING, "--rlconform-out", str(out), "--rlconform-op", "entropy",
           "--rlconform-property", "matches_reference", "--rlconform-dtype", "float32", "--rlconform-regime",
           "moderate", "--rlconform-max-examples", "5", "--rlconform-max-shrinks", "0", "-q",
           "-W", "ignore::pytest.PytestAssertRewriteWarning", *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=str(tmp_path),
                          env=dict(os.environ, **(env or {})))
    doc = json.loads((out / "report.json").read_text())
    statuses = {f["id"]: f["status"] for f in doc["findings"]}
    assert set(statuses) == {FID}, (statuses, proc.stdout[-3000:] + proc.stderr[-3000:])
    return statuses[FID]


@pytest.mark.parametrize("workers", [[], ["-n", "1"]], ids=["single-process", "xdist"])
def test_the_plugin_judges_in_a_referee_by_default(workers, tmp_path):
    assert _status(tmp_path, *workers) == "discrepancy"


def test_the_plugin_opts_out_with_no_referee(tmp_path):
    """The same tampering engine bends the verdict in its own process: this test can fail."""
    assert _status(tmp_path, "--rlconform-no-referee") == "pass"


def test_the_default_follows_the_environment(monkeypatch):
    monkeypatch.delenv("RLCONFORM_REFEREE", raising=False)
    assert use_referee(None) is True and use_referee(False) is False
    monkeypatch.setenv("RLCONFORM_REFEREE", "0")
    assert use_referee(None) is False and use_referee(True) is True


def test_a_checks_session_ends_without_pytests_forced_collections():
    """``rlconform check``'s own sessions skip the full garbage collections pytest forces at their end (two per
    process); the setting is pytest's own (the one its pytester uses for inner runs), so this fails if it moves."""
    from _pytest.stash import Stash
    from _pytest.unraisableexception import gc_collect_iterations_key

    from rlconform.harness.run.pytest_plugin import _without_forced_collection

    class Config:
        stash = Stash()

    _without_forced_collection(Config)
    assert Config.stash[gc_collect_iterations_key] == 0
