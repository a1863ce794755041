"""``rlconform diff`` never calls a break a fix.

Two reports are built in each test. A finding that is ``error`` in HEAD was not checked: it is not fixed,
and the diff is red saying so; an incomplete HEAD is red and names what was not run; a defect is fixed only
when every member passes in HEAD, and a defect whose members fail in HEAD with another signature or
severity is *changed* and fails at or above ``--fail-on``.
"""

from __future__ import annotations

import json

import pytest

from rlconform.harness.cli import main
from rlconform.harness.report.diff import compare, load

HALF = "value: engine 0.5 vs reference 1.0 at flat index 0: abs err 0.5, rel err 0.5, 64 ulp, tolerance 0.0256"
A, B = "entropy.matches_reference.float32.moderate", "entropy.matches_reference.bfloat16.moderate"


def _f(fid, status="discrepancy", message=HALF, ratio=2.0):
    op, prop, dtype, regime = fid.split(".")
    return {"id": fid, "op": op, "property": prop, "dtype": dtype, "regime": regime, "status": status,
            "message": message if status != "pass" else "", "max_ratio": ratio, "max_rel_err": 0.5,
            "worst_input": "x"}


def _write(path, findings, engine="verl", **run):
    path.mkdir(parents=True, exist_ok=True)
    doc = {"engine": {"name": engine, "spec": engine}, "findings": findings}
    if run:
        doc["run"] = run
    (path / "report.json").write_text(json.dumps(doc))
    return str(path)


def _one_line_error(capsys) -> str:
    cap = capsys.readouterr()
    assert "Traceback" not in cap.out + cap.err
    lines = cap.err.strip().splitlines()
    assert len(lines) == 1, cap.err
    return lines[0]


@pytest.mark.cli
def test_error_in_head_is_not_fixed_and_the_diff_is_red(tmp_path, capsys):
    base = _write(tmp_path / "base", [_f(A, ratio=20.0), _f(B, ratio=20.0)])
    head = _write(tmp_path / "head", [_f(A, status="error", message="strategy failed"), _f(B, status="pass")])
    change = compare(load(base), load(head))
    assert [x["id"] for x in change["findings"]["fixed"]] == [B]
    assert [x["id"] for x in change["findings"]["unchecked"]] == [A]
    assert change["defects"]["fixed"] == []  # A, a member, was not checked in HEAD
    assert main(["diff", base, head]) == 1
    out = capsys.readouterr().out
    assert "Not checked in the head" in out and "1 finding(s) are `error` in the head" in out and A in out
    assert "1 fixed" in out and "defects: 0 new, 0 fixed" in out  # B is a fixed finding; the defect is not fixed


@pytest.mark.cli
def test_error_in_head_alone_is_red(tmp_path, capsys):
    """Every failing finding of BASE in ``error`` in HEAD: once "465 findings fixed, exit 0"."""
    base = _write(tmp_path / "base", [_f(A), _f(B)])
    head = _write(tmp_path / "head", [_f(A, status="error"), _f(B, status="error")])
    assert main(["diff", base, head, "--fail-on", "imprecise"]) == 1
    out = capsys.readouterr().out
    assert "fixed" not in out.replace("neither passing nor fixed", "") and "2 finding(s) are `error`" in out


@pytest.mark.cli
def test_an_incomplete_head_is_red_and_names_what_was_not_run(tmp_path, capsys):
    base = _write(tmp_path / "base", [_f(A, status="pass"), _f(B, status="pass")])
    head = _write(tmp_path / "head", [_f(A, status="pass")], complete=False, not_run=[B], interrupted=True)
    assert main(["diff", base, head]) == 1
    out = capsys.readouterr().out
    assert "the head run is incomplete (`complete: false`, it was interrupted)" in out and B in out
    complete = _write(tmp_path / "complete", [_f(A, status="pass")], complete=True)
    assert main(["diff", base, complete]) == 0


@pytest.mark.cli
def test_a_defect_whose_members_fail_with_a_new_signature_is_changed_not_fixed(tmp_path, capsys):
    """Imprecise (ratio 2, "inexact value") in BASE, wrong (ratio 20, "wrong value") in HEAD."""
    base = _write(tmp_path / "base", [_f(A, ratio=2.0), _f(B, ratio=2.0)])
    head = _write(tmp_path / "head", [_f(A, ratio=20.0), _f(B, ratio=20.0)])
    b, h = load(base), load(head)
    assert [d["severity"] for d in b["defects"]] == ["precision"] and [d["severity"] for d in h["defects"]] == ["training"]
    assert b["defects"][0]["id"] != h["defects"][0]["id"]
    change = compare(b, h)
    assert change["defects"]["fixed"] == [] and change["defects"]["new"] == []
    [moved] = change["defects"]["changed"]
    assert moved["id"] == b["defects"][0]["id"] and moved["fails"] and moved["severity"] == "training"
    assert h["defects"][0]["id"] in moved["after"]
    assert {c["id"] for c in change["findings"]["changed"]} == {A, B}
    assert main(["diff", base, head]) == 1
    out = capsys.readouterr().out
    assert "0 fixed" in out and "Changed defects" in out and "inexact value" in out and "wrong value" in out
    # the reverse (wrong → imprecise) is a change too, but the severity fell: not red under --fail-on wrong
    assert main(["diff", head, base]) == 0
    assert "1 changed" in capsys.readouterr().out
    # ... and red under --fail-on imprecise: the signature changed
    assert main(["diff", head, base, "--fail-on", "imprecise"]) == 1


