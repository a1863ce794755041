"""One report folder, one run; and no leftovers of another run in it.

* a second run on a folder that a run holds (the ``fcntl`` lock of :mod:`rlconform.harness.run.outdir`)
  stops at once with a clear error (exit 2) naming the holder;
* ``--out`` that is a file, or cannot be created: exit 2 with a message, no traceback;
* a reused folder loses the previous run's ``report.*``, reproducers and ``.tmp-*`` files (what a
  killed run leaves), and keeps everything else;
* a failed atomic write leaves no ``.tmp-*`` file.
"""

from __future__ import annotations

import json
import os

import pytest

from rlconform.harness.cli import main
from rlconform.harness.run.outdir import OutDirError, claim


@pytest.mark.cli
def test_a_held_folder_is_refused_with_the_holders_pid(tmp_path, capsys):
    out = tmp_path / "out"
    with claim(str(out)):
        with pytest.raises(OutDirError, match=f"pid {os.getpid()}"):
            claim(str(out))
        code = main(["check", "--engine", "reference", "--op", "masked_sum", "--out", str(out)])
        err = capsys.readouterr().err
        assert code == 2 and "another rlconform run" in err and str(os.getpid()) in err
    with claim(str(out)):  # released: usable again
        pass


@pytest.mark.cli
def test_out_that_is_a_file_or_cannot_be_created(tmp_path, capsys):
    f = tmp_path / "a_file"
    f.write_text("x")
    assert main(["check", "--op", "masked_sum", "--out", str(f)]) == 2
    assert "is a file" in capsys.readouterr().err
    assert main(["check", "--op", "masked_sum", "--out", str(f / "sub")]) == 2
    err = capsys.readouterr().err
    assert "cannot create the report folder" in err and "Traceback" not in err


def test_a_reused_folder_keeps_nothing_of_the_previous_run(tmp_path):
    out = tmp_path / "out"
    (out / "cases").mkdir(parents=True)
    old_case = out / "cases" / "entropy.matches_reference.float32.moderate.json"
    old_case.write_text("{}")
    (out / "report.html").write_text("<html>OLD RUN</html>")
    (out / "report.json").write_text("{}")
    (out / ".tmp-abc123report.json").write_text("{")  # what a kill during an atomic write leaves
    (out / "notes.txt").write_text("mine")
    (out / "cases" / "README").write_text("mine too")
    with claim(str(out)):
        pass
    assert not old_case.exists() and not (out / ".tmp-abc123report.json").exists()
    assert not (out / "report.html").exists() and not (out / "report.json").exists()
    assert (out / "notes.txt").read_text() == "mine" and (out / "cases" / "README").exists()


def test_a_failed_atomic_write_leaves_no_temporary_file(tmp_path, monkeypatch):
    from rlconform.harness.report import writer as R

    writer = R.ReportWriter(str(tmp_path), engine={"spec": "x"}, run={})

    def no_space(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(R.os, "replace", no_space)
    with pytest.raises(R.ReportWriteError, match="No space left on device"):
        writer.write()
    monkeypatch.undo()
    assert [p for p in os.listdir(tmp_path) if p.startswith(".tmp-")] == []


def test_memory_error_while_writing_the_report_is_a_report_error(tmp_path, monkeypatch):
    from rlconform.harness.report import writer as R

    writer = R.ReportWriter(str(tmp_path), engine={"spec": "x"}, run={})

    def out_of_memory(doc):
        raise MemoryError

    monkeypatch.setattr(R, "render_markdown", out_of_memory)
    with pytest.raises(R.ReportWriteError, match="MemoryError"):
        writer.write()


@pytest.mark.cli
@pytest.mark.slow
def test_a_check_in_a_reused_folder_reports_only_itself(tmp_path):
    out = tmp_path / "out"
    (out / "cases").mkdir(parents=True)
    (out / "cases" / "entropy.matches_reference.float32.moderate.json").write_text("{}")
    (out / "report.html").write_text("<html>OLD RUN</html>")
    code = main(["check", "--engine", "reference", "--op", "masked_sum", "--property", "matches_reference",
                 "--dtype", "float64", "--max-examples", "2", "--out", str(out), "-q"])
    assert code == 0
    doc = json.loads((out / "report.json").read_text())
    assert {f["op"] for f in doc["findings"]} == {"masked_sum"} and doc["run"]["complete"]
    assert "OLD RUN" not in (out / "report.html").read_text()
    assert not (out / "cases").exists()


def test_the_report_is_rewritten_at_most_every_few_writes_time_and_the_last_finding_reaches_it(tmp_path, monkeypatch):
    # a write runs the whole triage: rewriting after every finding grew with the square of the findings
    # (verl's 1,777: the report writer was the check's largest cost); a timer writes what the last add left
    import time

    from rlconform.harness.report import writer as R

    writes = []
    real = R.ReportWriter._write

    def counted(self, **kw):
        time.sleep(0.05)  # a write that takes a while: the next may come 4 x 0.05 s later at the earliest
        real(self, **kw)
        writes.append(len(self.findings))  # written

    monkeypatch.setattr(R.ReportWriter, "_write", counted)
    monkeypatch.setattr(R, "WRITE_INTERVAL_S", 0.3)
    w = R.ReportWriter(str(tmp_path), engine={"spec": "x"}, run={})
    for i in range(40):
        w.add({"id": f"masked_sum.matches_reference.float64.r{i}", "op": "masked_sum", "property": "matches_reference",
               "dtype": "float64", "regime": f"r{i}", "status": "pass", "message": ""})
    assert 1 <= len(writes) < 40, writes
    deadline = time.monotonic() + 120  # only catches a timer that never fires
    while time.monotonic() < deadline and (not writes or writes[-1] < 40):
        time.sleep(0.05)
    doc = json.loads((tmp_path / "report.json").read_text())
    assert len(doc["findings"]) == 40 and doc["run"]["complete"] is False
    w.write(complete=True, html=False)  # the end of the run writes at once
    assert json.loads((tmp_path / "report.json").read_text())["run"]["complete"] is True


def test_a_timer_write_that_failed_is_raised_by_the_next_add(tmp_path, monkeypatch):
    import time

    from rlconform.harness.report import writer as R

    monkeypatch.setattr(R, "WRITE_INTERVAL_S", 0.2)
    w = R.ReportWriter(str(tmp_path), engine={"spec": "x"}, run={})
    finding = {"id": "masked_sum.matches_reference.float64.a", "op": "masked_sum", "property": "matches_reference",
               "dtype": "float64", "regime": "a", "status": "pass", "message": ""}
    w.add(finding)  # written at once
    monkeypatch.setattr(R.os, "replace", lambda src, dst: (_ for _ in ()).throw(OSError(28, "No space left on device")))
    w.add(dict(finding, id="masked_sum.matches_reference.float64.b", regime="b"))  # left to the timer
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and w._timer is not None:
        time.sleep(0.05)
    with pytest.raises(R.ReportWriteError, match="No space left on device"):
        w.add(dict(finding, id="masked_sum.matches_reference.float64.c", regime="c"))
