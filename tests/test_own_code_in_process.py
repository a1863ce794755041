"""``check -n 0`` and ``replay --no-referee`` run rlconform's own code (the reference engine, ``mutants.*``) in the
CLI's process, saving a worker's start; the verdicts are the same as in a worker, and no engine package may
run there (harness/cli.py)."""

from __future__ import annotations

import json
import shlex
import subprocess

import forked_cli
import pytest


def cli(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return forked_cli.run(args, cwd=cwd, timeout=900)


@pytest.mark.cli
@pytest.mark.parametrize("spec", ["verl", "skyrl", "tests/bindings/anything.py", "some.module:binding"])
def test_an_engine_package_never_runs_in_the_clis_process(spec, tmp_path):
    proc = cli("check", "--engine", spec, "-n", "0", "--out", str(tmp_path / "o"))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "-n 0 runs the engine in this process" in proc.stderr and "use -n 1 or more" in proc.stderr
    assert not (tmp_path / "o").exists()


@pytest.mark.cli
def test_a_mutant_gets_the_same_findings_in_process_as_in_a_worker(tmp_path):
    """The same narrowed check of a mutant with ``-n 0`` and ``-n 1``: every finding has the same status and
    the same worst example; each one's reproducer replays to the same verdict in process (``--no-referee``) and
    in a child process (with the referee)."""
    sel = ["check", "--engine", "mutants.naive_entropy", "--op", "entropy", "--dtype", "float32",
           "--max-examples", "4", "--no-referee", "-q"]
    docs = {}
    for n in ("0", "1"):
        proc = cli(*sel, "-n", n, "--out", str(tmp_path / f"n{n}"))
        assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
        docs[n] = json.loads((tmp_path / f"n{n}" / "report.json").read_text())
        assert docs[n]["run"]["complete"]
    by_id = {n: {f["id"]: (f["status"], f["message"]) for f in d["findings"]} for n, d in docs.items()}
    assert by_id["0"] and by_id["0"] == by_id["1"]
    failing = [f for f in docs["0"]["findings"] if f["status"] == "discrepancy"]
    assert failing, "the mutant must fail somewhere for the comparison to mean anything"
    command = shlex.split(failing[0]["reproducer"]["command"])
    inproc = cli(*command[1:], "--no-referee")
    child = cli(*command[1:], "--referee")
    assert inproc.returncode == child.returncode == 1, inproc.stdout + inproc.stderr + child.stdout + child.stderr
    verdict = [ln for ln in inproc.stdout.splitlines() if ln.startswith("DISCREPANCY")]
    assert verdict and verdict == [ln for ln in child.stdout.splitlines() if ln.startswith("DISCREPANCY")]
