"""Report case files are relative to the report folder, and every reader resolves them there; older
reports with another machine's absolute paths still work."""

from __future__ import annotations

import json
import os

import forked_cli
import numpy as np
import pytest

from rlconform.harness.report import case_paths as CP
from rlconform.harness.report.diff import load
from rlconform.harness.report.writer import SCHEMA, rerender
from rlconform.harness.run.recorder import save_reproducer
from rlconform.properties.case import Case

FID = "masked_sum.matches_reference.float64.random"


def _case():
    return Case("masked_sum", "matches_reference", "float64", "random",
                {"values": np.array([[1.0, 2.0]]), "mask": np.array([[True, False]]), "garbage": 0.0})


def test_relative_and_resolve(tmp_path):
    rep = tmp_path / "rep"
    (rep / "cases").mkdir(parents=True)
    (rep / "cases" / "a.json").write_text("{}")
    assert CP.relative(str(rep), "cases/a.json") == "cases/a.json"
    assert CP.relative(str(rep), str(rep / "cases" / "a.json")) == "cases/a.json"
    assert CP.relative(str(rep), "/work/main/reports/verl-0.9.1/cases/a.json") == "cases/a.json"  # another machine
    assert CP.relative(str(rep), "/elsewhere/a.json") == "/elsewhere/a.json"
    assert CP.relative(str(rep), None) is None
    assert CP.resolve(str(rep), "cases/a.json") == os.path.join(str(rep), "cases/a.json")
    assert CP.resolve(str(rep), "/work/main/reports/verl-0.9.1/cases/a.json") == os.path.join(str(rep), "cases", "a.json")
    assert CP.resolve(str(rep), "/nowhere/b.json") == "/nowhere/b.json"


def test_recorder_writes_a_path_relative_to_the_report_folder(tmp_path):
    out = tmp_path / "out"
    rep = save_reproducer(str(out), FID, _case(), "reference", None)
    assert rep["case_file"] == f"cases/{FID}.json" and not os.path.isabs(rep["case_file"])
    assert (out / rep["case_file"]).exists()
    assert str(tmp_path) not in rep["case_file"]


def _old_report(tmp_path):
    """A report as committed before: absolute case_file paths of the machine that made it."""
    rep = tmp_path / "old"
    save_reproducer(str(rep), FID, _case(), "reference", None)
    finding = {"id": FID, "op": "masked_sum", "property": "matches_reference", "dtype": "float64", "regime": "random",
               "status": "discrepancy", "message": "m", "max_abs_err": 1.0, "max_rel_err": 1.0, "max_ratio": 9.0,
               "reproducer": {"case_file": f"/work/main/reports/verl-0.9.1/cases/{FID}.json",
                              "command": f"rlconform replay reports/verl-0.9.1/cases/{FID}.json --engine reference"}}
    doc = {"schema": SCHEMA, "tool": {"name": "rlconform", "version": "0"}, "engine": {"spec": "reference"},
           "run": {"complete": True, "started": "t", "finished": "t"},
           "summary": {"discrepancy": 1}, "findings": [finding]}
    (rep / "report.json").write_text(json.dumps(doc))
    return rep


def test_rerender_and_diff_make_an_older_reports_paths_relative(tmp_path):
    rep = _old_report(tmp_path)
    assert load(str(rep))["findings"][0]["reproducer"]["case_file"] == f"cases/{FID}.json"
    rerender(str(rep))
    doc = json.loads((rep / "report.json").read_text())
    assert doc["findings"][0]["reproducer"]["case_file"] == f"cases/{FID}.json"
    assert all(d["reproducer"]["case_file"] == f"cases/{FID}.json" for d in doc.get("defects", []) if d.get("reproducer"))


def _cli(*args, cwd):
    return forked_cli.run(args, cwd=cwd, timeout=600)


@pytest.mark.cli
def test_replay_by_finding_id_resolves_against_the_report_folder(tmp_path):
    rep = _old_report(tmp_path)  # an absolute path of another machine: found in the report's own cases/
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    ok = _cli("replay", FID, "--report", str(rep), "--engine", "reference", cwd=elsewhere)
    assert ok.returncode == 0 and "PASS" in ok.stdout, ok.stdout + ok.stderr
    rerender(str(rep))  # now relative: resolved against the report folder, not the current directory
    ok = _cli("replay", FID, "--report", str(rep), "--engine", "reference", cwd=elsewhere)
    assert ok.returncode == 0 and "PASS" in ok.stdout, ok.stdout + ok.stderr
    missing = _cli("replay", "no.such.finding", "--report", str(rep), cwd=elsewhere)
    assert missing.returncode == 2 and "no finding" in missing.stderr and "Traceback" not in missing.stderr
