"""Persistent distributed worker pool (docs/distributed.md).

A :class:`WorkerPool` starts ``world_size`` processes once (forked from this process's rank server,
:mod:`rlconform.harness.workers.rank_server`, a fresh interpreter with torch imported and nothing of the engine;
``spawn`` where none runs; never a fork of this process), each pinned to one thread, rendezvoused over a
TCPStore that the parent hosts on port 0 (no port race), with a
``gloo`` (CPU) or ``nccl`` (GPU) default group, each rank on its device (``devices``; the run's
``--device`` picks them with :func:`rlconform.harness.core.device.pool_backend`: gloo on the CPU, nccl with
one GPU per rank, gloo over CUDA tensors when ranks share one GPU). Hypothesis draws each case in the parent; ``run``
ships the case's function and payload(s) to the ranks over one Pipe per rank and gathers the results
in rank order.

Every ``run`` has a deadline. On failure the case raises :class:`RankFailure` with every rank's
traceback or state, then the whole group is killed (SIGTERM, SIGKILL after a short grace) and joined;
the next ``run`` spawns a fresh group on a fresh store. One exception: when every rank returned (some
raised, none died or is still running), one all_reduce over WORLD and over every cached subgroup
(:func:`~rlconform.harness.workers.pool_worker.group_health`) decides; a group that passes is kept, since a
respawn costs a rendezvous and a re-import of the engine per rank, and an engine that raises on every example (a contract
violation, a 2-D input it rejects) would otherwise pay it per example.

* ``kind="raised"``: a rank's ``fn`` raised. Its traceback is reported; peers that were blocked in a
  collective are shown with their Python stacks.
* ``kind="died"``: a rank's process exited (SIGKILL, ``os._exit``, segfault). Noticed at once via the
  process sentinels, not at the deadline.
* ``kind="hung"``: the deadline passed. Stacks of the ranks still running come from
  ``faulthandler`` (registered on SIGUSR1 in each worker, written to a file per rank).

Precedence when several happen in one case: died > raised > hung (a death is always a cause; an
exception may be a peer's reaction to it; a hang is a reaction to either).

No worker outlives the parent: each worker has a thread watching its owner (a spawned one polls
``os.getppid()``; one forked from the rank server waits on multiprocessing's parent sentinel) and exits when the
parent is gone; a closed parent pipe also ends it; pools are closed ``atexit``. An interrupt (Ctrl-C)
or any error while the group is spawned, rendezvouses or runs a case tears the group down before it
propagates, so multiprocessing's exit hook never waits on a rank.

Usage::

    from rlconform.harness.workers.pool import get_pool

    def allreduce_case(ctx, payload):          # module level, picklable by reference
        t = torch.tensor(payload, dtype=torch.float32)
        dist.all_reduce(t, group=ctx.group)
        return t

    results = get_pool(2).run(allreduce_case, [[1.0], [2.0]])   # one payload per rank
    results = get_pool(2).run(allreduce_case, [1.0])            # anything else: same for all ranks

Note that a single payload that is itself a list of length ``world_size`` is taken as per-rank
payloads; wrap it (``run(fn, [p] * world_size)``) to send it whole to every rank.

torchrun (multi-node): the same ``fn`` runs unchanged in-process with :func:`run_under_torchrun`::

    torchrun --nproc-per-node 2 -m rlconform.harness.workers.pool rlconform.harness.workers.pool_cases:allreduce_sum '{"dtype": "float32"}'

or from a script: ``if in_torchrun(): result = run_under_torchrun(fn, payload)``.
"""

from __future__ import annotations

import atexit
import datetime
import multiprocessing
import multiprocessing.connection
import multiprocessing.util  # noqa: F401  (its atexit hook must be registered before ours)
import os
import pickle
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
import weakref
from typing import Any, Callable

from rlconform.harness.workers import rank_server
from rlconform.harness.workers.pool_worker import (
    StdioFd,
    WorkerContext,
    group_health,
    one_thread_environment,
    worker_main,
)

