"""A referee ends with the process that started it, even when that process is killed with SIGKILL (it
cannot end its referee then), and its socket folder goes with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

pytestmark = pytest.mark.slow

PARENT = textwrap.dedent("""
    import os, sys
    from rlconform.harness.workers import referee
    from rlconform.harness.run.dispatch import referee_judge
    from rlconform.properties import referee as judge

    r = referee.start(referee_judge, judge.check_clean)
    print(r.process.pid, r._tmpdir, flush=True)
    sys.stdin.read()  # until the test kills this process
""")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (not yet reaped by init) is gone for our purpose
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split()[2] != "Z"
    except OSError:
        return False


def test_a_referee_outlives_no_sigkilled_controller():
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        pid_text, tmpdir = parent.stdout.readline().split()
        pid = int(pid_text)
        assert _alive(pid) and os.path.isdir(tmpdir)
        parent.send_signal(signal.SIGKILL)
        parent.wait(60)
        deadline = time.monotonic() + 120  # generous: only a hang fails (the watch polls every 0.5 s)
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(pid), "the referee outlived its controller"
        assert not os.path.exists(tmpdir)
    finally:
        if parent.poll() is None:
            parent.kill()