@pytest.mark.cli
def test_a_defect_is_fixed_only_when_every_member_passes(tmp_path, capsys):
    base = _write(tmp_path / "base", [_f(A), _f(B)])
    half = _write(tmp_path / "half", [_f(A, status="pass"), _f(B)])
    change = compare(load(base), load(half))
    assert change["defects"]["fixed"] == [] and len(change["defects"]["changed"]) == 1
    assert [x["id"] for x in change["findings"]["fixed"]] == [A]
    both = _write(tmp_path / "both", [_f(A, status="pass"), _f(B, status="pass")])
    change = compare(load(base), load(both))
    assert len(change["defects"]["fixed"]) == 1 and change["defects"]["changed"] == []
    assert main(["diff", base, both]) == 0
    assert "1 fixed" in capsys.readouterr().out


@pytest.mark.cli
def test_a_severity_change_of_one_finding_is_changed_and_fails_at_fail_on(tmp_path, capsys):
    base = _write(tmp_path / "base", [_f(A, ratio=2.0)])
    head = _write(tmp_path / "head", [_f(A, ratio=20.0)])
    [c] = compare(load(base), load(head))["findings"]["changed"]
    assert c["rose"] and c["fails"] and c["before"].startswith("precision") and c["after"].startswith("training")
    assert main(["diff", base, head]) == 1
    capsys.readouterr()


@pytest.mark.cli
@pytest.mark.parametrize("findings, says", [
    ([{"id": A, "op": "entropy", "property": "matches_reference"}], f"finding {A} has no status"),
    ("nope", "findings is a str, not a list"),
    ([[1, 2]], "finding 0 is a list, not an object"),
    ([{"id": A, "op": "entropy", "property": "matches_reference", "status": "fine"}], "status 'fine'"),
    ([dict(_f(A), message=["x"])], "message is a list, not a string"),
    ([dict(_f(A), max_ratio="big")], "max_ratio is a str, not a number"),
])
def test_malformed_findings_are_refused_in_one_line(tmp_path, capsys, findings, says):
    good = _write(tmp_path / "good", [_f(A)])
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "report.json").write_text(json.dumps({"engine": {"name": "verl"}, "findings": findings}))
    for argv in (["diff", good, str(bad)], ["diff", str(bad), good]):
        assert main(argv) == 2
        assert says in _one_line_error(capsys)


@pytest.mark.cli
def test_reports_of_two_engines_are_refused_unless_told(tmp_path, capsys):
    verl = _write(tmp_path / "verl", [_f(A)], engine="verl")
    skyrl = _write(tmp_path / "skyrl", [_f(A)], engine="skyrl")
    assert main(["diff", verl, skyrl]) == 2
    line = _one_line_error(capsys)
    assert "'verl'" in line and "'skyrl'" in line and "--cross-engine" in line
    assert main(["diff", verl, skyrl, "--cross-engine"]) == 0
    assert "verl → skyrl" in capsys.readouterr().out


@pytest.mark.parametrize("base_status", ["pass", "discrepancy"])
def test_a_binding_error_in_head_is_unchecked_and_red(tmp_path, base_status):
    from rlconform.harness.report.diff import exit_code, render_markdown

    base = load(_write(tmp_path / "base", [_f(A, status=base_status, ratio=20.0)]))
    head = load(_write(tmp_path / "head", [_f(A, status="binding_error", message="AttributeError: no agg_loss")]))
    change = compare(base, head)
    assert [x["id"] for x in change["findings"]["unchecked"]] == [A]
    assert change["findings"]["fixed"] == []
    assert exit_code(change) == 1
    md = render_markdown(base, head, change)
    assert "1 finding(s) are `binding_error` in the head: the binding does not fit" in md
    assert "binding error **1**" in md


def test_an_op_newly_unavailable_in_head_is_new_and_red_and_counted(tmp_path):
    from rlconform.harness.report.diff import exit_code, render_markdown
    from rlconform.harness.report.worker_only import worker_only_counts

    base = load(_write(tmp_path / "base", [_f(A, status="pass", ratio=0.1), _f(B, status="pass", ratio=0.1)]))
    head = load(_write(tmp_path / "head", [_f(A, status="unavailable", message="unavailable: ImportError: x"),
                                           _f(B, status="unavailable", message="unavailable: ImportError: x")]))
    change = compare(base, head)
    assert sorted(x["id"] for x in change["findings"]["new"]) == sorted([A, B])
    assert exit_code(change) == 1
    assert worker_only_counts(head) == {"unavailable": 2}
    assert "unavailable **2**" in render_markdown(base, head, change)
    # listed in a ledger it still counts as what the engine's process reported
    head["findings"][0].update(status="xfail", xfail_of="unavailable")
    assert worker_only_counts(head) == {"unavailable": 2}
    assert worker_only_counts(base) == {}