__all__ = [
    "RankFailure",
    "PoolStartupError",
    "WorkerPool",
    "WorkerContext",
    "TorchrunContext",
    "get_pool",
    "close_all_pools",
    "in_torchrun",
    "run_under_torchrun",
]

_KIND_ORDER = {"died": 0, "raised": 1, "hung": 2}


class RankFailure(Exception):
    """One case failed on at least one rank.

    ``kind`` is ``"raised"``, ``"hung"`` or ``"died"``; ``tracebacks`` maps every rank to its traceback
    (raised), its Python stack (still running at teardown), its exit status (died) or ``"completed"``;
    ``failed_ranks`` are the ranks that caused the failure (died / raised / hung past the deadline).
    """

    def __init__(self, kind: str, tracebacks: dict[int, str], failed_ranks: list[int], elapsed_s: float, detail: str = ""):
        self.kind = kind
        self.tracebacks = dict(sorted(tracebacks.items()))
        self.failed_ranks = sorted(failed_ranks)
        self.elapsed_s = elapsed_s
        self.detail = detail
        lines = [f"case failed: {kind} on rank(s) {self.failed_ranks} after {elapsed_s:.2f} s" + (f" ({detail})" if detail else "")]
        for r, tb in self.tracebacks.items():
            lines.append(f"--- rank {r} ---")
            lines.append(tb.rstrip())
        super().__init__("\n".join(lines))

    def __reduce__(self):
        return (type(self), (self.kind, self.tracebacks, self.failed_ranks, self.elapsed_s, self.detail))


class PoolStartupError(RuntimeError):
    """The worker group could not be spawned or could not rendezvous."""


def _pid_alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except (OSError, IndexError):
        return True


class _Generation:
    """One spawned group of workers (the pool respawns a new one after every failure)."""

    def __init__(self, procs, conns, store, stack_paths, index):
        self.procs = procs
        self.conns = conns
        self.store = store
        self.stack_paths = stack_paths
        self.index = index

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]


