"""DP ranks as threads: the collectives a step binding's engine code calls are exchanged in-process with the
collective's arithmetic, other groups reach torch unchanged, and a rank that fails does not hang the others."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from rlconform.harness.core.threaded_group import ThreadedGroup, collectives


def test_each_collective_combines_the_ranks_in_rank_order():
    group = ThreadedGroup(3)

    def rank_work():
        r = group.rank()
        x = torch.tensor([float(r + 1), 10.0 * (r + 1)])
        s, avg, mx = x.clone(), x.clone(), x.clone()
        dist.all_reduce(s, op=dist.ReduceOp.SUM, group=group)
        dist.all_reduce(avg, dist.ReduceOp.AVG, group)
        dist.all_reduce(mx, op=dist.ReduceOp.MAX, group=group)
        objects = [None] * 3
        dist.all_gather_object(objects, {"rank": r}, group=group)
        first = torch.tensor([float(r)])
        dist.broadcast(first, 0, group=group)
        return s.tolist(), avg.tolist(), mx.tolist(), objects, first.item(), dist.get_world_size(group), \
            dist.get_rank(group=group)

    with collectives():
        out = group.run([rank_work] * 3)
    for r, (s, avg, mx, objects, first, size, rank) in enumerate(out):
        assert s == [6.0, 60.0] and avg == [2.0, 20.0] and mx == [3.0, 30.0]
        assert objects == [{"rank": 0}, {"rank": 1}, {"rank": 2}]
        assert (first, size, rank) == (0.0, 3, r)
    assert dist.all_reduce is not None and "threaded_group" not in getattr(dist.all_reduce, "__module__", "")


def test_a_rank_that_raises_ends_the_run_with_its_own_error():
    group = ThreadedGroup(2, timeout_s=30)

    def waits():
        t = torch.zeros(1)
        dist.all_reduce(t, group=group)

    def fails():
        raise ValueError("rank 1's own error")

    with collectives(), pytest.raises(ValueError, match="rank 1's own error"):
        group.run([waits, fails])


def test_other_groups_reach_torch():
    with collectives():
        with pytest.raises((RuntimeError, ValueError)):  # no default process group here: torch's own error
            dist.all_reduce(torch.zeros(1))
