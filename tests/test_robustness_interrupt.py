"""An interrupt, at any moment, ends the run promptly with exit code 130, an
incomplete report and no live worker.

* the worker pool: an interrupt while its ranks rendezvous (``start``) or while ``run`` starts them
  tears the ranks down (they are not left for multiprocessing's exit hook to wait on forever);
* an interrupt that something swallows (an exception raised in a gc callback is ignored, as in
  hypothesis' gc callback) is still seen: :func:`rlconform.harness.workers.interrupts.check` raises it;
* ``rlconform check``: Ctrl-C while the engine hangs in a finding, and Ctrl-C or SIGTERM while the engine
  is being loaded.

The tests wait for events (a marker file the engine creates), never for a guessed time; their deadlines
only catch hangs.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from rlconform.harness.workers import interrupts

BINDINGS = os.path.join(os.path.dirname(__file__), "bindings")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def _spawned_children() -> list[int]:
    """Live ranks of this process's pools: its children started by multiprocessing's spawn (not its resource
    tracker), and the children of its rank servers (ranks forked there: rlconform.harness.workers.rank_server)."""
    from rlconform.harness.workers import rank_server

    servers = {srv._forkserver_pid for srv in rank_server._STATE["servers"].values()} \
        if rank_server._STATE["owner"] == os.getpid() else set()
    me, out = os.getpid(), []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open(f"/proc/{p}/stat") as fh:
                    ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
                with open(f"/proc/{p}/cmdline", "rb") as fh:
                    spawned = b"spawn_main" in fh.read()
            except (OSError, IndexError, ValueError):
                continue
            if (ppid == me and spawned) or (ppid in servers and _alive(int(p))):
                out.append(int(p))
    return out


def _processes_with(marker: str) -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                if marker.encode() in fh.read() and _alive(int(pid)):
                    found.append(int(pid))
        except OSError:
            continue
    return found


def _wait_until(predicate, timeout: float, what: str) -> None:
    """Poll ``predicate`` until true; ``timeout`` only catches a hang."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


@pytest.mark.distributed
@pytest.mark.parametrize("how", ["start", "run"])
def test_an_interrupt_during_rendezvous_leaves_no_rank(monkeypatch, how):
    import multiprocessing.connection

    from rlconform.harness.workers.pool import WorkerPool
    from rlconform.harness.workers.pool_cases import allreduce_sum

    real_wait = multiprocessing.connection.wait
    seen: dict = {}
    others = set(_spawned_children())  # ranks of pools another test of this process left open

    def ours() -> list[int]:
        return [p for p in _spawned_children() if p not in others]

    def wait(objects, timeout=None):  # Ctrl-C lands in the rendezvous loop (once; joins must still work)
        if "children" not in seen and timeout != 0:  # not multiprocessing's poll of a started rank (timeout 0)
            # every rank has been started; on a loaded machine a spawned rank's exec (or a forked one's fork)
            # can lag: wait for both to show (the deadline only catches a hang)
            _wait_until(lambda: len(ours()) >= 2, 120, "both ranks to start")
            seen["children"] = ours()
            raise KeyboardInterrupt
        return real_wait(objects, timeout)

    monkeypatch.setattr(multiprocessing.connection, "wait", wait)
    pool = WorkerPool(2, startup_timeout_s=120)
    try:
        with pytest.raises(KeyboardInterrupt):
            pool.start() if how == "start" else pool.run(allreduce_sum, {"dtype": "float32"})
        monkeypatch.undo()
        assert len(seen["children"]) >= 2  # the ranks had been spawned
        assert pool._gen is None
        # the ranks are ended, not waited for: on a loaded machine their exit can take a moment (a generous
        # deadline that only catches ranks left running)
        deadline = time.monotonic() + 60
        while [p for p in seen["children"] if _alive(p)] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [p for p in seen["children"] if _alive(p)], "ranks outlived the interrupt"
    finally:
        monkeypatch.undo()
        pool.close()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the swallowed interrupt
