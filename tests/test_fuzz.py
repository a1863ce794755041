"""``rlconform fuzz``: finds and saves (shrunk) counterexamples of bundled mutants within a few examples; the
next ``rlconform check`` in the same folder replays the saved case before drawing new examples and fails
on it; Ctrl-C stops cleanly and keeps what was found; usage errors exit 2.

No test here needs a wall-clock budget met: a run that must find something has an example
budget (``--max-examples``), and the time limits left are upper bounds (``--shrink-seconds``
only bounds how small a saved case is) or catch hangs."""

from __future__ import annotations

import glob
import json
import os
import re
import signal
import subprocess
import sys
import time

import forked_cli
import pytest

from rlconform.properties.case import load_case


def cli(*args, cwd, timeout=600):
    return forked_cli.run(args, cwd=cwd, timeout=timeout)


# mutant, the op and property that fuzz should break (narrowed to keep the test short: float32, the dtype
# each one breaks, forward_inplace's only one); each breaks on the first few examples of at least one finding
# (in 12 examples per finding, a miss is below 1e-6 for each), on any machine. Not seeded: ``--seed`` turns
# hypothesis' example database off, and the test checks the database
FAMILIES = [
    ("naive_entropy", "entropy", "finite_where_reference_finite"),
    ("mean_of_shard_means", "metric_pipeline", "partition_invariant"),
    ("forward_inplace", "token_logprobs", "non_destructive"),
]


