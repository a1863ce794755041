"""The referee starts under the interpreter's own start-up hooks and still refuses engine code.

Debian's and Ubuntu's system ``python3`` runs ``/usr/lib/python3.X/sitecustomize.py`` (the apport
exception hook) at every start, in every venv made from it. Those modules are the interpreter's, not an
engine's: a check must run under them. A start-up hook that imports an engine package is still refused.
"""

from __future__ import annotations

import json
import os
import textwrap

import forked_cli
import pytest

pytestmark = pytest.mark.slow


def _hooked_env(tmp_path, sitecustomize: str) -> dict:
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    # as Debian's: sitecustomize imports a hook module of its own and installs it
    (hooks / "startup_probe_hook.py").write_text("installed = []\ndef install():\n    installed.append(1)\n")
    (hooks / "sitecustomize.py").write_text(textwrap.dedent(sitecustomize))
    return dict(os.environ, PYTHONPATH=str(hooks))


def test_startup_modules_lists_what_a_fresh_interpreter_loads_and_drops_engine_packages():
    from rlconform.properties import referee

    names = referee.startup_modules()
    assert "sys" in names and "site" in names  # a real child interpreter answered
    assert not any(n.startswith(referee.ENGINE_PACKAGES) for n in names)
    assert not any(n.split(".", 1)[0] in referee.ENGINE_TOPS for n in names)


@pytest.mark.cli
def test_a_check_runs_under_a_sitecustomize_that_imports_a_hook(tmp_path):
    env = _hooked_env(tmp_path, """
        try:
            import startup_probe_hook
        except ImportError:
            pass
        else:
            startup_probe_hook.install()
    """)
    out = tmp_path / "o"
    proc = forked_cli.run(["check", "--engine", "reference", "--op", "masked_mean", "--property", "matches_reference",
                           "--dtype", "float32", "--out", str(out), "-n", "1", "--referee"], env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    statuses = [f["status"] for f in report["findings"]]
    assert statuses and set(statuses) == {"pass"}


@pytest.mark.cli
def test_a_sitecustomize_that_imports_engine_code_is_still_refused(tmp_path):
    env = _hooked_env(tmp_path, """
        import rlconform.harness.mutants
    """)
    proc = forked_cli.run(["check", "--engine", "reference", "--op", "masked_mean", "--property", "matches_reference",
                           "--dtype", "float32", "--out", str(tmp_path / "o"), "-n", "1", "--referee"], env=env, timeout=900)
    assert proc.returncode == 2
    assert "referee" in proc.stderr and "rlconform.harness.mutants" in proc.stderr