class WorkerPool:
    """A persistent group of ``world_size`` ranks; see the module docstring."""

    def __init__(
        self,
        world_size: int,
        *,
        backend: str = "gloo",
        devices: list[str] | None = None,
        timeout_s: float = 60.0,
        collective_timeout_s: float = 30.0,
        startup_timeout_s: float = 120.0,
        failure_grace_s: float = 0.5,
        kill_grace_s: float = 0.5,
    ):
        if world_size < 1:
            raise ValueError("world_size must be >= 1")
        if backend not in ("gloo", "nccl"):
            raise ValueError(f"backend must be 'gloo' or 'nccl', not {backend!r}")
        self.world_size = int(world_size)
        self.backend = backend
        # the device of each rank: cpu; cuda:r with nccl; one shared cuda:N with gloo on fewer GPUs
        # than ranks (rlconform.harness.core.device.pool_backend)
        self.devices = list(devices) if devices else (
            [f"cuda:{r}" for r in range(self.world_size)] if backend == "nccl" else ["cpu"] * self.world_size)
        if len(self.devices) != self.world_size:
            raise ValueError(f"devices: {len(self.devices)} given for {self.world_size} ranks")
        self.timeout_s = float(timeout_s)
        self.collective_timeout_s = float(collective_timeout_s)
        self.startup_timeout_s = float(startup_timeout_s)
        self.failure_grace_s = float(failure_grace_s)
        self.kill_grace_s = float(kill_grace_s)
        self._mp = multiprocessing.get_context("spawn")
        self._gen: _Generation | None = None
        self._gen_count = 0
        self._seq = 0
        self._closed = False
        self._lock = threading.RLock()
        self._tmpdir = tempfile.mkdtemp(prefix="rlconform-pool-")
        self.last_startup_s: float | None = None
        self.startups = 0
        self.group_checks = 0  # health checks run after a case that raised on every rank that failed
        self.groups_kept = 0  # ... that passed: the group was reused instead of respawned
        self.health_timeout_s = 30.0
        _LIVE.add(self)

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            if not self._closed:
                self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("up" if self._gen else "idle")
        return f"WorkerPool(world_size={self.world_size}, backend={self.backend!r}, {state})"

    @property
    def pids(self) -> list[int]:
        """PIDs of the live workers (empty if none are up)."""
        return self._gen.pids if self._gen else []

    def start(self) -> "WorkerPool":
        """Spawn the workers now (``run`` does it lazily)."""
        with self._lock:
            if self._closed:
                raise RuntimeError("WorkerPool is closed")
            if self._gen is None:
                self._gen = self._spawn()
        return self

    def _spawn(self) -> _Generation:
        import torch.distributed as dist

        t0 = time.monotonic()
        self._gen_count += 1
        index = self._gen_count
        try:
            store = dist.TCPStore(
                "127.0.0.1",
                0,
                world_size=None,
                is_master=True,
                timeout=datetime.timedelta(seconds=self.startup_timeout_s),
                wait_for_workers=False,
            )
        except Exception as e:
            raise PoolStartupError(f"could not host a TCPStore on 127.0.0.1:0: {e}") from e
        prefix = f"rlconform/pool{os.getpid()}/gen{index}"
        procs, conns, stack_paths = [], [], []
        server = rank_server.server()  # ranks fork from it; None: they are spawned
        mp = multiprocessing.get_context("forkserver") if server is not None else self._mp
        try:
            with one_thread_environment():  # inherited by spawned interpreters before torch loads
                for rank in range(self.world_size):
                    parent_conn, child_conn = mp.Pipe(duplex=True)
                    stack_path = os.path.join(self._tmpdir, f"gen{index}-rank{rank}.stack")
                    p = mp.Process(
                        target=worker_main,
                        args=(
                            rank,
                            self.world_size,
                            self.backend,
                            "127.0.0.1",
                            store.port,
                            prefix,
                            self.collective_timeout_s,
                            child_conn,
                            os.getpid(),
                            stack_path,
                            self.devices[rank],
                            dict(os.environ) if server is not None else None,
                            (StdioFd(1), StdioFd(2)) if server is not None else None,
                        ),
                        name=f"rlconform-rank{rank}",
                        daemon=False,
                    )
                    if server is not None:
                        with rank_server.started(server):
                            p.start()
                    else:
                        p.start()
                    child_conn.close()
                    procs.append(p)
                    conns.append(parent_conn)
                    stack_paths.append(stack_path)
        except BaseException as e:
            self._kill(procs)
            for c in conns:
                c.close()
            if not isinstance(e, Exception):  # an interrupt stays an interrupt
                raise
            raise PoolStartupError(f"could not spawn workers: {e}") from e

        gen = _Generation(procs, conns, store, stack_paths, index)
        try:
            return self._rendezvous(gen, t0)
        except BaseException:  # Ctrl-C or an error mid-rendezvous: no worker may outlive it
            self._teardown(gen)
            raise

    def _rendezvous(self, gen: _Generation, t0: float) -> _Generation:
        """Wait until every rank of ``gen`` reported ready; raise :class:`PoolStartupError` otherwise."""
        procs, conns = gen.procs, gen.conns
        ready: set[int] = set()
        errors: dict[int, str] = {}
        deadline = t0 + self.startup_timeout_s
        by_conn = {c: r for r, c in enumerate(conns)}
        by_sentinel = {p.sentinel: r for r, p in enumerate(procs)}

        def exited_msg(r: int) -> str:
            return (
                f"worker exited during start-up (exit code {procs[r].exitcode}); its stderr is above. "
                "If the parent is a script, its top level must be guarded by "
                "`if __name__ == '__main__':` (spawn re-imports it in every worker)."
            )

        while len(ready) + len(errors) < self.world_size:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            waitables = [conns[r] for r in range(self.world_size) if r not in ready and r not in errors]
            waitables += [procs[r].sentinel for r in range(self.world_size) if r not in ready and r not in errors]
            for obj in multiprocessing.connection.wait(waitables, timeout=left):
                r = by_conn.get(obj)
                if r is not None:
                    if r in ready or r in errors:
                        continue
                    try:
                        msg = pickle.loads(obj.recv_bytes())
                    except (EOFError, OSError):
                        msg = ("exited",)
                    if msg[0] == "ready":
                        ready.add(r)
                    elif msg[0] == "init_error":
                        errors[r] = msg[1]
                    else:
                        procs[r].join(1.0)
                        errors[r] = exited_msg(r)
                else:
                    r = by_sentinel[obj]
                    if r not in ready and r not in errors and not conns[r].poll():
                        procs[r].join(0.1)
                        errors[r] = exited_msg(r)
            if errors:  # one bad rank: the others would wait for it until the store timeout;
                deadline = min(deadline, time.monotonic() + 1.0)  # give them 1 s to report their own error
        if len(ready) < self.world_size:
            for r in range(self.world_size):
                if r not in ready and r not in errors:
                    errors[r] = "did not finish rendezvous (" + (
                        f"start-up timeout {self.startup_timeout_s:.0f} s)" if not errors else "aborted after another rank failed)"
                    )
            msg = "\n".join(f"--- rank {r} ---\n{errors[r].rstrip()}" for r in sorted(errors))
            raise PoolStartupError(
                f"WorkerPool(world_size={self.world_size}, backend={self.backend!r}) failed to start:\n{msg}"
            )
        self.last_startup_s = time.monotonic() - t0
        self.startups += 1
        return gen

    def close(self) -> None:
        """Shut the workers down (destroying their process groups), kill stragglers. Idempotent."""
        with self._lock:
            if self._gen is not None:
                gen, self._gen = self._gen, None
                self._shutdown(gen)
            self._closed = True
            shutil.rmtree(self._tmpdir, ignore_errors=True)
        _POOLS_unregister(self)

    def _shutdown(self, gen: _Generation, wait_s: float = 5.0) -> None:
        for c in gen.conns:
            try:
                c.send_bytes(pickle.dumps(("close",)))
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + wait_s
        for p in gen.procs:
            p.join(max(0.0, deadline - time.monotonic()))
        self._teardown(gen)

    def _kill(self, procs) -> None:
        for p in procs:
            if p.exitcode is None:
                try:
                    p.terminate()
                except (OSError, ValueError, AttributeError):
                    pass
        deadline = time.monotonic() + self.kill_grace_s
        for p in procs:
            try:
                p.join(max(0.0, deadline - time.monotonic()))
            except (AssertionError, ValueError):
                pass
        for p in procs:
            if p.exitcode is None:
                try:
                    p.kill()
                except (OSError, ValueError, AttributeError):
                    pass
        for p in procs:
            try:
                p.join(5.0)
                p.close()
            except (AssertionError, ValueError):
                pass

    def _teardown(self, gen: _Generation) -> None:
        self._kill(gen.procs)
        for c in gen.conns:
            try:
                c.close()
            except OSError:
                pass
        gen.store = None  # drop the parent's store (closes the listening socket)
        for path in gen.stack_paths:
            try:
                os.unlink(path)
            except OSError:
                pass

    # ------------------------------------------------------------------ running cases
    def run(self, fn: Callable[[WorkerContext, Any], Any], payloads: Any, *, timeout_s: float | None = None) -> list:
        """Run ``fn(ctx, payload)`` on every rank; return the results ordered by rank.

        ``payloads``: a list/tuple of length ``world_size`` (one per rank) or any other single object,
        sent to every rank. Raises :class:`RankFailure` (and rebuilds the pool on the next call).
        The deadline ``timeout_s`` (default: the pool's) does not include a (re)start of the pool.
        """
        world = self.world_size
        if isinstance(payloads, (list, tuple)) and len(payloads) == world:
            per_rank = list(payloads)
        else:
            per_rank = [payloads] * world
        timeout = self.timeout_s if timeout_s is None else float(timeout_s)
        with self._lock:
            self._seq += 1
            seq = self._seq
            # Pickle everything before sending anything: an unpicklable case never reaches a rank.
            msgs = [pickle.dumps(("run", seq, fn, p), protocol=pickle.HIGHEST_PROTOCOL) for p in per_rank]
            try:
                self.start()  # inside the try: an interrupt during start-up tears down what was started
                return self._run_case(self._gen, seq, msgs, timeout)
            except RankFailure:
                raise
            except BaseException:  # e.g. KeyboardInterrupt mid-case: the ranks' state is unknown
                gen, self._gen = self._gen, None
                if gen is not None:
                    self._teardown(gen)
                raise

    def _run_case(self, gen: _Generation, seq: int, msgs: list[bytes], timeout: float, *, check_health: bool = True) -> list:
        world = self.world_size
        t0 = time.monotonic()
        results: dict[int, Any] = {}
        raised: dict[int, str] = {}
        died: dict[int, str] = {}
        first_failure: float | None = None

        def mark_died(r: int, what: str) -> None:
            gen.procs[r].join(0.05)
            code = gen.procs[r].exitcode
            sig = ""
            if code is not None and code < 0:
                try:
                    sig = f" = {signal.Signals(-code).name}"
                except ValueError:
                    pass
            died[r] = f"process died {what} (exit code {code}{sig})"
            crash = _read_from(gen.stack_paths[r], crash_offsets[r])
            died[r] += (":\n" + _clean_stack(crash)) if crash.strip() else "; no Python traceback (uncatchable signal or os._exit)"

        crash_offsets = [_size(p) for p in gen.stack_paths]
        for r, m in enumerate(msgs):
            try:
                gen.conns[r].send_bytes(m)
            except (OSError, ValueError):
                mark_died(r, "before the case was sent")
                first_failure = first_failure or time.monotonic()

        by_conn = {c: r for r, c in enumerate(gen.conns)}
        by_sentinel = {p.sentinel: r for r, p in enumerate(gen.procs)}
        deadline = t0 + timeout
        while True:
            pending = [r for r in range(world) if r not in results and r not in raised and r not in died]
            if not pending:
                break
            now = time.monotonic()
            end = deadline if first_failure is None else min(deadline, first_failure + self.failure_grace_s)
            if now >= end:
                break
            waitables = [gen.conns[r] for r in pending] + [gen.procs[r].sentinel for r in pending]
            ready = multiprocessing.connection.wait(waitables, timeout=end - now)
            # messages first: a rank that answered and then exited is not "died"
            for obj in sorted(ready, key=lambda o: 0 if o in by_conn else 1):
                r = by_conn.get(obj)
                if r is not None:
                    if r in results or r in raised or r in died:
                        continue
                    try:
                        data = obj.recv_bytes()
                    except (EOFError, OSError):
                        mark_died(r, "during the case")
                        first_failure = first_failure or time.monotonic()
                        continue
                    try:
                        msg = pickle.loads(data)
                    except Exception:
                        raised[r] = "result could not be unpickled in the parent:\n" + traceback.format_exc()
                        first_failure = first_failure or time.monotonic()
                        continue
                    if msg[0] == "ok" and msg[1] == seq:
                        results[r] = msg[2]
                    elif msg[0] == "err":
                        raised[r] = msg[2]
                        first_failure = first_failure or time.monotonic()
                    else:  # protocol violation: treat as a failure of that rank
                        raised[r] = f"unexpected message from worker: {msg[:2]!r}"
                        first_failure = first_failure or time.monotonic()
                else:
                    r = by_sentinel[obj]
                    if r in results or r in raised or r in died:
                        continue
                    if gen.conns[r].poll():
                        continue  # read its last message on the next pass
                    mark_died(r, "during the case")
                    first_failure = first_failure or time.monotonic()

        if len(results) == world:
            return [results[r] for r in range(world)]

        # ---- failure: collect every rank's state, then tear the group down
        elapsed = time.monotonic() - t0
        pending = [r for r in range(world) if r not in results and r not in raised and r not in died]
        stacks = self._dump_stacks(gen, pending)
        tracebacks: dict[int, str] = {}
        for r in range(world):
            if r in died:
                tracebacks[r] = died[r]
            elif r in raised:
                tracebacks[r] = raised[r]
            elif r in results:
                tracebacks[r] = "completed (result discarded)"
            else:
                state = "hung past the deadline" if first_failure is None else "still running (blocked) when the case failed"
                tracebacks[r] = f"{state}; Python stack at teardown:\n{_clean_stack(stacks.get(r, '')) or '(no stack captured)'}"
        if died:
            kind, failed = "died", list(died)
        elif raised:
            kind, failed = "raised", list(raised)
        else:
            kind, failed = "hung", pending
        detail = f"deadline {timeout:g} s" if kind == "hung" else ""
        if kind == "raised" and not pending and check_health:
            self._group_healthy(gen)  # every rank is back in its loop: kept if healthy, else torn down
        else:
            self._gen = None
            self._teardown(gen)
        raise RankFailure(kind, tracebacks, failed, elapsed, detail)

    def _group_healthy(self, gen: _Generation) -> bool:
        """After a case in which every rank returned (at least one raised): run :func:`group_health` on the
        same group. True keeps the group for the next case; False: the group has been torn down. The
        check's deadline is short: a healthy group answers in ms."""
        self._seq += 1
        seq = self._seq
        msg = pickle.dumps(("run", seq, group_health, None), protocol=pickle.HIGHEST_PROTOCOL)
        self.group_checks += 1
        try:
            out = self._run_case(gen, seq, [msg] * self.world_size, min(self.timeout_s, self.health_timeout_s), check_health=False)
        except RankFailure:
            return False  # _run_case tore the group down
        if all(out):
            self.groups_kept += 1
            return True
        self._gen = None
        self._teardown(gen)
        return False

    def _dump_stacks(self, gen: _Generation, ranks: list[int], wait_s: float = 1.0) -> dict[int, str]:
        """SIGUSR1 -> faulthandler writes each rank's Python stacks to its file; read them back."""
        offsets = {}
        for r in ranks:
            offsets[r] = _size(gen.stack_paths[r])
            try:
                os.kill(gen.procs[r].pid, signal.SIGUSR1)
            except (ProcessLookupError, TypeError):
                pass
        deadline = time.monotonic() + wait_s
        last_sizes: dict[int, int] = {}
        while ranks and time.monotonic() < deadline:
            time.sleep(0.05)
            done = True
            for r in ranks:
                size = _size(gen.stack_paths[r])
                if size <= offsets[r] or last_sizes.get(r) != size:
                    done = False
                last_sizes[r] = size
            if done:
                break
        return {r: _read_from(gen.stack_paths[r], offsets[r]) for r in ranks}


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _read_from(path: str, offset: int) -> str:
    try:
        with open(path, errors="replace") as f:
            f.seek(offset)
            return f.read()
    except OSError:
        return ""