@pytest.mark.cli
@pytest.mark.parametrize("family,op,prop", FAMILIES, ids=[f[0] for f in FAMILIES])
def test_fuzz_saves_counterexample_and_check_replays_it(tmp_path, family, op, prop):
    engine = f"mutants.{family}"
    proc = cli("fuzz", "--engine", engine, "--op", op, "--property", prop, "--dtype", "float32",
               "--max-examples", "12", "--shrink-seconds", "2", "--stats", "s.json", cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "new counterexample" in proc.stdout
    stats = json.loads((tmp_path / "s.json").read_text())
    found = [t for t in stats["targets"] if t["status"] == "found"]
    assert found and all(t["new"] and t["saved"] for t in found)
    # the example budget holds: no finding drew more than 12 examples (shrinking aside), and every finding
    # without a counterexample drew all of them
    assert stats["max_examples"] == 12 and stats["budget"] is None
    assert all(t["granted"] == 12 for t in stats["targets"] if t["status"] == "live")
    assert all(t["found_after_examples"] <= 12 for t in found)
    # the printed count is the generated examples, shrink replays apart
    assert all(t["examples"] <= 12 for t in stats["targets"]) and any(t["shrink_replays"] for t in found)
    assert re.search(r"\d+ examples \(\+\d+ shrink replays\) in", proc.stdout), proc.stdout
    files = sorted(glob.glob(str(tmp_path / "rlconform-corpus" / "*" / "*.json")))
    assert len(files) == len(found)
    assert os.path.isdir(tmp_path / ".rlconform-fuzz-db")  # the persistent example database

    # the saved case replays as a failure on its own ...
    first = files[0]
    case = load_case(first)
    assert (case.op, case.property, case.dtype) == (op, prop, "float32")
    rep = cli("replay", first, "--engine", engine, cwd=tmp_path)
    assert rep.returncode == 1, rep.stdout + rep.stderr

    # ... and `check` in the same folder replays it before drawing new examples: the finding fails on
    # its first example, and its reproducer is the saved case
    chk = cli("check", "--engine", engine, "--op", op, "--property", prop, "--dtype", case.dtype,
              "--max-examples", "3", "--out", "rep", "-q", cwd=tmp_path)
    assert chk.returncode == 1, chk.stdout[-3000:] + chk.stderr[-3000:]
    doc = json.loads((tmp_path / "rep" / "report.json").read_text())
    f = next(f for f in doc["findings"] if f["id"] == case.finding_id)
    assert f["status"] in ("discrepancy", "crash")
    assert f["examples_to_first_failure"] == 1
    with open(tmp_path / "rep" / f["reproducer"]["case_file"]) as fh:
        reproduced = json.load(fh)
    with open(first) as fh:
        saved = json.load(fh)
    assert reproduced["inputs"] == saved["inputs"]

    # a second fuzz run knows it: nothing new saved, still exit 1
    again = cli("fuzz", "--engine", engine, "--op", op, "--property", prop, "--dtype", case.dtype,
                "--max-examples", "1", "--shrink-seconds", "2", cwd=tmp_path)
    assert again.returncode == 1
    assert "saved earlier, still fails" in again.stdout
    assert sorted(glob.glob(str(tmp_path / "rlconform-corpus" / case.finding_id / "*.json"))) == \
        [p for p in files if case.finding_id in p]


@pytest.mark.cli
def test_counterexample_is_shrunk_when_the_database_holds_a_clean_run(tmp_path):
    """Slices of a clean run end mid-example; those examples must not land in the database as failures
    (a later run would replay them as already shrunk and save them unshrunk). The clean run is time-sliced
    (its verdict cannot depend on the machine's speed); the mutant's run has an example budget and shrinks
    without a clock."""
    sel = ["--op", "metric_pipeline", "--property", "matches_reference", "--dtype", "float32"]
    assert cli("fuzz", "--engine", "reference", *sel, "--seconds", "6", cwd=tmp_path).returncode == 0
    proc = cli("fuzz", "--engine", "mutants.mean_of_shard_means", *sel, "--max-examples", "30", cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (path,) = glob.glob(str(tmp_path / "rlconform-corpus" / "*" / "*.json"))
    case = load_case(path)
    # shrunk, not saved as drawn: T shrinks to 1 column (an unshrunk draw has T in {1, 8, 100, 10^4} and up
    # to 12 rows); how far the rows shrink depends on where the shrinker starts, so it is bounded loosely
    assert "shrinking cut short" not in proc.stdout
    assert case.inputs["values"].shape[1] == 1 and case.inputs["values"].shape[0] <= 12, case.summary()


@pytest.mark.cli
def test_fuzz_clean_engine_exits_0(tmp_path):
    proc = cli("fuzz", "--engine", "reference", "--op", "masked_mean", "--dtype", "float64", "--max-examples", "5",
               cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "no counterexample" in proc.stdout
    assert not glob.glob(str(tmp_path / "rlconform-corpus" / "*" / "*.json"))


@pytest.mark.cli
def test_fuzz_usage_errors_exit_2(tmp_path, capsys, monkeypatch):
    assert cli("fuzz", "--engine", "nosuchengine", "--seconds", "1", cwd=tmp_path).returncode == 2
    assert cli("fuzz", "--minutes", "x", cwd=tmp_path).returncode == 2
    # refused before any process starts or engine loads: in this process (a subprocess each only repeated
    # the interpreter's and torch's start-up)
    from rlconform.harness.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RLCONFORM_DEVICE", raising=False)  # main exports the device; undone after the test
    before = sorted(os.listdir(tmp_path))
    assert main(["fuzz", "--engine", "reference", "--op", "nosuchop", "--seconds", "1"]) == 2
    assert "unknown op 'nosuchop'" in capsys.readouterr().err
    assert main(["fuzz", "--engine", "reference", "--minutes", "0"]) == 2
    assert main(["fuzz", "--engine", "reference", "--max-examples", "0"]) == 2
    assert "--max-examples must be at least 1" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == before  # nothing written: no corpus, no database


def _wait_for(proc, needle: str, timeout: float) -> str:
    """Read proc's stdout until a line holding ``needle`` shows up; return what was read. ``timeout``
    only catches a hang (a reader thread, so a silent process cannot block the wait)."""
    import queue
    import threading

    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in iter(proc.stdout.readline, "")] + [lines.put(None)],
                     daemon=True).start()
    out = []
    deadline = time.monotonic() + timeout
    while True:
        try:
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            raise AssertionError(f"{needle!r} not seen within {timeout} s:\n{''.join(out)}") from None
        if line is None:
            raise AssertionError(f"the process ended before printing {needle!r}:\n{''.join(out)}")
        out.append(line)
        if needle in line:
            proc._rest_of_stdout = lines  # the reader keeps draining stdout, so the process never blocks on it
            return "".join(out)


def _drain(lines) -> str:
    out = []
    while True:
        line = lines.get()
        if line is None:
            return "".join(out)
        out.append(line)


@pytest.mark.cli
@pytest.mark.skipif(sys.platform == "win32", reason="SIGINT")
def test_ctrl_c_stops_cleanly_and_keeps_what_was_found(tmp_path):
    """Event-driven: SIGINT once a counterexample was announced; the deadlines only catch hangs (a loaded
    2-core machine may be slow, never wrong). float32 only, and 5 s of shrinking (the default with 30
    minutes is 60 s, spent before the announcement): the first counterexample comes sooner, and the
    properties the mutant does not break (metric_integrity, mask_invariant) keep the run going until
    the interrupt."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlconform.harness.cli", "fuzz", "--engine", "mutants.mean_of_shard_means",
         "--op", "metric_pipeline", "--dtype", "float32", "--minutes", "30", "--shrink-seconds", "5",
         "--stats", "s.json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env,
        # a background job may inherit SIGINT ignored; the child must get Python's default handler
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        _wait_for(proc, "new counterexample", timeout=900)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=600)
        err = proc.stderr.read()
        out = _drain(proc._rest_of_stdout)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, out + err
    assert "(interrupted)" in out and "Traceback" not in err
    stats = json.loads((tmp_path / "s.json").read_text())
    assert stats["interrupted"]
    saved = [t["saved"] for t in stats["targets"] if t.get("status") == "found"]
    assert saved and all(os.path.exists(tmp_path / p) for p in saved)
    for p in saved:
        load_case(tmp_path / p)  # complete, readable case files


@pytest.mark.cli
def test_fuzz_records_whose_error_a_binding_error_is(tmp_path):
    """A binding that cannot load its op is the user's error (exit 2), recorded as the target's ``error_of``
    field, not read back from its message."""
    (tmp_path / "bad_lazy.py").write_text(
        "from rlconform.harness.catalog.binding import Binding, Lazy\n"
        "binding = Binding(name='bad_lazy', ops={'entropy': Lazy('no_colon_here')})\n")
    proc = cli("fuzz", "--engine", str(tmp_path / "bad_lazy.py"), "--op", "entropy", "--max-examples", "2",
               "--corpus", "c", "--db", "d", "-q", "--stats", "s.json", cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    targets = json.loads((tmp_path / "s.json").read_text())["targets"]
    assert targets and all((t["status"], t["error_of"]) == ("error", "binding") for t in targets)
