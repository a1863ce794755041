"""Pool ranks: idle ranks block instead of polling, and what a rank computes does not depend on the
findings it ran before.

Idle ranks block instead of polling: every gloo group of a rank (the default one and each cached
subgroup) shares one transport device, so a rank runs one ``gloo_tcp_loop`` thread (gloo's loop wakes
every 10 ms even when idle) however many subgroups the distributed families created, instead of one per
group (a rank with ~24 groups sat at about 2 % of a core on a loaded 2-core box, about 10 % elsewhere;
with one device about 0.3 %, as with the default group alone). No CPU-time assertion (a loaded CI box):
the thread count is what the fix changes.

A rank compiles every variant of an engine's ``torch.compile`` function: dynamo's recompile limit (8 per
function, then eager for the rest of the process) is raised in each rank (once the engine imports dynamo), so a finding's answer does not
depend on how many dtypes and shapes earlier findings sent (verl's vocab-parallel entropy)."""

from __future__ import annotations

import os

import pytest

from rlconform.harness.workers import pool_cases as pc
from rlconform.harness.workers.pool import WorkerPool

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux /proc")


def _thread_names(pid: int) -> list[str]:
    names = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as fh:
                names.append(fh.read().strip())
        except OSError:
            pass
    return names


@pytest.mark.distributed
def test_subgroups_share_one_gloo_loop_thread():
    pool = WorkerPool(2, timeout_s=60.0, collective_timeout_s=60.0)
    try:
        for ranks in ([0], [1], [0, 1]):
            out = pool.run(pc.subgroup_allreduce, {"ranks": ranks})
            assert len(out) == 2
        assert [v for v, _ in pool.run(pc.subgroup_allreduce, {"ranks": [0, 1]})] == [1.0, 1.0]
        for pid in pool.pids:
            loops = [n for n in _thread_names(pid) if n == "gloo_tcp_loop"]
            assert len(loops) == 1, (pid, sorted(_thread_names(pid)))
    finally:
        pool.close()


@pytest.mark.distributed
def test_ranks_keep_compiling_past_dynamos_default_limit():
    from rlconform.harness.core.compile_limits import ACCUMULATED_RECOMPILE_LIMIT, RECOMPILE_LIMIT

    pool = WorkerPool(2, timeout_s=120.0, collective_timeout_s=60.0)
    try:
        pool.run(pc.compile_limits, None)  # the first case imports dynamo (as an engine would)...
        for limits in pool.run(pc.compile_limits, True):  # ...and the next finds the limits raised
            assert limits == {"recompile_limit": RECOMPILE_LIMIT, "accumulated_recompile_limit": ACCUMULATED_RECOMPILE_LIMIT}
    finally:
        pool.close()
