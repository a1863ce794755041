"""The referee's process: started before any engine import, it judges what the engine's worker recorded.

:func:`start` starts (``multiprocessing`` *spawn*: a fresh interpreter, nothing inherited; or forked from the
command line's clean copy, :mod:`rlconform.harness.workers.zygote`, which never imported the engine) a process that
serves ``judge(request_bytes, exchange) -> (reply, verdict)`` on a Unix socket (``multiprocessing.connection``,
an authkey of 32 random bytes): the engine's worker connects with :func:`connect`, sends one request per
example and answers the engine calls the referee asks for (``exchange(bytes) -> bytes``: ``b"C"`` +
the call; the worker's answer) until the reply comes (``b"R"`` + the pickled reply). A worker that dies
mid-example ends that example without a verdict. Before each reply the referee sends ``verdict`` (plain data: the finding
id, what it decided, its message) over a pipe that only the process that started it holds (the controller
of the run), so the verdict reaches the controller without passing through the engine's process. ``check_clean()`` runs in the referee before it serves and after every request: it raises
when a module the referee must never import is loaded (the referee then exits and the worker's request
fails).

The judging itself lives above this layer (:mod:`rlconform.properties.referee`); this module only runs
the process.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import pickle
import secrets
import shutil
import tempfile
import threading
import traceback
from typing import Any, Callable

__all__ = ["Referee", "RefereeUnavailable", "connect", "start"]


class RefereeUnavailable(Exception):
    """The referee could not be started, or stopped answering (a harness error, never a verdict)."""


def _end_with_parent(tmpdir: str) -> None:
    """End this process (and remove the referee's socket folder) as soon as the process that started it is
    gone: a controller killed with SIGKILL cannot end its referee itself. Runs in a daemon thread, blocked on
    the parent's sentinel (:func:`multiprocessing.parent_process`: a pipe only the parent holds the other end
    of, spawned or forked from the fork server of :mod:`rlconform.harness.workers.zygote` alike)."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return
    multiprocessing.connection.wait([parent.sentinel])
    shutil.rmtree(tmpdir, ignore_errors=True)
    os._exit(0)


def _serve(address: str, authkey: bytes, verdicts, ready, judge: Callable, check_clean: Callable,
           watch_parent: bool = False) -> None:
    from rlconform.harness.workers import interrupts

    interrupts.ignore_sigint()  # the controller handles Ctrl-C and ends this process
    if watch_parent:
        threading.Thread(target=_end_with_parent, args=(os.path.dirname(address),), daemon=True,
                         name="rlconform-referee-parent-watch").start()
    check_clean()
    listener = multiprocessing.connection.Listener(address, family="AF_UNIX", authkey=authkey)
    ready.send(os.getpid())
    ready.close()
    while True:
        try:
            conn = listener.accept()
        except (OSError, EOFError, multiprocessing.AuthenticationError):
            continue
        with conn:
            while True:
                try:
                    payload = conn.recv_bytes()
                except (EOFError, OSError):
                    break  # the worker ended (or was replaced): wait for the next one
                if payload == b"stop":
                    return

                def exchange(message: bytes, conn=conn) -> bytes:
                    try:
                        conn.send_bytes(b"C" + message)
                        return conn.recv_bytes()
                    except (EOFError, OSError) as exc:
                        raise _WorkerGone(str(exc)) from exc

                try:
                    reply, verdict = judge(payload, exchange)
                except _WorkerGone:
                    break  # the worker died or was ended mid-example: no verdict; wait for the next one
                except BaseException:  # noqa: BLE001 - the referee's own failure: the worker reports it
                    reply, verdict = ("referee_failed", traceback.format_exc()[-4000:]), None
                if verdict is not None:
                    try:
                        verdicts.send(verdict)
                    except (OSError, ValueError):
                        pass
                check_clean()
                try:
                    conn.send_bytes(b"R" + pickle.dumps(reply))
                except (EOFError, OSError):
                    break


class _WorkerGone(BaseException):
    """The engine's worker stopped answering during an example (it died, or the controller ended it)."""


