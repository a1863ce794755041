"""An engine that bends the harness in its own process cannot bend the verdict.

Each binding under ``tests/bindings/tamper_*.py`` wraps a buggy ``entropy`` (0.5× or bf16-rounded) in one
tamper vector: a process-wide bf16 patch of ``torch.log_softmax`` / ``softmax`` / ``exp`` at import, a
replaced ``rlconform.properties.generic.compare``, an edited ``tolerance.ATOL`` table, a tensor subclass
whose reading methods lie. The reference, the dtype-faithful path and the comparison run in the referee,
a process that never imports the engine, so the op is red (exit 1) every time. One regime, five examples
(the derandomized CI profile fails on the third)."""

from __future__ import annotations

import json
import os

import forked_cli
import pytest

BINDINGS = os.path.join(os.path.dirname(__file__), "bindings")
VECTORS = ["tamper_global_softmax", "tamper_compare", "tamper_atol", "tamper_subclass"]


@pytest.mark.cli
@pytest.mark.parametrize("vector", VECTORS)
def test_a_tampering_engine_stays_red(vector, tmp_path):
    out = tmp_path / "out"
    proc = forked_cli.run(["check", "--engine", os.path.join(BINDINGS, f"{vector}.py"),
         "--op", "entropy", "--property", "matches_reference", "--dtype", "float32", "--regime", "moderate",
         "--max-examples", "5", "--out", str(out), "-q", "--referee"],
        timeout=600)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads((out / "report.json").read_text())
    statuses = {f["id"]: f["status"] for f in doc["findings"]}
    assert statuses == {"entropy.matches_reference.float32.moderate": "discrepancy"}, statuses
    assert doc["run"]["judged_by"] == "referee"
    if vector == "tamper_atol":  # `replay` is refereed too: the saved case stays red in a fresh process
        rep = forked_cli.run(["replay",
             str(out / "cases" / "entropy.matches_reference.float32.moderate.json"),
             "--engine", os.path.join(BINDINGS, f"{vector}.py"), "--referee"], timeout=600)
        assert rep.returncode == 1 and "DISCREPANCY" in rep.stdout, rep.stdout[-2000:] + rep.stderr[-2000:]


@pytest.mark.cli
@pytest.mark.distributed
@pytest.mark.parametrize("referee", ["--referee", "--no-referee"])
def test_a_tampering_distributed_engine_is_red_only_under_the_referee(referee, tmp_path):
    """A distributed family (gloo ranks) is judged by the referee too: the ranks' raw outputs travel to it.
    Without the referee (``--no-referee``, for debugging only) the same tampering binding bends the verdict,
    which shows this test can fail."""
    out = tmp_path / "out"
    proc = forked_cli.run(["check", "--engine",
         os.path.join(BINDINGS, "tamper_distributed_compare.py"), "--op", "cp_masked_mean", "--property",
         "matches_reference", "--dtype", "float32", "--regime", "cp2_all_on", "--max-examples", "5",
         "--out", str(out), "-q", referee], timeout=600)
    doc = json.loads((out / "report.json").read_text())
    statuses = {f["id"]: f["status"] for f in doc["findings"]}
    expected = "discrepancy" if referee == "--referee" else "pass"
    assert statuses == {"cp_masked_mean.matches_reference.float32.cp2_all_on": expected}, \
        proc.stdout[-3000:] + proc.stderr[-3000:]


@pytest.mark.cli
def test_a_worker_cannot_choose_where_the_controller_writes_a_case_file(tmp_path):
    """The worker reports its reproducer at a path outside ``--out``: the controller writes the case file
    under ``OUT/cases/<finding id>.json`` and nothing at the worker's path."""
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere" / "planted.json"
    elsewhere.parent.mkdir()
    proc = forked_cli.run(["check", "--engine", os.path.join(BINDINGS, "tamper_case_path.py"),
         "--op", "entropy", "--property", "matches_reference", "--dtype", "float32", "--regime", "moderate",
         "--max-examples", "5", "--out", str(out), "-q"],
        env=dict(os.environ, RLCONFORM_TEST_TAMPER_PATH=str(elsewhere)), timeout=600)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert not elsewhere.exists()
    doc = json.loads((out / "report.json").read_text())
    [finding] = doc["findings"]
    assert finding["reproducer"]["case_file"] == "cases/entropy.matches_reference.float32.moderate.json"
    assert (out / "cases" / "entropy.matches_reference.float32.moderate.json").is_file()


