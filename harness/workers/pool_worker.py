"""Child side of :mod:`rlconform.harness.workers.pool` (one persistent process per rank).

This module must not import torch at module level: the worker pins OMP/MKL threads to 1 *before*
torch is imported (the parent also sets those variables in the environment the child inherits).

Protocol (over one duplex ``multiprocessing`` Pipe per rank, pickled with plain :mod:`pickle`):

parent -> child  ``("run", seq, fn, payload)`` | ``("close",)``
child  -> parent ``("ready", pid)`` | ``("init_error", traceback)`` |
                 ``("ok", seq, result)`` | ``("err", seq, traceback)`` | ``("closed",)``
"""

from __future__ import annotations

import contextlib
import os
import pickle
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Iterator

_THREAD_ENV = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "NUMEXPR_NUM_THREADS": "1",
    "VECLIB_MAXIMUM_THREADS": "1",
}

_PARENT_POLL_S = 0.2


@contextlib.contextmanager
def one_thread_environment() -> Iterator[None]:
    """Within it, this process's environment holds :data:`_THREAD_ENV` (what a process started now reads when it
    loads torch); restored after."""
    saved = {k: os.environ.get(k) for k in _THREAD_ENV}
    os.environ.update(_THREAD_ENV)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@dataclass
class WorkerContext:
    """What a case function ``fn(ctx, payload)`` sees on each rank.

    ``group`` is the default (WORLD) process group. ``new_group(ranks)`` gets or creates a subgroup;
    like ``torch.distributed.new_group`` it is collective: every rank must call it with the same
    ranks, in the same order, even ranks outside the subgroup. Subgroups are cached for the life of
    the worker (across cases); the cache dies with the pool.
    """

    rank: int
    world_size: int
    backend: str
    collective_timeout_s: float
    device: Any = None
    group: Any = None
    local_rank: int = 0
    _groups: dict = field(default_factory=dict, repr=False)

    def new_group(self, ranks, **kwargs):
        import datetime

        import torch.distributed as dist

        key = (tuple(int(r) for r in ranks), tuple(sorted(kwargs.items())))
        grp = self._groups.get(key)
        if grp is None:
            kwargs.setdefault("timeout", datetime.timedelta(seconds=self.collective_timeout_s))
            grp = dist.new_group(ranks=list(key[0]), **kwargs)
            self._groups[key] = grp
        return grp

    @property
    def timeout(self):
        import datetime

        return datetime.timedelta(seconds=self.collective_timeout_s)


def group_health(ctx: WorkerContext, payload: Any) -> bool:
    """One all_reduce of ones over WORLD and over every cached subgroup this rank belongs to; True when
    each sums to its group's size. The pool runs it after a case in which every rank returned (some
    raised): a group that passes is reused instead of respawned (a respawn costs seconds of imports)."""
    import torch
    import torch.distributed as dist

    t = torch.ones(1)
    dist.all_reduce(t, group=ctx.group)
    ok = t.item() == ctx.world_size
    for key in sorted(ctx._groups):  # created collectively, in the same order on every rank
        ranks = key[0]
        if ctx.rank in ranks:
            t = torch.ones(1)
            dist.all_reduce(t, group=ctx._groups[key])
            ok = ok and t.item() == len(ranks)
    return bool(ok)


def _orphan_exit(stack_path: str, code: int) -> None:
    """The parent is gone: remove what it can no longer clean up (own file; the dir if last), exit."""
    for rm, path in ((os.unlink, stack_path), (os.rmdir, os.path.dirname(stack_path))):
        try:
            rm(path)
        except OSError:
            pass
    os._exit(code)


class StdioFd:
    """One of the owner's file descriptors (``fd``) for a rank forked from the rank server: pickled into the
    rank's start, it reaches the rank as multiprocessing passes a pipe (``reduction.DupFd``), and is the rank's
    copy of it there."""

    def __init__(self, fd: int):
        self.fd = fd

    def __reduce__(self):
        from multiprocessing import reduction

        return (_received_fd, (reduction.DupFd(self.fd),))


def _received_fd(dup) -> StdioFd:
    return StdioFd(dup.detach())


def _watch_parent(parent_pid: int, stack_path: str) -> None:
    """Exit the whole process as soon as the pool's owner is gone: a spawned rank is reparented (``getppid``
    changes); a rank forked from the rank server (whose child it is) sees the owner's end of the pipe that
    started it close (multiprocessing's parent sentinel)."""
    import multiprocessing
    import multiprocessing.connection

    parent = multiprocessing.parent_process()
    sentinel = parent.sentinel if parent is not None and os.getppid() != parent_pid else None
    while True:
        if sentinel is None:
            if os.getppid() != parent_pid:
                _orphan_exit(stack_path, 70)
            time.sleep(_PARENT_POLL_S)
        elif multiprocessing.connection.wait([sentinel], timeout=_PARENT_POLL_S):
            _orphan_exit(stack_path, 70)


def _send(conn, msg) -> None:
    try:
        data = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # unpicklable result: report that instead
        if msg[0] == "ok":
            data = pickle.dumps(
                ("err", msg[1], "result could not be pickled:\n" + traceback.format_exc()),
                protocol=pickle.HIGHEST_PROTOCOL,
            )
        else:
            raise
    conn.send_bytes(data)