def _clean_stack(text: str) -> str:
    """Drop the worker's own parent-watch thread from a faulthandler dump."""
    blocks = text.strip().split("\n\n")
    return "\n\n".join(b for b in blocks if "in _watch_parent" not in b).strip()


# ---------------------------------------------------------------------- session-wide cache
_POOLS: dict[int, WorkerPool] = {}
_LIVE: "weakref.WeakSet[WorkerPool]" = weakref.WeakSet()  # every pool, closed at exit too
_POOLS_LOCK = threading.RLock()


def _POOLS_unregister(pool: WorkerPool) -> None:
    with _POOLS_LOCK:
        for k, v in list(_POOLS.items()):
            if v is pool:
                del _POOLS[k]


def get_pool(world_size: int, **kwargs) -> WorkerPool:
    """The session's pool for ``world_size`` (created on first use, started lazily).

    ``kwargs`` (backend, timeouts) only apply when the pool is created. Closed at interpreter exit.
    """
    with _POOLS_LOCK:
        pool = _POOLS.get(world_size)
        if pool is None or pool._closed:
            pool = WorkerPool(world_size, **kwargs)
            _POOLS[world_size] = pool
        return pool


def close_all_pools() -> None:
    """Close every pool created by :func:`get_pool` (and, at exit, every other open pool)."""
    with _POOLS_LOCK:
        pools = list(_POOLS.values())
        _POOLS.clear()
    for p in pools:
        try:
            p.close()
        except Exception:
            pass


