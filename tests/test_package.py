"""rlconform as a package: the wheel built from this checkout, installed into a fresh environment and run
from a folder outside any checkout, gives a working ``rlconform --version``, a check of verl with the stock
ledger chosen by name, and the pytest plugin.

The fresh environment has no pip and no network: the wheel goes in with this environment's pip
(``--python``), and the dependencies (torch, numpy, hypothesis, the engines) are this environment's
site-packages, reached through a ``.pth`` file, which does not run this environment's own ``.pth`` files
(so the editable rlconform of the checkout is not seen)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import sysconfig
import zipfile

import pytest

from rlconform.harness.report import stock_ledgers

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> pathlib.Path:
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                           "-q", "-w", str(out), str(ROOT)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (whl,) = out.glob("rlconform-*.whl")
    return whl


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> pathlib.Path:
    """A fresh venv holding the wheel; returns its bin folder."""
    venv = tmp_path_factory.mktemp("venv") / "v"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    deps = sysconfig.get_paths()["purelib"]
    pathlib.Path(site, "rlconform_test_dependencies.pth").write_text(deps + "\n")
    proc = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index",
                           "-q", str(wheel)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return venv / "bin"


def test_the_wheel_ships_the_stock_ledgers_and_templates(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for ledger in stock_ledgers.names():
        assert f"rlconform/ledgers/{ledger}/xfails.txt" in names
    assert any(n.startswith("rlconform/harness/report/templates/") and n.endswith(".j2") for n in names)
    assert not any(n.endswith("report.json") for n in names)  # ledgers only, not the committed reports


@pytest.mark.cli
@pytest.mark.slow
def test_the_installed_wheel_runs_outside_a_checkout(installed, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSAFEPATH", "RLCONFORM_ENGINE")}
    env["PATH"] = str(installed) + os.pathsep + env.get("PATH", "")

    def run(*argv, timeout=900):
        return subprocess.run(list(argv), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout)

    where = run(str(installed / "python"), "-c", "import rlconform.harness.cli as c; print(c.__file__)")
    assert where.returncode == 0 and str(ROOT) not in where.stdout, where.stdout + where.stderr  # not the checkout
    version = run(str(installed / "rlconform"), "--version")
    assert version.returncode == 0 and version.stdout.strip(), version.stderr
    check = run(str(installed / "rlconform"), "check", "--engine", "verl", "--op", "masked_mean", "--property",
                "matches_reference", "--dtype", "float32", "--max-examples", "3", "--xfails", "verl-0.9.1",
                "--out", "rep")
    assert check.returncode == 0, check.stdout + check.stderr  # the five findings pass
    assert (tmp_path / "rep" / "report.json").exists()
    bad = run(str(installed / "rlconform"), "check", "--engine", "verl", "--xfails", "verl-0.0.1", "--out", "rep2")
    assert bad.returncode == 2 and "stock ledgers: " in bad.stderr and "verl-0.9.1" in bad.stderr
    plugin = run(str(installed / "python"), "-m", "pytest", "-p", "rlconform.harness.run.pytest_plugin", "--help")
    assert plugin.returncode == 0 and "--rlconform-engine" in plugin.stdout, plugin.stderr


@pytest.mark.smoke
@pytest.mark.cli
def test_ledger_prints_a_stock_ledger_by_name(capsys):
    from rlconform.harness.cli import main

    assert main(["ledger", "--stock", "verl-0.9.1"]) == 0
    assert capsys.readouterr().out == (ROOT / "reports" / "verl-0.9.1" / "xfails.txt").read_text()
    assert main(["ledger", "--stock", "verl-0.0.1"]) == 2
    assert "stock ledgers: " in capsys.readouterr().err
    assert main(["ledger", "--stock", "verl-0.9.1", str(ROOT / "reports" / "verl-0.9.1")]) == 2
    assert main(["ledger"]) == 2


@pytest.mark.smoke
@pytest.mark.cli
def test_list_ops_prints_each_ops_call(capsys):
    from rlconform.harness.catalog.ops import OPS
    from rlconform.harness.cli import main

    assert main(["list-ops"]) == 0
    out = capsys.readouterr().out
    assert out.count(" call: ") == len(OPS)
    assert "call: masked reductions over tokens (values [B, T], mask [B, T] -> 0-d)" in out
