"""One verdict on every machine: a fork writes its ledger on one machine and runs the main job
on others. A narrowed check of verl's real entropy and ``agg_loss`` (every dtype) runs with torch's native
kernels, 2 intra-op threads and 2 engine workers; its ledger is written with ``rlconform ledger``; then the
same check runs under ``ATEN_CPU_CAPABILITY=avx2`` (1 thread, 1 worker) and ``=default`` (2 threads, 1
worker) — other vector widths, so other last bits — with that ledger. Both must exit 0, and every finding
must have the status the first run gives it read through its own ledger (a listed finding ``xfail``, the
others as they were). The three configurations cover every value of each factor (pairwise, not the full
product). What makes it hold: the margin band of harness/core/tolerance.py (``verdict``,
``LEDGER_ABOVE``) and examples that never follow the engine's output (no ``target()`` in ``check``)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess

import forked_cli
import pytest

from rlconform.harness.report.xfails import parse_ledger

# found, not imported: importing verl here cost every test process ~5 CPU s while collecting the suite
pytestmark = [pytest.mark.engines, pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("verl") is None, reason="verl is not installed")]

SELECTION = ["--engine", "verl", "--op", "entropy", "--op", "agg_loss", "--property", "matches_reference",
             "--profile", "ci", "--max-examples", "4", "-q"]
#: name -> (environment changes, engine workers); the first writes the ledger the others use
CONFIGS = {
    "native, 2 threads, -n 2": ({"ATEN_CPU_CAPABILITY": None, "OMP_NUM_THREADS": "2"}, "2"),
    "avx2, 1 thread, -n 1": ({"ATEN_CPU_CAPABILITY": "avx2", "OMP_NUM_THREADS": "1"}, "1"),
    "default, 2 threads, -n 1": ({"ATEN_CPU_CAPABILITY": "default", "OMP_NUM_THREADS": "2"}, "1"),
}


def _cli(*args, env=None, timeout=3000) -> subprocess.CompletedProcess:
    return forked_cli.run(args, timeout=timeout, env=env)


def _run(tmp_path, name: str, *extra: str):
    changes, workers = CONFIGS[name]
    env = dict(os.environ)
    for key, value in changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    out = tmp_path / name.replace(",", "").replace(" ", "_")
    proc = _cli("check", *SELECTION, "-n", workers, "--out", str(out), *extra, env=env)
    assert proc.returncode in (0, 1), f"{name}: exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    doc = json.loads((out / "report.json").read_text())
    assert doc["run"]["complete"], name
    return proc, out, doc


def _statuses(doc) -> dict:
    return {f["id"]: (f["status"], f.get("max_ratio")) for f in doc["findings"]}


@pytest.mark.cli
def test_a_ledger_written_on_one_kernel_keeps_every_other_green_with_the_same_statuses(tmp_path):
    names = list(CONFIGS)
    _, out, first_doc = _run(tmp_path, names[0])
    first = _statuses(first_doc)
    assert len(first) >= 30, sorted(first)  # entropy and agg_loss, every dtype: nothing silently deselected
    statuses = {s for s, _ in first.values()}
    assert {"discrepancy", "pass"} <= statuses, statuses  # not vacuous: verl's known discrepancies are in it
    ledger = _cli("ledger", str(out / "report.json"), timeout=300)
    assert ledger.returncode == 0, ledger.stderr
    (tmp_path / "xfails.txt").write_text(ledger.stdout)
    book = parse_ledger(str(tmp_path / "xfails.txt"))
    assert book.defects, ledger.stdout  # a defect ledger: every failing finding is under one of its lines
    expected = {f["id"]: ("xfail" if f["id"] in book.findings or book.match(f) else f["status"])
                for f in first_doc["findings"]}
    assert "xfail" in expected.values()
    for name in names[1:]:
        proc, _, doc = _run(tmp_path, name, "--xfails", str(tmp_path / "xfails.txt"))
        run = _statuses(doc)
        assert set(run) == set(first), (name, sorted(set(first) ^ set(run)))
        differ = {i: (expected[i], first[i][1], run[i]) for i in sorted(run) if run[i][0] != expected[i]}
        assert not differ, f"{name}: verdicts that depend on the machine (expected, first ratio, this run):\n" + \
            "\n".join(f"{i}: {d}" for i, d in differ.items())
        assert proc.returncode == 0, f"{name}: exit {proc.returncode}\n{proc.stdout[-2000:]}"