class Referee:
    """A started referee: ``address`` and ``authkey`` for the worker, ``drain()`` for the controller."""

    def __init__(self, process, address: str, authkey: bytes, verdicts, tmpdir: str):
        self.process, self.address, self.authkey, self._verdicts, self._tmpdir = process, address, authkey, verdicts, tmpdir
        # a thread reads the verdict pipe as verdicts arrive: a controller that drains only at the end (fuzz)
        # must not leave the referee blocked on a full pipe after ~64 KiB of verdicts
        self._received: list = []
        self._lock = threading.Lock()
        self._closed = False
        self._reader = threading.Thread(target=self._read, name="rlconform-referee-verdicts", daemon=True)
        self._reader.start()

    def _take(self) -> None:
        """Move every verdict already in the pipe to ``_received`` (the caller holds ``_lock``)."""
        while self._verdicts.poll():
            self._received.append(self._verdicts.recv())

    def _read(self) -> None:
        try:
            while not self._closed:
                if self._verdicts.poll(0.05):
                    with self._lock:
                        self._take()
        except (EOFError, OSError):
            pass

    def drain(self) -> list:
        """The verdicts the referee sent since the last call (never blocks)."""
        with self._lock:
            try:
                self._take()
            except (EOFError, OSError):
                pass
            out, self._received = self._received, []
        return out

    def close(self) -> None:
        self._closed = True
        if self.process.is_alive():
            self.process.kill()
        self.process.join(5)
        shutil.rmtree(self._tmpdir, ignore_errors=True)


def start(judge: Callable, check_clean: Callable, timeout_s: float = 120.0) -> Referee:
    """Spawn a referee serving ``judge`` (both callables picklable by reference). Raises
    :class:`RefereeUnavailable` when it does not come up within ``timeout_s``."""
    from rlconform.harness.workers import zygote

    ctx = zygote.context()  # forked from the command line's clean copy, or spawned
    tmpdir = tempfile.mkdtemp(prefix="rlconform-referee-")
    address = os.path.join(tmpdir, "socket")
    authkey = secrets.token_bytes(32)
    verdicts_out, verdicts_in = ctx.Pipe(duplex=False)
    ready_out, ready_in = ctx.Pipe(duplex=False)
    p = ctx.Process(target=_serve, args=(address, authkey, verdicts_in, ready_in, judge, check_clean, True),
                    daemon=True, name="rlconform-referee")
    # the worker and its referee take turns, call by call: an idle OpenMP thread that spins for the next
    # parallel region would take a core from the other process (the user's own setting is kept; the command line
    # has set it for the whole run already, a plugin run without it gets it for the referee alone)
    from rlconform.harness.core.idle_threads import ENV, sleep_when_idle

    passive = sleep_when_idle()
    try:
        p.start()
    finally:
        if passive:
            os.environ.pop(ENV, None)
    verdicts_in.close()
    ready_in.close()
    if not ready_out.poll(timeout_s):
        p.kill()
        shutil.rmtree(tmpdir, ignore_errors=True)
        raise RefereeUnavailable(f"the referee did not start within {timeout_s:g} s (exit code {p.exitcode})")
    try:
        ready_out.recv()
    except EOFError:
        p.join(5)
        shutil.rmtree(tmpdir, ignore_errors=True)
        raise RefereeUnavailable(f"the referee exited at start (exit code {p.exitcode})") from None
    return Referee(p, address, authkey, verdicts_out, tmpdir)


class Client:
    """The worker's end: ``ask(payload) -> reply``."""

    def __init__(self, address: str, authkey: bytes):
        self.address, self.authkey = address, authkey
        self._conn = None

    def ask(self, payload: bytes, on_call: Callable[[bytes], bytes] | None = None) -> Any:
        """Send one request; answer each engine call the referee asks for with ``on_call(message)``
        until the referee's reply comes."""
        try:
            if self._conn is None:
                self._conn = multiprocessing.connection.Client(self.address, family="AF_UNIX", authkey=self.authkey)
            self._conn.send_bytes(payload)
            while True:
                message = self._conn.recv_bytes()
                if message[:1] == b"R":
                    return pickle.loads(message[1:])
                if message[:1] != b"C" or on_call is None:
                    raise OSError(f"the referee sent an unexpected message ({message[:1]!r})")
                self._conn.send_bytes(on_call(message[1:]))
        except (OSError, EOFError) as exc:
            self._drop()
            raise RefereeUnavailable(f"the referee stopped answering ({type(exc).__name__}: {exc})") from exc
        except BaseException:  # an interrupt mid-example: the referee must not take the next request for an answer
            self._drop()
            raise

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except OSError:
                pass


def connect(address: str, authkey: bytes) -> Client:
    return Client(address, authkey)
