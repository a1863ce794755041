"""Self-tests of the persistent distributed worker pool (rlconform.harness.workers.pool)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlconform.harness.workers import pool_cases as pc
from rlconform.harness.workers.pool import (
    PoolStartupError,
    RankFailure,
    WorkerPool,
    _pid_alive,
    close_all_pools,
    get_pool,
)

pytestmark = pytest.mark.distributed

DTYPES = ["float16", "bfloat16", "float32", "float64"]
HANG_DEADLINE_S = 3.0
#: a failure must be noticed at once, not at its deadline: failures other than a hang get this deadline, and
#: must be reported in less than half of it, a margin no load makes up (no wall-clock budget tests)
FAILURE_DEADLINE_S = 120.0
#: only catches a hang that was never ended: a loaded machine may take long to dump stacks and kill
SLACK_S = 60.0


def _wait_gone(pids, within_s=60.0):
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        alive = [p for p in pids if _pid_alive(p)]
        if not alive:
            return []
        time.sleep(0.05)
    return [p for p in pids if _pid_alive(p)]


@pytest.fixture
def pool2():
    """The test process's 2-rank pool with this module's timeouts: ``get_pool`` returns the pool another test of
    this process made, whose timeouts may be others (xdist sends any module's tests to any worker)."""
    pool = get_pool(2, timeout_s=20.0, collective_timeout_s=20.0)
    if (pool.timeout_s, pool.collective_timeout_s) != (20.0, 20.0):
        pool.close()
        pool = get_pool(2, timeout_s=20.0, collective_timeout_s=20.0)
    return pool


@pytest.fixture(scope="module")
def pool4():
    p = WorkerPool(4, timeout_s=20.0, collective_timeout_s=20.0)
    yield p
    pids = p.pids
    p.close()
    assert _wait_gone(pids) == []


@pytest.mark.parametrize("world", [2, 4])
def test_allreduce_dtypes(world, pool2, pool4):
    pool = pool2 if world == 2 else pool4
    n = world * (world + 1) // 2
    for dtype in DTYPES:
        payloads = [{"dtype": dtype, "values": [r + 1.0, 0.5 * (r + 1), -(r + 1.0)]} for r in range(world)]
        out = pool.run(pc.allreduce_sum, payloads)
        want = torch.tensor([n, 0.5 * n, -n], dtype=getattr(torch, dtype))
        assert len(out) == world
        for t in out:
            assert t.dtype == want.dtype
            assert torch.equal(t, want), (dtype, t, want)
        out = pool.run(pc.allreduce_sum, [{"dtype": dtype, "values": [float(r)], "op": "max"} for r in range(world)])
        assert all(float(t.item()) == world - 1 for t in out)


@settings(max_examples=30, deadline=None, database=None)
@given(st.lists(st.lists(st.floats(-1e6, 1e6, width=32), min_size=1, max_size=5), min_size=2, max_size=2)
       .filter(lambda v: len(v[0]) == len(v[1])))
def test_hypothesis_draws_in_parent(values):
    pool = get_pool(2, timeout_s=20.0, collective_timeout_s=20.0)
    out = pool.run(pc.allreduce_sum, [{"dtype": "float64", "values": v} for v in values])
    want = torch.tensor(values[0], dtype=torch.float64) + torch.tensor(values[1], dtype=torch.float64)
    assert all(torch.equal(t, want) for t in out)


def test_ordered_by_rank_and_persistent(pool2):
    pool2.start()
    pids = list(pool2.pids)
    for i in range(5):
        out = pool2.run(pc.rank_info, [f"p{i}-{r}" for r in range(2)])
        assert [o["rank"] for o in out] == [0, 1]
        assert [o["payload"] for o in out] == [f"p{i}-0", f"p{i}-1"]
        assert [o["pid"] for o in out] == pids  # same processes every case
        assert all(o["world_size"] == 2 and o["collective_timeout_s"] == 20.0 for o in out)
    # a single (non per-rank) payload goes to every rank
    assert [o["payload"] for o in pool2.run(pc.rank_info, {"k": 1})] == [{"k": 1}, {"k": 1}]


def test_subgroup_cache(pool4):
    first = pool4.run(pc.subgroup_allreduce, {"ranks": [0, 2]})
    second = pool4.run(pc.subgroup_allreduce, {"ranks": [0, 2]})
    assert [v for v, _ in first] == [2.0, 1.0, 2.0, 3.0]
    assert [g for _, g in first] == [g for _, g in second]  # same group objects: cached across cases


def _expect_failure(pool, fn, payload, timeout_s):
    old = list(pool.start().pids)
    t0 = time.monotonic()
    with pytest.raises(RankFailure) as ei:
        pool.run(fn, payload, timeout_s=timeout_s)
    elapsed = time.monotonic() - t0
    err = ei.value
    assert sorted(err.tracebacks) == list(range(pool.world_size))  # state for every rank
    assert all(err.tracebacks[r].strip() for r in range(pool.world_size))
    for r in range(pool.world_size):
        assert f"--- rank {r} ---" in str(err)
    assert _wait_gone(old) == []  # the old group ends (killed when the case failed)
    # the next case on the same pool succeeds, on a fresh group
    assert [o["rank"] for o in pool.run(pc.rank_info, None)] == list(range(pool.world_size))
    assert set(pool.pids).isdisjoint(old)
    return err, elapsed


def test_hung_rank(pool2):
    err, elapsed = _expect_failure(pool2, pc.hang_on, {"rank": 1}, HANG_DEADLINE_S)
    assert err.kind == "hung" and err.failed_ranks == [1]
    assert HANG_DEADLINE_S - 0.1 <= elapsed <= HANG_DEADLINE_S + SLACK_S
    assert "hang_on" in err.tracebacks[1] and "pool_cases.py" in err.tracebacks[1]  # its Python stack
    assert "completed" in err.tracebacks[0]


def test_sigkilled_rank(pool2):
    err, elapsed = _expect_failure(pool2, pc.sigkill_on, {"rank": 0}, FAILURE_DEADLINE_S)
    assert err.kind == "died" and err.failed_ranks == [0]
    assert elapsed < FAILURE_DEADLINE_S / 2, elapsed  # noticed at once, not at the deadline
    assert "SIGKILL" in err.tracebacks[0]
    # rank 1 was in an all_reduce with the dead peer: its error or its stack
    assert "all_reduce" in err.tracebacks[1] or "Traceback" in err.tracebacks[1]


def test_raising_rank(pool2):
    err, elapsed = _expect_failure(pool2, pc.raise_on, {"rank": 1, "msg": "boom-7f3a"}, FAILURE_DEADLINE_S)
    assert err.kind == "raised" and err.failed_ranks == [1]
    assert "ValueError: boom-7f3a" in err.tracebacks[1] and "raise_on" in err.tracebacks[1]
    assert "all_reduce" in err.tracebacks[0]  # rank 0 was blocked waiting for it
    assert elapsed < FAILURE_DEADLINE_S / 2, elapsed


def test_group_kept_when_every_rank_raised(pool2):
    """A case in which every rank raised (none blocked, none died) keeps the group: same processes, one
    health check passed, the next case runs on it."""
    old = list(pool2.start().pids)
    kept = pool2.groups_kept
    with pytest.raises(RankFailure) as ei:
        pool2.run(pc.raise_everywhere, {"msg": "rejected-4c1d"}, timeout_s=FAILURE_DEADLINE_S)
    assert ei.value.kind == "raised" and ei.value.failed_ranks == [0, 1]
    assert "rejected-4c1d on rank 1" in ei.value.tracebacks[1]
    assert pool2.pids == old and pool2.groups_kept == kept + 1
    assert [o["pid"] for o in pool2.run(pc.rank_info, None)] == old
    assert pool2.run(pc.allreduce_sum, {"dtype": "float32"})  # collectives still work


def test_group_respawned_when_health_check_fails(pool2):
    """Every rank returned, but rank 0 forgot a subgroup its peer still has: the health check fails and
    the group is respawned (a group whose ranks disagree is never reused)."""
    old = list(pool2.start().pids)
    checks, kept = pool2.group_checks, pool2.groups_kept
    with pytest.raises(RankFailure) as ei:
        pool2.run(pc.raise_after_forgetting_subgroup, {"ranks": [0, 1]}, timeout_s=FAILURE_DEADLINE_S)
    assert ei.value.kind == "raised"
    assert pool2.group_checks == checks + 1 and pool2.groups_kept == kept
    assert _wait_gone(old) == []
    assert [o["rank"] for o in pool2.run(pc.rank_info, None)] == [0, 1]
    assert set(pool2.pids).isdisjoint(old)


def test_segfault_and_exit(pool4):
    err, _ = _expect_failure(pool4, pc.segv_on, {"rank": 2}, 30.0)
    assert err.kind == "died" and err.failed_ranks == [2]
    assert "SIGSEGV" in err.tracebacks[2] and "segv_on" in err.tracebacks[2]  # faulthandler crash dump
    err, elapsed = _expect_failure(pool4, pc.exit_on, {"rank": 3, "code": 9}, FAILURE_DEADLINE_S)
    assert err.kind == "died" and "exit code 9" in err.tracebacks[3] and elapsed < FAILURE_DEADLINE_S / 2


def test_close_kills_and_is_idempotent():
    pool = WorkerPool(2)
    pool.run(pc.rank_info, None)
    pids = pool.pids
    assert all(_pid_alive(p) for p in pids)
    pool.close()
    pool.close()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    with pytest.raises(RuntimeError):
        pool.run(pc.rank_info, None)


def test_get_pool_cache_and_close_all():
    a = get_pool(2)
    assert get_pool(2) is a
    a.run(pc.rank_info, None)
    pids = a.pids
    close_all_pools()
    assert _wait_gone(pids) == []
    assert get_pool(2) is not a


def test_startup_error_is_clear():
    if torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA")
    with WorkerPool(2, backend="nccl", startup_timeout_s=60) as pool:
        with pytest.raises(PoolStartupError) as ei:
            pool.start()
    msg = str(ei.value)
    assert "failed to start" in msg and "--- rank 0 ---" in msg and "--- rank 1 ---" in msg


_ORPHAN_SCRIPT = r"""
import os, sys
from rlconform.harness.workers.pool import WorkerPool
from rlconform.harness.workers import pool_cases as pc
if __name__ == "__main__":
    pool = WorkerPool(2)
    out = pool.run(pc.rank_info, None)
    print(" ".join(str(o["pid"]) for o in out), flush=True)
    if sys.argv[1] == "hang":
        import threading
        threading.Thread(target=pool.run, args=(pc.hang_on, {"rank": 0}), daemon=True).start()
        import time; time.sleep(0.5)   # rank 0 is now inside a case
    os._exit(0)                        # no atexit, no cleanup
"""


@pytest.mark.parametrize("mode", ["idle", "hang"])
def test_workers_die_with_parent(tmp_path, mode):
    script = tmp_path / "orphan_parent.py"
    script.write_text(_ORPHAN_SCRIPT)
    proc = subprocess.run([sys.executable, str(script), mode], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    pids = [int(x) for x in proc.stdout.split()]
    assert len(pids) == 2
    t0 = time.monotonic()
    alive = _wait_gone(pids)
    assert alive == [], f"workers {alive} outlived their parent (waited {time.monotonic() - t0:.0f} s)"


def test_run_under_torchrun_env(tmp_path):
    """The same fn runs in-process from torchrun-style env (world 1 here; torchrun sets the same vars)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    proc = subprocess.run(
        [sys.executable, "-m", "rlconform.harness.workers.pool", "rlconform.harness.workers.pool_cases:allreduce_sum",
         json.dumps({"dtype": "float64", "values": [1.5, 2.0]})],
        capture_output=True, text=True, timeout=120, env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert "rank 0: tensor([1.5000, 2.0000], dtype=torch.float64)" in proc.stdout
