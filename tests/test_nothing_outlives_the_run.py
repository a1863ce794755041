"""Nothing an engine starts outlives the run, and the files are what the run recorded.

The planted binding ``tests/bindings/detached_rewriter.py`` leaves, from inside its op call, a detached
process (double fork, new session) that keeps rewriting report.json / report.md to "all pass" and emptying
cases/. ``rlconform check`` ends it with the run (the controller is a child subreaper and kills every
descendant the run started) and then writes the files from its own record: the report stays red, the
reproducer stays, the exit code stays 1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import forked_cli
import pytest

from rlconform.harness.workers.reaper import Reaper, descendants

BINDINGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bindings")


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


@pytest.mark.cli
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="child subreapers and /proc are Linux's")
def test_a_detached_rewriter_is_ended_and_the_files_stay_as_recorded(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "RLCONFORM_TEST_OUT": str(out)}
    env.pop("RLCONFORM_ENGINE", None)
    proc = forked_cli.run(["check", "--engine",
                           os.path.join(BINDINGS, "detached_rewriter.py"), "--op", "masked_sum", "--property",
                           "matches_reference", "--dtype", "float64", "--regime", "all_on", "--max-examples", "3",
                           "--out", str(out), "-q"], env=env, timeout=600)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    pid = int((tmp_path / "out.pid").read_text())
    assert not _running(pid), "the detached process outlived the run"
    doc = json.loads((out / "report.json").read_text())
    # a string, not a tuple: pytest prints a message string whole (a tuple's repr is cut to one line)
    assert doc["run"]["complete"], f"{doc['run']}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    [f] = doc["findings"]
    assert f["status"] == "discrepancy" and f["severity"], f
    assert os.path.exists(out / f["reproducer"]["case_file"])  # stored relative to the report folder
    assert "all pass" not in (out / "report.md").read_text() and "discrepancy" in (out / "report.md").read_text()
    assert (out / "report.html").exists()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="child subreapers and /proc are Linux's")
def test_the_reaper_ends_an_orphan_in_a_new_session_and_spares_what_was_there_before():
    before = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        reaper = Reaper()
        child = os.fork()
        if child == 0:
            os.setsid()
            if os.fork() == 0:
                os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(600)"])
            os._exit(0)
        os.waitpid(child, 0)
        orphan = next(iter(reaper.alive()), None)  # re-parented to this process, the subreaper
        assert orphan is not None and orphan in descendants()
        assert reaper.end() == [orphan] and not _running(orphan) and not reaper.alive()
        assert before.poll() is None  # started before the reaper: not its business
        reaper.close()
    finally:
        before.kill()
        before.wait()


def test_seal_rewrites_tampered_files_from_the_record(tmp_path):
    from rlconform.harness.report.writer import ReportWriter

    w = ReportWriter(str(tmp_path), engine={"name": "e", "spec": "e"}, run={})
    w.add({"id": "masked_sum.matches_reference.float64.all_on", "op": "masked_sum",
           "property": "matches_reference", "dtype": "float64", "regime": "all_on", "status": "discrepancy",
           "message": "x", "max_ratio": 2.0})
    case = tmp_path / "cases" / "masked_sum.matches_reference.float64.all_on.json"
    case.parent.mkdir()
    case.write_text('{"op": "masked_sum"}')
    w.write(complete=True, html=False)
    recorded = (tmp_path / "report.json").read_text()
    (tmp_path / "report.json").write_text("{}")
    (tmp_path / "report.md").write_text("all pass")
    case.unlink()
    (tmp_path / "cases" / "planted.json").write_text("{}")
    assert w.seal({str(case): b'{"op": "masked_sum"}'}) == []
    assert (tmp_path / "report.json").read_text() == recorded
    assert "all pass" not in (tmp_path / "report.md").read_text()
    assert sorted(os.listdir(tmp_path / "cases")) == [case.name] and (tmp_path / "report.html").exists()
