"""The command line's clean copy (harness/workers/zygote.py): helpers fork from it only while the command line
is clean, a referee forked from it still refuses engine code, and it ends with its owner.

Each test runs in a fresh interpreter (a script on stdin): the copy is made from a process with one thread,
which a pytest worker is not."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest


def test_why_not_gives_the_reason_and_without_a_copy_helpers_are_spawned(monkeypatch):
    from rlconform.harness.workers import zygote
    from rlconform.properties.referee import RefereeTouched

    def engine_loaded():
        raise RefereeTouched("this process has imported engine modules: verl\nmore")

    monkeypatch.setattr(zygote.threading, "active_count", lambda: 1)
    assert zygote.why_not(lambda: None) is None
    assert zygote.why_not(engine_loaded) == "this process has imported engine modules: verl"
    monkeypatch.setattr(zygote.threading, "active_count", lambda: 3)
    assert zygote.why_not(lambda: None) == "3 threads run"
    assert not zygote.start(lambda: None, lambda: None)  # refused: nothing forked, nothing installed
    assert not zygote.running() and zygote.context().get_start_method() == "spawn"


def _script(body: str, timeout: float = 300) -> dict:
    code = textwrap.dedent("""
        import json, os, sys, threading
        from rlconform.harness.workers import zygote
        from rlconform.harness.run.dispatch import fork_helper_copy
        out = {}
    """) + textwrap.dedent(body) + "\nprint(json.dumps(out), flush=True)\n"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _ppid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as fh:
        return int(fh.read().rsplit(")", 1)[1].split()[1])


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="the copy is made with os.fork (Linux)")
def test_a_referee_forks_from_the_copy_and_still_refuses_engine_code():
    out = _script("""
        from rlconform.harness.run.dispatch import referee_judge
        from rlconform.harness.workers import referee as referee_process
        from rlconform.properties import referee as judge
        out["copied"] = fork_helper_copy()
        out["copy"] = zygote._STATE["pid"]
        out["context"] = zygote.context().get_start_method()
        r = referee_process.start(referee_judge, judge.check_clean)
        with open(f"/proc/{r.process.pid}/stat") as fh:
            out["referee_parent"] = int(fh.read().rsplit(")", 1)[1].split()[1])
        r.close()
        # the referee's own test, as it runs in a forked referee: the copy's modules pass, an engine module never
        judge.inherit_modules()
        out["clean_after_inherit"] = judge.touched_modules()
        import rlconform.harness.mutants.naive_entropy
        out["after_a_mutant"] = judge.touched_modules()
        zygote.stop()
        out["running_after_stop"] = zygote.running()
    """)
    assert out["copied"] and out["context"] == "forkserver"
    assert out["referee_parent"] == out["copy"]  # forked from the copy, not spawned by this process
    assert out["clean_after_inherit"] == []
    assert "rlconform.harness.mutants.naive_entropy" in out["after_a_mutant"]
    assert not out["running_after_stop"]


@pytest.mark.slow
@pytest.mark.parametrize("why", ["an engine module", "a thread"])
def test_no_copy_is_made_from_a_process_that_is_not_clean(why):
    setup = ("import rlconform.harness.mutants.naive_entropy" if why == "an engine module" else
             "import time\nt = threading.Thread(target=time.sleep, args=(30,), daemon=True)\nt.start()")
    out = _script(setup + """
from rlconform.properties import referee as judge
out["why_not"] = zygote.why_not(judge.check_copyable)
out["copied"] = fork_helper_copy()
out["context"] = zygote.context().get_start_method()
""")
    assert out["why_not"] and not out["copied"] and out["context"] == "spawn", out
    assert ("naive_entropy" in out["why_not"]) if why == "an engine module" else ("threads run" in out["why_not"])


PARENT = textwrap.dedent("""
    import os, sys
    from rlconform.harness.run.dispatch import fork_helper_copy, referee_judge
    from rlconform.harness.workers import referee, zygote
    from rlconform.properties import referee as judge

    assert fork_helper_copy()
    r = referee.start(referee_judge, judge.check_clean)
    print(r.process.pid, zygote._STATE["pid"], flush=True)
    sys.stdin.read()  # until the test kills this process
""")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (ProcessLookupError, FileNotFoundError):
        return False


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="the copy is made with os.fork (Linux)")
def test_the_copy_and_its_referee_end_with_a_sigkilled_owner():
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        referee_pid, copy_pid = map(int, parent.stdout.readline().split())
        assert _alive(referee_pid) and _alive(copy_pid) and _ppid(referee_pid) == copy_pid
        parent.send_signal(signal.SIGKILL)
        parent.wait(60)
        deadline = time.monotonic() + 120  # generous: only a hang fails
        while (_alive(referee_pid) or _alive(copy_pid)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(referee_pid), "the referee outlived its owner"
        assert not _alive(copy_pid), "the copy outlived its owner"
    finally:
        if parent.poll() is None:
            parent.kill()
