"""JUnit XML through pytest (``rlconform check --junitxml``): one testcase per finding, failing findings are
failures, and each testcase carries the finding's status, errors and reproducer as scalar properties."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import forked_cli
import pytest


@pytest.mark.cli
def test_junit_xml_carries_finding_status(tmp_path):
    proc = forked_cli.run(["check", "--engine", "mutants.naive_entropy", "--op", "entropy",
         "--junitxml", "x.xml", "--max-examples", "5", "--out", "rep", "-q"],
        cwd=tmp_path, timeout=600)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    root = ET.parse(tmp_path / "x.xml").getroot()
    cases = root.findall(".//testcase")
    # one testcase per selected finding: entropy's 3 properties × 18 dtype/regime pairs, for the default
    # implementation and for the chunked one the mutant's base (the reference engine) also provides
    assert len(cases) == 2 * 54
    assert sum("chunked@" in tc.get("name") for tc in cases) == 54
    statuses = {}
    for tc in cases:
        props = {p.get("name"): p.get("value") for p in tc.findall("./properties/property")}
        fid = tc.get("name").split("[", 1)[1].rstrip("]")
        status = props["rlconform_status"]
        statuses[fid] = status
        assert int(props["rlconform_examples"]) >= 1
        assert all(not v.startswith("{") for v in props.values()), props  # scalars, not a dict's str()
        failed = tc.find("failure") is not None
        assert failed == (status in ("discrepancy", "crash", "xpass")), (fid, status)
        if status == "discrepancy":
            assert props["rlconform_reproducer"].startswith("rlconform replay ")
            assert float(props["rlconform_max_abs_err"]) >= 0
        else:
            assert "rlconform_reproducer" not in props
    # the NaN from 0·log 0 on -inf-padded vocab, in every dtype
    for dtype in ("float16", "bfloat16", "float32", "float64"):
        assert statuses[f"entropy.finite_where_reference_finite.{dtype}.neg_inf_padded"] == "discrepancy"
    assert statuses["entropy.non_destructive.float32.moderate"] == "pass"
