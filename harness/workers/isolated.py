"""Run engine code in a child process, so that nothing it does decides the parent's exit code.

An engine can end the process that runs it: ``os._exit(0)``, a segfault in an extension, the kernel's
OOM killer, a hang. The process that decides a run's verdict must not be that process. This
module holds what the supervising side needs:

* :func:`run_isolated` calls a picklable ``fn(*args, emit=...)`` in a child (spawned, or forked from the command
  line's clean copy, :mod:`rlconform.harness.workers.zygote`; SIGINT ignored
  there; faulthandler writing fatal-signal and deadline stacks to a file; a deadline after which the
  child dumps its stacks and exits) and returns its result, or raises :class:`ChildDied` saying how the
  child ended (exit code or signal, its Python stack when there is one, whether the deadline passed).
  ``emit(obj)`` in the child sends progress objects to ``on_event`` in the parent while it runs.
* the child runs in its own process group, which is killed when the child ends (processes that leave
  the group or the session are ended by :mod:`rlconform.harness.workers.reaper`);
* :func:`describe_exit` and :func:`read_fault_log` put an exit status and a faulthandler file into words;
  the pytest plugin uses them for pytest-xdist workers that die.

Ctrl-C (``KeyboardInterrupt`` in the parent) kills the child before it propagates.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import tempfile
import threading
import time
import traceback
from typing import Any, Callable

__all__ = ["ChildDied", "arm_deadline", "describe_exit", "kill_children", "read_fault_log", "run_isolated"]

#: how faulthandler starts the dump it writes when dump_traceback_later's deadline passes
TIMEOUT_MARK = "Timeout ("


class ChildDied(Exception):
    """The child ended without a result. ``exitcode`` (negative: a signal), ``description`` (words),
    ``stack`` (faulthandler's Python stack, may be empty), ``timed_out`` (its deadline passed)."""

    def __init__(self, exitcode: int | None, stack: str = "", timed_out: bool = False, deadline_s: float | None = None):
        self.exitcode = exitcode
        self.stack = stack
        self.timed_out = timed_out
        self.deadline_s = deadline_s
        self.description = describe_exit(exitcode, timed_out=timed_out, deadline_s=deadline_s)
        super().__init__(self.description + (f"\n{stack.strip()}" if stack.strip() else ""))


def describe_exit(exitcode: int | None, *, timed_out: bool = False, deadline_s: float | None = None) -> str:
    """Words for how a process running engine code ended (``exitcode`` as ``Popen.returncode``)."""
    if timed_out:
        return (f"the engine exceeded the deadline of {deadline_s:g} s (hung or too slow; see its Python stack "
                "when it was stopped)" if deadline_s else "the engine exceeded its deadline (hung or too slow)")
    if exitcode is None:
        return "the process running the engine died (exit status unknown)"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        hint = {"SIGSEGV": "a segmentation fault", "SIGBUS": "a bus error", "SIGABRT": "abort()",
                "SIGFPE": "a floating-point exception", "SIGILL": "an illegal instruction",
                "SIGKILL": "killed, e.g. by the kernel's out-of-memory killer"}.get(name)
        return f"the process running the engine was killed by {name}" + (f" ({hint})" if hint else "")
    return (f"the process running the engine exited with code {exitcode} while running engine code "
            "(os._exit, sys.exit or exit() called by the engine, or a fatal error in an extension)")


def brief_stack(text: str, frames: int = 10) -> str:
    """A faulthandler dump with each thread cut to its ``frames`` most recent frames (faulthandler lists them
    first), so that every thread's innermost frames — where an engine hung — stay in view however deep the
    other threads' stacks are (a tail of the whole dump once lost the hanging engine's frames behind the
    fuzzer's hypothesis frames)."""
    out, count = [], 0
    for line in text.splitlines():
        if not line.startswith("  File "):
            count = 0
            out.append(line)
            continue
        count += 1
        if count <= frames:
            out.append(line)
        elif count == frames + 1:
            out.append("  ...")
    return "\n".join(out)


def read_fault_log(path: str, offset: int = 0) -> tuple[str, bool]:
    """faulthandler's output in ``path`` from ``offset``: (text, whether it is a deadline dump)."""
    try:
        with open(path, errors="replace") as fh:
            fh.seek(offset)
            text = fh.read()
    except OSError:
        return "", False
    return text[-20000:], TIMEOUT_MARK in text


_FAULT_FILE: list = []  # in a run_isolated child: its fault file (for arm_deadline without one)
_CALL_DEADLINE: list = [None]  # seconds one engine call may take in this process (fuzz --timeout), or None


def arm_deadline(seconds: float | None, fault_file=None) -> None:
    """In the process running engines: after ``seconds``, faulthandler writes every thread's stack to
    ``fault_file`` (default: the fault file of this :func:`run_isolated` child) and exits the process
    (``None`` or 0 cancels)."""
    import faulthandler

    faulthandler.cancel_dump_traceback_later()
    fault_file = fault_file or (_FAULT_FILE[0] if _FAULT_FILE else None)
    if seconds and fault_file is not None:
        faulthandler.dump_traceback_later(seconds, repeat=False, file=fault_file, exit=True)


def set_engine_call_deadline(seconds: float | None) -> None:
    """From now on in this process, each engine call (:func:`engine_call_deadline`) may take at most
    ``seconds`` before faulthandler dumps the stacks and ends the process, as :func:`arm_deadline` does
    (``None`` or 0: no per-call deadline; a deadline armed some other way, such as ``check``'s per-finding
    one, is then left alone). ``fuzz --timeout`` sets it: the time its supervisor waits for is the
    engine's, not the referee's judgment or hypothesis' generation and shrinking, which a loaded machine
    can make slow without anything hanging."""
    _CALL_DEADLINE[0] = seconds or None


@contextlib.contextmanager
def engine_call_deadline():
    """Around one engine call: the deadline of :func:`set_engine_call_deadline` armed, then cancelled."""
    seconds = _CALL_DEADLINE[0]
    if not seconds:
        yield
        return
    arm_deadline(seconds)
    try:
        yield
    finally:
        arm_deadline(None)


def _child(conn, fn, args, fault_path, deadline_s, interruptible):
    import faulthandler

    try:  # its own process group: what the engine starts here is ended with it
        os.setpgid(0, 0)
    except OSError:  # pragma: no cover - already a group leader
        pass

    if interruptible:  # the child stops cleanly on SIGINT / SIGTERM and tells an engine's KeyboardInterrupt apart
        from rlconform.harness.workers import interrupts

        interrupts.install()
    else:
        from rlconform.harness.workers import interrupts

        interrupts.ignore_sigint()  # the parent handles Ctrl-C and kills this process
    fault_file = open(fault_path, "w", buffering=1)
    _FAULT_FILE[:] = [fault_file]
    faulthandler.enable(file=fault_file, all_threads=True)
    arm_deadline(deadline_s, fault_file)

    def emit(obj) -> None:
        conn.send_bytes(pickle.dumps(("event", obj)))

    try:
        result = fn(*args, emit=emit)
    except BaseException:  # noqa: BLE001 - reported to the parent, which decides
        conn.send_bytes(pickle.dumps(("raised", traceback.format_exc())))
    else:
        conn.send_bytes(pickle.dumps(("ok", result)))
    conn.close()
    arm_deadline(None, fault_file)
    import sys

    if "rlconform.harness.workers.pool" in sys.modules:  # a process of multiprocessing runs no atexit hooks: close
        sys.modules["rlconform.harness.workers.pool"].close_all_pools()  # the worker pools here, or its exit waits on them


def run_isolated(fn: Callable, args: tuple = (), *, deadline_s: float | None = None,
                 on_event: Callable[[Any], None] | None = None, interruptible: bool = False,
                 grace_s: float = 60.0) -> Any:
    """Run ``fn(*args, emit=emit)`` in a child process (:func:`rlconform.harness.workers.zygote.context`) and
    return what it returns.

    Raises :class:`ChildDied` if the child ends without a result and ``RuntimeError`` (with the child's
    traceback) if ``fn`` raised. ``deadline_s`` bounds the child's whole run.

    Ctrl-C in the parent: by default the child is killed and ``KeyboardInterrupt`` propagates. With
    ``interruptible`` the child handles SIGINT itself (it gets one too, forwarded if only the parent
    got it) and its result is still awaited, for at most ``grace_s`` seconds.
    """
    from rlconform.harness.workers import zygote

    ctx = zygote.context()  # forked from the command line's clean copy (it never imported the engine), or spawned
    parent_conn, child_conn = ctx.Pipe(duplex=False)
    fd, fault_path = tempfile.mkstemp(prefix="rlconform-fault-", suffix=".txt")
    os.close(fd)
    # not a daemon: the child may start processes of its own (the worker pool of a distributed case); it
    # is killed and joined below whatever happens
    p = ctx.Process(target=_child, args=(child_conn, fn, args, fault_path, deadline_s, interruptible),
                    daemon=False, name="rlconform-engine")
    limit = {"give_up": None if not deadline_s else time.monotonic() + deadline_s + 30.0}
    previous = {}

    def forward(signum, frame):  # interruptible: record it, pass it on, keep waiting for the result
        from rlconform.harness.workers import interrupts

        interrupts._received.append(signum)
        try:
            os.kill(p.pid, signal.SIGINT)
        except OSError:
            pass
        limit["give_up"] = min(limit["give_up"] or float("inf"), time.monotonic() + grace_s)
        limit["forwarded"] = True

    try:
        p.start()
        child_conn.close()
        if interruptible and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                previous[sig] = signal.signal(sig, forward)
        while True:
            give_up = limit["give_up"]
            left = None if give_up is None else max(0.0, give_up - time.monotonic())
            ready = multiprocessing.connection.wait([parent_conn, p.sentinel], timeout=left)
            if not ready:  # faulthandler did not end it (or it ignored the interrupt): kill it
                p.kill()
                p.join(5)
                if limit.get("forwarded"):
                    raise KeyboardInterrupt("the child did not stop within the grace period")
                raise ChildDied(p.exitcode, read_fault_log(fault_path)[0], True, deadline_s)
            if parent_conn in ready:
                try:
                    kind, value = pickle.loads(parent_conn.recv_bytes())
                except (EOFError, OSError):
                    kind, value = None, None
                if kind == "event":
                    if on_event is not None:
                        on_event(value)
                    continue
                if kind == "ok":
                    p.join(5)
                    return value
                if kind == "raised":
                    p.join(5)
                    raise RuntimeError(value)
            p.join(5)
            stack, timed_out = read_fault_log(fault_path)
            raise ChildDied(p.exitcode, stack, timed_out, deadline_s)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if p.is_alive():
            p.kill()
            p.join(5)
        if p.pid is not None:  # the engine's processes left in the child's group go with it
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except OSError:
                pass
        parent_conn.close()
        try:
            os.unlink(fault_path)
        except OSError:
            pass


def kill_children() -> list[int]:
    """SIGKILL every live child process of this one (Linux ``/proc``; elsewhere nothing): after an
    interrupt, no worker may outlive the run. Their own children (worker-pool ranks) watch their parent
    and exit within a fraction of a second. Returns the pids signalled."""
    me, killed = os.getpid(), []
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return killed
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == me and fields[0] not in ("Z", "X"):
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except OSError:
                pass
    for pid in killed:
        try:
            os.waitpid(pid, 0)
        except OSError:
            pass
    return killed