@pytest.mark.cli
def test_replay_reads_a_reports_cases_only_under_its_cases_folder(tmp_path):
    """A report folder whose reproducer points outside ``DIR/cases`` (``../``, an absolute path, a symbolic
    link out) is refused with exit 2; the file is never read."""
    secret = tmp_path / "secret.json"
    secret.write_text("{}")
    report = tmp_path / "report"
    (report / "cases").mkdir(parents=True)
    (report / "cases" / "link.json").symlink_to(secret)
    for i, case_file in enumerate(["../secret.json", str(secret), "cases/../../secret.json", "cases/link.json"]):
        doc = {"findings": [{"id": f"f{i}", "reproducer": {"case_file": case_file}}]}
        (report / "report.json").write_text(json.dumps(doc))
        proc = forked_cli.run(["replay", "--report", str(report), f"f{i}"], timeout=600)
        assert proc.returncode == 2 and "replay reads cases only there" in proc.stderr, (case_file, proc.stderr[-2000:])


@pytest.mark.cli
@pytest.mark.parametrize("mode", ["disconnect-0", "disconnect-str", "xfail", "max_ratio"])
def test_no_field_of_the_workers_record_makes_a_finding_green(mode, tmp_path):
    """The controller computes the verdict-bearing fields from the referee's record: a worker that cuts its
    referee off, forges its example count, claims an xfail no ledger lists, or reports a rounding-sized
    error over tolerance leaves the 0.5× entropy red (exit 1)."""
    out = tmp_path / "out"
    proc = forked_cli.run(["check", "--engine", os.path.join(BINDINGS, "tamper_worker_record.py"),
         "--op", "entropy", "--property", "matches_reference", "--dtype", "float32", "--regime", "moderate",
         "--max-examples", "5", "--out", str(out), "-q"],
        env=dict(os.environ, RLCONFORM_TEST_TAMPER=mode), timeout=600)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    [finding] = json.loads((out / "report.json").read_text())["findings"]
    assert finding["status"] in ("discrepancy", "crash"), finding
    assert finding["xfail_listed"] is False
    # the forgery reached the report's writer (a binding patching what no longer runs would test nothing)
    assert "the engine's worker reported" in finding["message"], finding
    if mode == "max_ratio":
        assert finding["status"] == "discrepancy" and (finding["max_ratio"] is None or finding["max_ratio"] > 10)


@pytest.mark.cli
def test_a_selected_finding_the_worker_leaves_out_is_its_crash(tmp_path):
    out = tmp_path / "out"
    proc = forked_cli.run(["check", "--engine", os.path.join(BINDINGS, "tamper_worker_record.py"),
         "--op", "entropy", "--property", "matches_reference", "--dtype", "float32", "--regime", "moderate",
         "--max-examples", "5", "--out", str(out), "-q"],
        env=dict(os.environ, RLCONFORM_TEST_TAMPER="drop"), timeout=600)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads((out / "report.json").read_text())
    # one row, the selected id's, red: the green record under another id is not this test's and is dropped
    [finding] = doc["findings"]
    assert finding["id"] == "entropy.matches_reference.float32.moderate", doc["findings"]
    assert finding["status"] == "crash", finding
    assert "never reached the referee" in finding["message"] and ".elsewhere" in finding["message"], finding
    assert doc["run"]["complete"] is True and not doc["run"]["not_run"]
    # the first screen counts it
    assert "crash: **1**" in (out / "report.md").read_text()