def _share_one_gloo_device() -> bool:
    """Make every gloo process group this rank creates (the default one and each ``new_group``) use one
    transport device. By default each group gets its own ``gloo::transport::tcp::Device``, and each device
    runs a ``gloo_tcp_loop`` thread that wakes every 10 ms (``epoll_wait`` with a 10 ms timeout) even when
    nothing is sent: a rank holding the 20-odd cached subgroups of the distributed families sat at several
    percent of a core while idle (about 2 % each on a loaded 2-core box, about 10 % measured elsewhere).
    One device means one such thread. Collectives, timeouts and hang detection are unchanged (timeouts
    are the group's, the parent's deadline and the process sentinels are the pool's). Returns False, and
    changes nothing, where this torch lacks the options API."""
    import torch.distributed.distributed_c10d as c10d

    base = getattr(c10d, "ProcessGroupGloo", None)
    if base is None or getattr(base, "_rlconform_shared_device", False) or not hasattr(base, "_Options"):
        return base is not None and getattr(base, "_rlconform_shared_device", False)
    device = base.create_default_device()

    class SharedDeviceGloo(base):
        _rlconform_shared_device = True

        def __init__(self, store, rank, size, timeout=None, **kwargs):
            if isinstance(timeout, base._Options) or kwargs:
                super().__init__(store, rank, size, timeout, **kwargs)
                return
            opts = base._Options()
            opts._devices = [device]
            if timeout is not None:
                opts._timeout = timeout
            opts._threads = 2  # ProcessGroupGloo's default
            super().__init__(store, rank, size, opts)

    SharedDeviceGloo.__name__ = SharedDeviceGloo.__qualname__ = "ProcessGroupGloo"
    c10d.ProcessGroupGloo = SharedDeviceGloo
    return True


#: torch.compile's recompile limits, raised in every rank (one process for the whole run: what it computes
#: must not depend on the findings it ran before)
from rlconform.harness.core.compile_limits import (  # noqa: E402
    keep_compiling as _keep_compiling,
)


def worker_main(
    rank: int,
    world_size: int,
    backend: str,
    store_host: str,
    store_port: int,
    store_prefix: str,
    collective_timeout_s: float,
    conn,
    parent_pid: int,
    stack_path: str,
    rank_device: str = "cpu",
    environ: dict | None = None,
    stdio: tuple | None = None,
) -> None:
    """One rank's life: join the group, then run cases until ``close``. ``environ`` and ``stdio`` (its
    :class:`StdioFd` for stdout and stderr): the owner's environment and output files when the rank was forked
    from the rank server (:mod:`rlconform.harness.workers.rank_server`), whose own are those it was started
    with; a spawned rank inherits its owner's (None)."""
    if environ is not None:
        os.environ.clear()
        os.environ.update(environ)
    for target, received in zip((1, 2), stdio or ()):
        (sys.stdout if target == 1 else sys.stderr).flush()
        os.dup2(received.fd, target)
        os.close(received.fd)
    for k, v in _THREAD_ENV.items():
        os.environ[k] = v
    threading.Thread(target=_watch_parent, args=(parent_pid, stack_path), daemon=True, name="rlconform-parent-watch").start()

    import faulthandler
    import signal

    # Ctrl-C reaches the whole foreground process group: the parent handles it (and tears us down).
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    stack_file = open(stack_path, "w", buffering=1)
    # SIGUSR1 -> Python stacks of all threads into this rank's file (works while blocked in C++).
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True, chain=False)
    # fatal signals (SIGSEGV, SIGABRT, ...) -> a crash traceback in the same file
    faulthandler.enable(file=stack_file, all_threads=True)

    try:
        import datetime

        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:
            pass
        timeout = datetime.timedelta(seconds=collective_timeout_s)
        device = torch.device(rank_device)
        if device.type == "cuda":  # nccl: cuda:rank; gloo over CUDA tensors: the ranks share one GPU
            torch.cuda.set_device(device)
        if backend == "gloo":
            _share_one_gloo_device()  # before the first group: one 10 ms loop thread per rank, not one per group
        store = dist.TCPStore(store_host, store_port, is_master=False, timeout=timeout)
        store = dist.PrefixStore(store_prefix, store)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
        dist.barrier()
        ctx = WorkerContext(
            rank=rank,
            world_size=world_size,
            backend=backend,
            collective_timeout_s=collective_timeout_s,
            device=device,
            group=dist.group.WORLD,
            local_rank=rank,
        )
    except BaseException:
        try:
            _send(conn, ("init_error", traceback.format_exc()))
        finally:
            os._exit(3)

    _send(conn, ("ready", os.getpid()))
    compiling = False  # dynamo's recompile limits raised (once dynamo is imported: _keep_compiling)
    while True:
        try:
            msg = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):  # parent gone (or closed our pipe)
            _orphan_exit(stack_path, 71)
        except Exception:
            _send(conn, ("err", -1, "could not unpickle the case:\n" + traceback.format_exc()))
            continue
        if msg[0] == "close":
            try:
                dist.destroy_process_group()
            except Exception:
                pass
            try:
                _send(conn, ("closed",))
            except Exception:
                pass
            stack_file.flush()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
        _, seq, fn, payload = msg
        if not compiling:
            compiling = _keep_compiling()
        try:
            result = fn(ctx, payload)
        except BaseException:
            _send(conn, ("err", seq, traceback.format_exc()))
        else:
            _send(conn, ("ok", seq, result))
        if not compiling:  # the engine imported dynamo in this case: raised before the next one
            compiling = _keep_compiling()
