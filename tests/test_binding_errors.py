"""A binding that does not fit the engine version is a binding error, not an engine crash.

tests/bindings/adapter_mismatch.py: its ``masked_sum`` adapter passes a keyword the engine function lacks
(``binding_error`` naming the version and the missing name, no defect, its own report section, exit code 2);
its ``masked_mean`` imports a module that does not exist (that op ``unavailable``, the others still
checked); its ``masked_max`` engine code raises TypeError itself (still a ``crash``: the innermost frame is
not the adapter's)."""

from __future__ import annotations

import json
import os

import pytest

BINDING = os.path.join(os.path.dirname(__file__), "bindings", "adapter_mismatch.py")
import forked_cli


@pytest.mark.cli
def test_adapter_typeerror_is_a_binding_error_and_a_missing_module_takes_down_only_its_op(tmp_path):
    out = tmp_path / "r"
    proc = forked_cli.run(["check", "--engine", BINDING, "--op", "masked_sum",
         "--op", "masked_mean", "--op", "masked_max", "--property", "matches_reference", "--dtype", "float64",
         "--regime", "padded", "--max-examples", "5", "--out", str(out), "-q"],
        timeout=900)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "Traceback" not in proc.stdout + proc.stderr
    doc = json.loads((out / "report.json").read_text())
    by_op = {f["op"]: f for f in doc["findings"]}
    assert {op: f["status"] for op, f in by_op.items()} == {
        "masked_sum": "binding_error", "masked_mean": "unavailable", "masked_max": "crash"}, by_op
    msg = by_op["masked_sum"]["message"]
    assert "adapter_mismatch 0.1.0" in msg and "missing name: dp_size" in msg and "TypeError" in msg, msg
    assert "rlconform_no_such_engine" in by_op["masked_mean"]["message"]
    assert "softmax()" in by_op["masked_max"]["message"]
    assert doc["summary"]["binding_error"] == 1
    members = {m for d in doc["defects"] for m in d["members"]}
    assert members == {by_op["masked_max"]["id"]}, doc["defects"]  # the binding error is no defect
    md = (out / "report.md").read_text()
    assert "### Binding errors" in md and "`masked_sum` (1 finding(s))" in md
    failing_table = md.split("### All failing findings", 1)[1]
    assert "| binding_error |" not in failing_table
    assert "binding error, op masked_sum" in proc.stdout
