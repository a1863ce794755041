"""Every mutant is caught by the property docs/bug-kinds.md names, under the CI profile; every generic property is
failed by at least one mutant; the reference engine passes everything it is checked on.

A mutant that declares ``CAUGHT_BY`` (finding ids of its ``EXPECTED`` / ``EXPECTED_CRASH`` pairs) is checked
on those findings only (``--findings``), with the CI profile's own examples (derandomized per finding, so
the same as in a check of the whole op): each listed finding must fail, and every declared pair must have
a listed finding (:func:`test_caught_by_covers_the_declared_pairs`). The findings of the op that the mutant
does not break pass and cost 20 examples each; they prove nothing about the mutant (the reference engine's
run, :func:`test_reference_engine_passes_everything`, proves they pass for a correct engine)."""

from __future__ import annotations

import importlib
import json
import shlex
import subprocess

import forked_cli
import pytest

from rlconform.harness.bindings.load import mutant_names
from rlconform.harness.catalog.ops import PROPERTIES

MUTANTS = mutant_names()
DISTRIBUTED_KINDS = ("vocab_parallel", "context_parallel", "dp_metric")


def run_cli(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return forked_cli.run(args, cwd=cwd, timeout=900)  # a fresh process, forked with torch imported


def expected(name: str) -> list[tuple[str, str]]:
    return importlib.import_module(f"rlconform.harness.mutants.{name}").EXPECTED


def expected_crash(name: str) -> list[tuple[str, str]]:
    """(op, property) pairs whose finding must be a ``crash``: a mutant of a "raises on a legal input"
    family (a degenerate batch raises) declares them in ``EXPECTED_CRASH``."""
    return list(getattr(importlib.import_module(f"rlconform.harness.mutants.{name}"), "EXPECTED_CRASH", []))


def caught_by(name: str) -> list[str]:
    """Finding ids that catch the mutant under the CI profile (optional ``CAUGHT_BY`` of its module)."""
    return list(getattr(importlib.import_module(f"rlconform.harness.mutants.{name}"), "CAUGHT_BY", []))


@pytest.mark.parametrize("name", [n for n in MUTANTS if caught_by(n)])
def test_caught_by_covers_the_declared_pairs(name):
    import re

    from rlconform.harness.core.opinfo import FINDING_ID

    ids = caught_by(name)
    declared = set(expected(name)) | set(expected_crash(name))
    bad = [i for i in ids if not re.fullmatch(FINDING_ID, i)]
    assert not bad, f"mutants.{name}: CAUGHT_BY entries that are not finding ids: {bad}"
    named = {tuple(i.split(".")[:2]) for i in ids}
    assert named <= declared, f"mutants.{name}: CAUGHT_BY names undeclared pairs {named - declared}"
    assert declared <= named, f"mutants.{name}: no CAUGHT_BY finding for {declared - named}"


def test_mutant_zoo_covers_every_property():
    failed_by_some = {prop for name in MUTANTS for _, prop in expected(name)}
    assert set(PROPERTIES) <= failed_by_some, f"no mutant fails {set(PROPERTIES) - failed_by_some}"


def test_zoo_has_a_mutant_per_single_process_family():
    assert len(MUTANTS) >= 10


@pytest.mark.cli
@pytest.mark.parametrize("name", MUTANTS)
def test_mutant_is_caught(name, tmp_path):
    pairs = expected(name)
    crash_pairs = expected_crash(name)
    real = list(getattr(importlib.import_module(f"rlconform.harness.mutants.{name}"), "EXPECTED_REAL_SHAPES", []))
    if real and not pairs and not crash_pairs:
        # a fault that only exists at real sizes: the CI profile's regimes of its ops pass (it is caught by
        # the nightly profile's real_shapes regime: tests/test_real_shapes.py)
        args = ["check", "--engine", f"mutants.{name}", "--out", str(tmp_path), "--profile", "ci", "-q",
                "--dtype", "float32", "-n", "0"]
        for op, prop in real:
            args += ["--op", op, "--property", prop]
        proc = run_cli(*args)
        assert proc.returncode == 0, f"mutants.{name} fails the CI regimes:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        with open(tmp_path / "report.json") as fh:
            doc = json.load(fh)
        assert doc["summary"]["pass"] >= 2 * len(real) and all(f["regime"] != "real_shapes" for f in doc["findings"])
        return
    assert pairs or crash_pairs, f"mutants.{name} declares neither EXPECTED nor EXPECTED_CRASH"
    # --fail-on precision: a mutant is caught when its findings fail, whatever their severity (a rounding-level
    # mutant's findings are `precision`, which the default --fail-on does not turn red)
    # --max-shrinks 0: a finding's status never depends on shrinking (harness/core/profiles.py), only its
    # reproducer's size, and the unshrunk reproducer is replayed below; the caught mutant stops at its first
    # failing example instead of spending up to 50 shrinking steps per failing finding
    out = tmp_path / "out"
    # --no-referee: a mutant is rlconform's own code and patches nothing at import, so judging in its process
    # gives the same verdicts (tests/test_referee_*.py prove the referee on engines that tamper); it saves the
    # referee's start, about 2 s of a 2-core machine per mutant
    # -n 0: a mutant is rlconform's own code, so it may run in the CLI's own process: no xdist worker to start
    # (the engine-isolation paths are proven by tests/test_robustness_*.py on engines that need them)
    args = ["check", "--engine", f"mutants.{name}", "--out", str(out), "--profile", "ci", "-q",
            "--fail-on", "precision", "--max-shrinks", "0", "--no-referee", "-n", "0"]
    for op in sorted({op for op, _ in pairs + crash_pairs}):
        args += ["--op", op]
    for prop in sorted({p for _, p in pairs + crash_pairs}):
        args += ["--property", prop]
    listed = caught_by(name)  # the findings that catch it, with the CI profile's examples; else its whole op
    if listed:
        (tmp_path / "caught_by.txt").write_text("\n".join(listed) + "\n")
        args += ["--findings", str(tmp_path / "caught_by.txt")]
    proc = run_cli(*args)
    assert proc.returncode == 1, f"mutants.{name} not caught (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    with open(out / "report.json") as fh:
        doc = json.load(fh)
    assert doc["run"]["complete"]
    by_id = {f["id"]: f["status"] for f in doc["findings"]}
    for fid in listed:
        assert by_id.get(fid) in ("discrepancy", "crash"), f"mutants.{name}: CAUGHT_BY {fid} is {by_id.get(fid)}"
    for op, prop in pairs:
        statuses = {f["status"] for f in doc["findings"] if f["op"] == op and f["property"] == prop}
        assert "discrepancy" in statuses, f"mutants.{name}: {op}.{prop} statuses {statuses}"
    for op, prop in crash_pairs:
        statuses = {f["status"] for f in doc["findings"] if f["op"] == op and f["property"] == prop}
        assert "crash" in statuses, f"mutants.{name}: {op}.{prop} statuses {statuses} (expected a crash)"
    # every discrepancy (or expected crash) comes with a reproducer that replays to the same verdict
    verdict = "discrepancy" if pairs else "crash"
    bad = [f for f in doc["findings"] if f["status"] == verdict]
    command = shlex.split(bad[0]["reproducer"]["command"])  # the command the report prints, engine included
    assert command[:2] == ["rlconform", "replay"] and command[command.index("--engine") + 1] == f"mutants.{name}"
    # --no-referee, as the check: the replay of a mutant then runs in the CLI's process (no child, no referee)
    replay = run_cli(*command[1:], "--no-referee")
    assert replay.returncode == 1, replay.stdout + replay.stderr
    assert verdict.upper() in replay.stdout


@pytest.mark.cli
def test_reference_engine_passes_everything(tmp_path):
    # every finding of the catalog (about 1400) with a few examples each: the full CI profile of the reference
    # engine runs in `make reports`-sized time, not in the self-tests (benchmarks and the nightly profile do it)
    proc = run_cli("check", "--engine", "reference", "--out", str(tmp_path), "--profile", "ci", "--max-examples", "4",
                   "-q", "-n", "2")
    with open(tmp_path / "report.json") as fh:
        doc = json.load(fh)
    bad = [f"{f['id']}: {f['status']}: {f['message'][:300]}" for f in doc["findings"] if f["status"] != "pass"]
    assert proc.returncode == 0 and not bad, "\n".join(bad) + proc.stdout[-2000:] + proc.stderr[-2000:]
    assert doc["summary"]["pass"] >= 1000
