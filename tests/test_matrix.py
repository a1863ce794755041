"""The version matrix (issue 23 §3): defects per release, first seen / fixed in, ops a release cannot bind."""

from rlconform.harness.report.matrix_md import matrix_doc, matrix_markdown, missing_name
from rlconform.harness.run.matrix import MatrixError, parse_versions

import pytest


def _finding(op, status, message="", fid=None):
    return {"id": fid or f"{op}.matches_reference.float32.moderate", "op": op, "property": "matches_reference",
            "dtype": "float32", "regime": "moderate", "status": status, "message": message,
            "engine_function": {"function": "masked_mean", "module": "fake.core", "file": "fake/core.py",
                                "line": 3} if status == "discrepancy" else None,
            "crash_frame": None}


def _reports():
    old = {"engine": {"version": "1"}, "run": {"complete": True}, "findings": [
        _finding("masked_mean", "discrepancy", "value: engine 0.5 vs reference 1.0"),
        _finding("masked_var", "unavailable", "op 'masked_var' unavailable: AttributeError: module 'fake.core' "
                 "has no attribute 'masked_var'")]}
    new = {"engine": {"version": "2"}, "run": {"complete": True}, "findings": [
        _finding("masked_mean", "pass"), _finding("masked_var", "pass")]}
    return {"1": old, "2": new}


def test_defect_fixed_and_missing_function_named():
    doc = matrix_doc("fake", _reports(), source="test", options={"profile": "ci", "ops": []})
    (d,) = doc["defects"]
    assert d["versions"] == {"1": "present", "2": "absent"}
    assert (d["first_seen"], d["fixed_in"]) == ("1", "2")
    unbound = doc["releases"]["1"]["unbound"]
    assert unbound["masked_var"]["missing"] == "fake.core.masked_var"
    assert doc["releases"]["2"]["unbound"] == {}
    md = matrix_markdown(doc)
    assert "fake.core.masked_var" in md and "| 1 | 2 |" in md


def test_defect_still_present_has_no_fix():
    reports = _reports()
    reports["2"]["findings"][0] = _finding("masked_mean", "discrepancy", "value")
    (d,) = matrix_doc("fake", reports, source="test", options={})["defects"]
    assert d["fixed_in"] is None


def test_missing_names():
    assert missing_name("cannot import name 'Metric' from 'verl.utils.metric' (x)") == "verl.utils.metric.Metric"
    assert missing_name("TypeError: compute_value_loss() got an unexpected keyword argument 'dp_size'") == \
        "keyword dp_size of compute_value_loss"
    assert missing_name("No module named 'verl.utils.metric'") == "verl.utils.metric"


def test_bad_versions():
    with pytest.raises(MatrixError):
        parse_versions(" , ")
    with pytest.raises(MatrixError):
        parse_versions("1,1")