# Registered after multiprocessing.util's hook, so it runs first (atexit is LIFO): the workers are
# closed before multiprocessing would join them.
def _close_everything_at_exit() -> None:
    close_all_pools()
    for p in list(_LIVE):
        try:
            p.close()
        except Exception:
            pass


atexit.register(_close_everything_at_exit)


# ---------------------------------------------------------------------- torchrun
def in_torchrun() -> bool:
    """True when the environment comes from torchrun (or another env:// launcher)."""
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR"))


class TorchrunContext(WorkerContext):
    """The ``ctx`` a case gets under torchrun: the same fields as :class:`WorkerContext`."""

    @classmethod
    def from_env(cls, backend: str | None = None, collective_timeout_s: float = 30.0) -> "TorchrunContext":
        import torch
        import torch.distributed as dist

        if not in_torchrun():
            raise RuntimeError("not under torchrun: RANK, WORLD_SIZE and MASTER_ADDR must be set")
        if backend is None:
            backend = "nccl" if torch.cuda.is_available() else "gloo"
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        device = torch.device("cpu")
        if backend == "nccl":
            torch.cuda.set_device(local_rank)
            device = torch.device("cuda", local_rank)
        if not dist.is_initialized():
            dist.init_process_group(
                backend, init_method="env://", timeout=datetime.timedelta(seconds=collective_timeout_s)
            )
        return cls(
            rank=dist.get_rank(),
            world_size=dist.get_world_size(),
            backend=backend,
            collective_timeout_s=collective_timeout_s,
            device=device,
            group=dist.group.WORLD,
            local_rank=local_rank,
        )