def test_an_interrupt_swallowed_in_a_gc_callback_is_still_seen():
    before = sys.unraisablehook
    installed = interrupts.install()
    assert installed, "handlers were installed already"

    def swallowing_callback(phase, info):  # what an exception raised in a gc callback becomes: ignored
        if phase == "start":
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)

    try:
        gc.callbacks.append(swallowing_callback)
        try:
            gc.collect()
        finally:
            gc.callbacks.remove(swallowing_callback)
        assert interrupts.received() == signal.SIGINT
        with pytest.raises(KeyboardInterrupt):
            interrupts.check()
        interrupts.check()  # once: a second check does not break the clean-up the first started
    finally:
        interrupts.uninstall()
        interrupts.reset()
    assert sys.unraisablehook is before


_SWALLOWED = """
import gc, os, signal, time
from rlconform.harness.workers import interrupts
interrupts.install()
def cb(phase, info):
    if phase == "start":
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
gc.callbacks.append(cb)
gc.collect()
gc.callbacks.remove(cb)
print("received", interrupts.received())
"""


def test_a_swallowed_interrupt_prints_no_traceback():
    """Python reports an exception raised in a gc callback as "Exception ignored … Traceback …
    KeyboardInterrupt" on stderr (pytest's own unraisable hook hides it, hence a fresh interpreter): a recorded
    interrupt is not reported that way, the run reports it once as an interrupt."""
    proc = subprocess.run([sys.executable, "-c", _SWALLOWED], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and f"received {int(signal.SIGINT)}" in proc.stdout, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and "KeyboardInterrupt" not in proc.stderr, proc.stderr


def _start(args, tmp_path, marker_env: str, **extra_env):
    env = dict(os.environ, RLCONFORM_TEST_HANG_MARKER=str(tmp_path / "hanging"), RLCONFORM_TEST_MARKER=marker_env,
               **extra_env)
    return subprocess.Popen([sys.executable, "-m", "rlconform.harness.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
                            # a background job may inherit SIGINT ignored; the child must get the default
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _interrupt(proc, tmp_path, sig=signal.SIGINT):
    try:
        _wait_until(lambda: (tmp_path / "hanging").exists() or proc.poll() is not None, 600, "the engine to hang")
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(sig)
        return proc.communicate(timeout=120)  # only catches a hang: it stops within seconds
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.cli
@pytest.mark.slow
def test_ctrl_c_while_the_engine_hangs_ends_the_run_with_130(tmp_path):
    marker = uuid.uuid4().hex
    out = tmp_path / "out"
    proc = _start(["check", "--engine", os.path.join(BINDINGS, "hang.py"), "--op", "masked_mean", "--dtype",
                   "float64", "--property", "matches_reference", "--max-examples", "3", "--out", str(out)],
                  tmp_path, marker)
    stdout, stderr = _interrupt(proc, tmp_path)
    assert proc.returncode == 130, stdout[-2000:] + stderr[-2000:]
    assert "Traceback" not in stderr and "INTERRUPTED" in stdout.upper()
    doc = json.loads((out / "report.json").read_text())
    assert doc["run"]["complete"] is False and doc["run"]["interrupted"] is True
    _wait_until(lambda: not _processes_with(marker), 30, "no process of the run to be left")


@pytest.mark.cli
@pytest.mark.parametrize("sig,where", [(signal.SIGINT, "probe"), (signal.SIGTERM, "probe"), (signal.SIGINT, "worker")],
                         ids=["SIGINT-probe", "SIGTERM-probe", "SIGINT-worker"])
def test_an_interrupt_while_the_engine_loads_ends_with_130(tmp_path, sig, where):
    """``probe``: while this process learns the binding's ops; ``worker``: while the workers start."""
    marker = uuid.uuid4().hex
    proc = _start(["check", "--engine", os.path.join(BINDINGS, "slow_import.py"), "--op", "masked_sum", "--out",
                   str(tmp_path / "out")], tmp_path, marker, RLCONFORM_TEST_HANG_IN=where)
    stdout, stderr = _interrupt(proc, tmp_path, sig)
    assert proc.returncode == 130, stdout[-2000:] + stderr[-2000:]
    assert "interrupted" in (stdout + stderr).lower() and "Traceback" not in stdout + stderr, stdout + stderr
    _wait_until(lambda: not _processes_with(marker), 30, "no process of the run to be left")
