"""Data never chooses code, and bad input to a command is one line, exit 2.

A case file, a corpus case or a report names an engine (``engine.spec``: here a script that leaves a
marker when it is imported, then aborts); no command imports it: ``replay`` and ``bisect`` refuse the case
without ``--engine``, ``fuzz`` replays its corpus on the engine of the command line, and ``diff``,
``report`` and ``ledger`` read reports as data. A deeply nested JSON (200 000 ``[``), a malformed report
and a million-line duplicate ledger are one line each, never a traceback.
"""

from __future__ import annotations

import json
import os
import subprocess

import forked_cli
import numpy as np
import pytest

from rlconform.harness.cli import main
from rlconform.properties.case import Case, save_case

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FID = "masked_mean.matches_reference.float32.padded"


@pytest.fixture
def evil(tmp_path, monkeypatch):
    """An engine spec that must never be imported: ``(spec, marker)``."""
    monkeypatch.delenv("RLCONFORM_ENGINE", raising=False)
    marker = tmp_path / "evil-imported"
    script = tmp_path / "evil.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\nimport os\nos.abort()\n")
    return str(script), marker


def _case(path, engine=None) -> str:
    case = Case("masked_mean", "matches_reference", "float32", "padded",
                {"values": np.array([[1.0, 2.0, 3.0, 4.0]]), "mask": np.array([[True, True, False, False]]),
                 "unbiased": True, "garbage": float("nan")})
    save_case(case, path)
    if engine is not None:
        doc = json.loads(open(path).read())
        doc["engine"] = {"spec": engine, "path": os.path.dirname(engine)}
        with open(path, "w") as fh:
            json.dump(doc, fh)
    return str(path)


def _report(path, engine_spec: str) -> str:
    os.makedirs(path, exist_ok=True)
    doc = {"schema": "rlconform.report/1", "tool": {"name": "rlconform", "version": "0"}, "run": {"complete": True},
           "engine": {"name": "evil", "spec": engine_spec, "path": "/"},
           "findings": [{"id": FID, "op": "masked_mean", "property": "matches_reference", "dtype": "float32",
                         "regime": "padded", "status": "discrepancy", "message": "x", "max_ratio": 2.0,
                         "reproducer": {"case_file": "cases/x.json", "command": f"rlconform replay x --engine {engine_spec}"}}]}
    with open(os.path.join(path, "report.json"), "w") as fh:
        json.dump(doc, fh)
    return str(path)


def _one_line_error(capsys) -> str:
    cap = capsys.readouterr()
    assert "Traceback" not in cap.out + cap.err
    lines = cap.err.strip().splitlines()
    assert len(lines) == 1, cap.err
    return lines[0]


@pytest.mark.cli
def test_bisect_never_runs_the_engine_a_case_file_names(tmp_path, evil, capsys):
    spec, marker = evil
    repo = tmp_path / "fork"
    repo.mkdir()
    (repo / "f.txt").write_text("x")
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    for cmd in (["init", "-q"], ["add", "f.txt"], ["commit", "-qm", "one"]):
        subprocess.run(["git", "-C", str(repo), *cmd], check=True, env=env, capture_output=True)
    case = _case(tmp_path / "case.json", engine=spec)
    assert main(["bisect", "--engine-path", str(repo), "--good", "HEAD", "--bad", "HEAD", case]) == 2
    line = _one_line_error(capsys)
    assert "bisect never runs an engine named by a case file" in line and f"--engine {spec}" in line
    assert not marker.exists()


@pytest.mark.cli
def test_fuzz_replays_its_corpus_on_the_engine_of_the_command_line(tmp_path, evil):
    spec, marker = evil
    corpus = tmp_path / "corpus"
    (corpus / FID).mkdir(parents=True)
    _case(corpus / FID / "0123456789abcdef.json", engine=spec)
    proc = forked_cli.run(["fuzz", "--engine", "reference", "--op",
                           "masked_mean", "--property", "matches_reference", "--dtype", "float32",
                           "--max-examples", "1", "--corpus", str(corpus), "--db", str(tmp_path / "db")],
                          cwd=tmp_path, timeout=600,
                          env={k: v for k, v in os.environ.items() if k != "RLCONFORM_ENGINE"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "reference" in proc.stdout and "Traceback" not in proc.stdout + proc.stderr
    assert not marker.exists()


@pytest.mark.cli
def test_report_commands_never_run_the_engine_a_report_names(tmp_path, evil, capsys):
    spec, marker = evil
    a, b = _report(tmp_path / "a", spec), _report(tmp_path / "b", spec)
    assert main(["diff", a, b]) == 0
    assert main(["ledger", a]) == 0
    assert main(["report", a]) == 0
    capsys.readouterr()
    assert not marker.exists()


@pytest.mark.cli
def test_deeply_nested_json_is_one_line_in_every_command(tmp_path, capsys):
    deep = tmp_path / "deep"
    deep.mkdir()
    (deep / "report.json").write_text("[" * 200_000)
    case = tmp_path / "deep-case.json"
    case.write_text('{"op": ' + "[" * 200_000)
    good = _report(tmp_path / "good", "reference")
    for argv in (["diff", str(deep), good], ["diff", good, str(deep)], ["report", str(deep)],
                 ["ledger", str(deep)], ["replay", str(case), "--engine", "reference"]):
        assert main(argv) == 2, argv
        assert "nested deeper than" in _one_line_error(capsys), argv


@pytest.mark.cli
@pytest.mark.parametrize("doc, says", [
    ({"findings": "nope"}, "findings is a str"),
    ({"findings": [{"id": FID}]}, "has no status"),
    ({"findings": [{"status": "pass"}]}, "has no id"),
    ({"findings": [None]}, "not an object"),
    ({"engine": "verl", "findings": []}, "engine is a str"),
    ([1, 2], "not a JSON object"),
    ({"no": "findings"}, "not an rlconform report"),
    ({"findings": []}, "no tool object"),
])
def test_ledger_and_report_refuse_malformed_reports_in_one_line(tmp_path, capsys, doc, says):
    (tmp_path / "report.json").write_text(json.dumps(doc))
    for cmd in ("ledger", "report") if "tool" not in says else ("report",):
        assert main([cmd, str(tmp_path)]) == 2
        assert says in _one_line_error(capsys)


def test_a_million_duplicate_ledger_lines_are_one_warning(tmp_path, capsys):
    from rlconform.harness.report.xfails import parse_xfails

    ledger = tmp_path / "xfails.txt"
    ledger.write_text(f"{FID}\n" * 1_000_000)
    warnings: list[str] = []
    assert parse_xfails(str(ledger), warnings=warnings) == {FID: ""}
    assert warnings == [f"{ledger}:2: {FID} is listed again (first on line 1), and 999998 more duplicate "
                        f"line(s); the duplicate lines are ignored"]
