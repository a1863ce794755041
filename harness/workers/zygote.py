"""A clean copy of the command line's process, from which its helper processes fork instead of starting afresh.

A check starts processes that must not share the engine's: the referee (it judges), the engine-metadata probe
and the isolated child of ``replay`` and ``fuzz`` (they run engine code apart from the process that decides
the exit code). Each started with multiprocessing's *spawn* is a fresh interpreter that imports torch and
rlconform again: about 1.5 s of CPU each, more than a narrowed check's own work.

:func:`start` forks the command line's process once, while it is still clean: one thread, no engine module
imported, before it runs an engine or starts a worker. The copy runs multiprocessing's fork server loop
(:func:`multiprocessing.forkserver.main`) and is installed as this process's fork server, so :func:`context`
(``forkserver``) forks each helper from it: the helper starts with torch and rlconform already imported, and
with nothing of the engine. The referee accepts the modules it inherits from the copy (the command line's, which
decides the exit code and never imports an engine: a console library, the binding loader) and still refuses
an engine's, a binding's or a mutant's (:func:`rlconform.properties.referee.inherit_modules`). Where no copy
could be made (another thread runs, an engine module is loaded, no ``os.fork``), :func:`context` is *spawn*,
as before. The copy is forked before the process runs a torch operation, so no OpenMP thread pool is copied.

What a helper inherits is the copy's state at :func:`start`: environment variables set later in this process
do not reach it (the command line sets what its processes read, ``OMP_WAIT_POLICY`` and ``RLCONFORM_DEVICE``,
before). A helper still ends with this process: the referee waits on its parent's sentinel
(:func:`multiprocessing.parent_process`), which a forked helper holds as a spawned one does. The copy itself
ends with :func:`stop`, with the reaper of a check (it is one of the run's descendants), or when every process
holding its ``alive`` pipe has ended.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import socket
import sys
import threading
from typing import Callable

from rlconform.harness.workers import interrupts

__all__ = ["context", "kill_child", "running", "start", "stop", "why_not"]

_STATE: dict = {"pid": None, "owner": None}


def running() -> bool:
    """Whether this process has a live copy to fork helpers from."""
    pid = _STATE["pid"]
    if pid is None or _STATE["owner"] != os.getpid():
        return False
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        done = pid
    if done:
        _forget()
        return False
    return True


def context():
    """The multiprocessing context for a helper process: ``forkserver`` (forked from the copy) while it runs,
    else ``spawn``."""
    return multiprocessing.get_context("forkserver" if running() else "spawn")


def why_not(check_copyable: Callable[[], None]) -> str | None:
    """Why this process may not be copied now (one line), or None."""
    if not hasattr(os, "fork") or sys.platform != "linux":
        return "no fork on this platform"
    if threading.active_count() != 1:
        return f"{threading.active_count()} threads run"
    try:
        check_copyable()
    except Exception as exc:  # noqa: BLE001 - any reason not to copy it is a reason to spawn
        return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return None


def start(check_copyable: Callable[[], None], on_copy: Callable[[], None]) -> bool:
    """Fork the copy and install it as this process's fork server; returns whether one runs. Does nothing
    (False) when this process may not be copied (:func:`why_not`; ``check_copyable`` raises when it has loaded
    engine code): its helpers are then spawned. ``on_copy()`` runs in the copy as it is made (the referee's
    record of the modules it inherits). The caller imports first what its helpers import (the referee's judge),
    so that they start with it."""
    if running():
        return True
    if why_not(check_copyable) is not None:
        return False
    from multiprocessing import connection, forkserver, resource_tracker, util

    resource_tracker.ensure_running()  # before the fork: the copy's children share this process's tracker
    listener = socket.socket(socket.AF_UNIX)
    address = connection.arbitrary_address("AF_UNIX")
    listener.bind(address)
    if not util.is_abstract_socket_namespace(address):
        os.chmod(address, 0o600)
    listener.listen()
    alive_r, alive_w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the copy: serve forks until every holder of alive_w has ended
        code = 0
        try:
            os.close(alive_w)
            keep = {0, 1, 2, listener.fileno(), alive_r}
            for fd in [int(name) for name in os.listdir("/proc/self/fd")]:  # nothing of its owner's open files
                if fd not in keep:
                    try:
                        os.close(fd)
                    except OSError:
                        pass
            # a helper starts with the dispositions a spawned one would get: Python's defaults, or ignored where
            # this process was started with the signal ignored (the command line's own handlers are not theirs,
            # and a helper installs its own: interrupts.install, which a recorded install would make a no-op)
            interrupts.uninstall()
            interrupts.reset()
            for sig, default in ((signal.SIGINT, signal.default_int_handler), (signal.SIGTERM, signal.SIG_DFL)):
                signal.signal(sig, signal.SIG_IGN if signal.getsignal(sig) == signal.SIG_IGN else default)
            on_copy()
            forkserver.main(listener.fileno(), alive_r, [])
        except SystemExit:
            pass
        except BaseException:  # noqa: BLE001 - the copy must never return into the command line's code
            code = 1
        finally:
            os._exit(code)
    os.close(alive_r)
    listener.close()
    server = forkserver._forkserver
    server._forkserver_address, server._forkserver_alive_fd, server._forkserver_pid = address, alive_w, pid
    _STATE.update(pid=pid, owner=os.getpid())
    return True


def stop() -> None:
    """End the copy (its helpers are ended by their owners: the referee's and the probe's closes)."""
    pid = _STATE["pid"]
    if pid is None or _STATE["owner"] != os.getpid():
        return
    kill_child(pid)
    _forget()


def kill_child(pid: int) -> None:
    """SIGKILL this process's child ``pid`` and reap it (nothing if it is gone)."""
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


def _forget() -> None:
    from multiprocessing import forkserver

    server = forkserver._forkserver
    if server._forkserver_pid == _STATE["pid"]:
        if server._forkserver_alive_fd is not None:
            try:
                os.close(server._forkserver_alive_fd)
            except OSError:
                pass
        server._forkserver_address = server._forkserver_alive_fd = server._forkserver_pid = None
    _STATE.update(pid=None, owner=None)