_TORCHRUN_CTX: TorchrunContext | None = None


def run_under_torchrun(fn: Callable[[WorkerContext, Any], Any], payload: Any, *, backend: str | None = None,
                       collective_timeout_s: float = 30.0) -> Any:
    """Run ``fn(ctx, payload)`` in this process, as one rank of a torchrun job (process group from env).

    ``payload`` is this rank's payload (a list of ``world_size`` is split per rank, as in ``run``).
    The context (and its subgroup cache) is created once per process and reused.
    """
    global _TORCHRUN_CTX
    if _TORCHRUN_CTX is None:
        _TORCHRUN_CTX = TorchrunContext.from_env(backend, collective_timeout_s)
    ctx = _TORCHRUN_CTX
    if isinstance(payload, (list, tuple)) and len(payload) == ctx.world_size:
        payload = payload[ctx.rank]
    return fn(ctx, payload)


def _main(argv: list[str] | None = None) -> int:
    """``torchrun ... -m rlconform.harness.workers.pool module:fn [json-payload]``: print each rank's result."""
    import importlib
    import json

    argv = sys.argv[1:] if argv is None else argv
    if not argv or ":" not in argv[0]:
        print("usage: torchrun --nproc-per-node N -m rlconform.harness.workers.pool module:fn [json-payload]", file=sys.stderr)
        return 2
    mod, _, name = argv[0].partition(":")
    fn = getattr(importlib.import_module(mod), name)
    payload = json.loads(argv[1]) if len(argv) > 1 else None
    result = run_under_torchrun(fn, payload)
    print(f"rank {_TORCHRUN_CTX.rank}: {result!r}", flush=True)
    import torch.distributed as dist

    dist.barrier()  # no rank tears its group down while a peer still talks to it (an abort at exit otherwise)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(_main())
