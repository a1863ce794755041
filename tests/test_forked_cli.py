"""``tests/forked_cli.py`` (the CLI forked from a server with torch imported) behaves as a subprocess of the
CLI: same exit code and output, the caller's cwd and environment, a timeout that kills, a fallback to a
plain subprocess for an environment read at import, and every module-level ``RLCONFORM_*`` read known."""

from __future__ import annotations

import json
import pathlib
import re
import subprocess
import sys

import forked_cli
import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
MUTANT = ["check", "--engine", "mutants.naive_entropy", "--op", "entropy", "--property", "finite_where_reference_finite",
          "--dtype", "float32", "--regime", "neg_inf_padded", "--max-examples", "3", "--max-shrinks", "0", "-q",
          "--no-referee", "-n", "0"]


def _plain(args, **kw):
    return subprocess.run([sys.executable, "-m", "rlconform.harness.cli", *args], capture_output=True, text=True,
                          timeout=900, **kw)


@pytest.mark.cli
def test_a_forked_check_gives_what_a_subprocess_gives(tmp_path):
    cpu_before = forked_cli.cpu_seconds
    # the server's own environment: forked whatever an earlier test of this process left in os.environ
    forked = forked_cli.run([*MUTANT, "--out", "o"], cwd=tmp_path, env=dict(forked_cli._Server.get().env))
    # the child's CPU seconds come back with it (this process's RUSAGE_CHILDREN never sees the server's children)
    assert forked_cli.cpu_seconds - cpu_before > 0.1
    plain = _plain([*MUTANT, "--out", "p"], cwd=tmp_path)
    assert forked.returncode == plain.returncode == 1, forked.stdout + forked.stderr
    assert forked.stdout.replace("o/cases", "p/cases") == plain.stdout
    docs = [json.loads((tmp_path / d / "report.json").read_text()) for d in ("o", "p")]
    assert [[(f["id"], f["status"], f["message"]) for f in d["findings"]] for d in docs] == [
        [(f["id"], f["status"], f["message"]) for f in docs[1]["findings"]]] * 2


@pytest.mark.cli
def test_the_callers_environment_reaches_the_child_and_an_import_time_variable_falls_back(tmp_path, monkeypatch):
    monkeypatch.setenv("RLCONFORM_ENGINE", "mutants.naive_entropy")  # read by the CLI when it runs
    args = [a for a in MUTANT if a not in ("--engine", "mutants.naive_entropy")]
    proc = forked_cli.run([*args, "--out", str(tmp_path / "o")])
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert json.loads((tmp_path / "o" / "report.json").read_text())["engine"]["spec"] == "mutants.naive_entropy"
    server = forked_cli._Server.get()
    assert server.can_fork(dict(server.env, RLCONFORM_ENGINE="x"))
    assert server.can_fork(dict(server.env, **{name: "0" for name in forked_cli.SET_BY_ENGINE_IMPORTS}))
    assert server.can_fork(dict(server.env, PYTEST_CURRENT_TEST="tests/test_other.py::test_other (call)"))
    for name in ("ATEN_CPU_CAPABILITY", "OMP_NUM_THREADS", *forked_cli.READ_AT_IMPORT):
        assert not server.can_fork(dict(server.env, **{name: "1"})), name


@pytest.mark.cli
def test_a_later_test_of_the_same_process_forks_too(monkeypatch):
    forked_cli.run(["--help"])  # the server exists, started under this test's PYTEST_CURRENT_TEST
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "tests/test_other.py::test_other (call)")  # as pytest sets it
    before = forked_cli.forked_calls
    proc = forked_cli.run(["--help"])
    assert proc.returncode == 0, proc.stderr
    assert forked_cli.forked_calls == before + 1  # forked, not a subprocess


@pytest.mark.cli
def test_a_call_past_its_timeout_is_killed_and_raises(tmp_path):
    slow = ["check", "--engine", "reference", "--op", "entropy", "--max-examples", "500", "-q", "--no-referee", "-n", "0"]
    with pytest.raises(subprocess.TimeoutExpired):
        forked_cli.run([*slow, "--out", "o"], cwd=tmp_path, timeout=0.5)
    assert forked_cli.run(["list-ops"]).returncode == 0  # the server answers the next call


@pytest.mark.cli
def test_every_module_level_read_of_an_rlconform_variable_is_listed():
    read = set()
    for path in (p for folder in ("harness", "properties", "reference", "distributed_tests")
                 for p in (REPO / folder).glob("**/*.py")):
        for line in path.read_text().splitlines():
            if not line[:1].isspace():  # at module level: evaluated when the module is imported
                read |= set(re.findall(r"environ(?:\.get\(|\[)\s*[\"'](RLCONFORM_\w+)", line))
    assert read, "the scan finds nothing: it cannot fail"
    assert read <= set(forked_cli.READ_AT_IMPORT), read - set(forked_cli.READ_AT_IMPORT)


def test_the_server_holds_no_engine_module_so_a_forked_check_makes_its_clean_copy():
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import forked_cli; forked_cli._warm_up(); "
            "from rlconform.properties.referee import engine_modules; from rlconform.harness.workers import zygote; "
            "print(engine_modules(), zygote.why_not(lambda: None))")
    proc = subprocess.run([sys.executable, "-P", "-c", code, str(REPO / "tests")], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["[]", "None"], proc.stdout
