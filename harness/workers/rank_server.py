"""The process the gloo pool's ranks fork from, instead of each rank starting a fresh interpreter.

A rank started with multiprocessing's *spawn* is a new interpreter that imports torch and rlconform's rank loop:
about 1.5 s of CPU before it does anything. The pool (:mod:`rlconform.harness.workers.pool`) starts a new group
after every group in which a rank died or hung, and a process may hold pools of several sizes, so those imports
were paid again and again. Here each process that owns pools has one *rank server*: multiprocessing's fork
server (:class:`multiprocessing.forkserver.ForkServer`), a fresh interpreter started once, with the ranks'
one-thread environment (``OMP_NUM_THREADS=1`` and the like, read when torch loads) and with torch,
``torch.distributed`` and :mod:`~rlconform.harness.workers.pool_worker` imported, and nothing else: no engine, no
process group, no CUDA context, one thread. :func:`started` forks a rank from it; the rank starts where a
spawned rank is after its imports, with the owner's ``sys.path`` and working directory of the moment (as a
spawned one, through multiprocessing's preparation data) and the owner's environment of the moment
(:func:`rlconform.harness.workers.pool_worker.worker_main` applies it).

What torch read at its import must be what a spawned rank would read: a server serves while the variables its
imports may read (:data:`READ_AT_IMPORT`: torch's, its OpenMP and MKL runtimes', the interpreter's) keep the
values it started with; after a change the next group forks from a new server (the old one lives on for the
ranks it forked: multiprocessing learns a rank's end from its server). Other variables (an engine's import sets
some; pytest rewrites ``PYTEST_CURRENT_TEST`` for every test an engine worker runs) reach the rank with the
owner's environment. Where no server can run (no ``fork`` on the platform, the server failed to start), the
pool spawns its ranks as before (:func:`server` returns None).

A rank forked from the server is the server's child, not its owner's: it watches its owner through
multiprocessing's parent sentinel (the owner's end of the pipe that started it) instead of ``os.getppid()``;
the server ends when its owner ends (multiprocessing's alive pipe).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from typing import Iterator

from rlconform.harness.workers.pool_worker import _THREAD_ENV, one_thread_environment

__all__ = ["server", "started"]

#: modules the server imports before it forks the first rank
PRELOAD = ("torch", "torch.distributed", "rlconform.harness.workers.pool_worker")
#: the environment variables those imports (torch, its OpenMP / MKL runtimes, the interpreter) may read: a server
#: serves the owner while they keep the values it was started with
READ_AT_IMPORT = ("ATEN_", "OMP_", "GOMP_", "KMP_", "MKL_", "OPENBLAS_", "VECLIB_", "NUMEXPR_", "TORCH_",
                  "PYTORCH_", "CUDA_", "NCCL_", "GLOO_", "LD_", "MALLOC_", "PYTHON")

_LOCK = threading.RLock()
#: this process's servers by the values of READ_AT_IMPORT they were started with (a replaced one still
#: serves the ranks it forked: multiprocessing learns a rank's end from its server)
_STATE: dict = {"owner": None, "servers": {}}


def _read_at_import() -> tuple:
    env = dict(os.environ)
    env.update(_THREAD_ENV)
    return tuple(sorted((k, v) for k, v in env.items() if k.startswith(READ_AT_IMPORT)))


def server():
    """This process's rank server for its current environment with the ranks' one-thread variables applied
    (:data:`~rlconform.harness.workers.pool_worker._THREAD_ENV`), started now if none runs for it; None where
    ranks must be spawned."""
    if sys.platform != "linux" or not hasattr(os, "fork"):
        return None
    from multiprocessing import forkserver

    with _LOCK:
        if _STATE["owner"] != os.getpid():  # none yet, or a forked child's copy of its parent's
            _STATE.update(owner=os.getpid(), servers={})
        key = _read_at_import()
        srv = _STATE["servers"].get(key)
        if srv is None:
            srv = forkserver.ForkServer()
            srv.set_forkserver_preload(list(PRELOAD))
        try:
            with one_thread_environment():  # the server's interpreter reads it when it imports torch
                srv.ensure_running()  # started, or restarted after it ended
        except Exception:  # noqa: BLE001 - no server: the ranks are spawned
            return None
        _STATE["servers"][key] = srv
        return srv


@contextlib.contextmanager
def started(srv) -> Iterator[None]:
    """Within it, a ``forkserver``-context process's ``start()`` forks it from ``srv`` (multiprocessing's
    fork-server processes connect through one module-level function, which this swaps for ``srv``'s and
    restores; under this module's lock)."""
    from multiprocessing import forkserver

    with _LOCK:
        saved = forkserver.connect_to_new_process
        forkserver.connect_to_new_process = srv.connect_to_new_process
        try:
            yield
        finally:
            forkserver.connect_to_new_process = saved

