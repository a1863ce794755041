"""Small module-level case functions for the pool's self-tests and benchmark.

Case functions must be importable by reference in the spawned workers, so they live in the package,
not in test files.
"""

from __future__ import annotations

import os
import signal
import time

_DTYPES = ("float16", "bfloat16", "float32", "float64")


def rank_info(ctx, payload):
    return {"rank": ctx.rank, "world_size": ctx.world_size, "pid": os.getpid(), "payload": payload,
            "collective_timeout_s": ctx.collective_timeout_s}


def rank_process(ctx, payload):
    """The rank's process: pid, parent pid, torch's intra-op threads, the environment variables named in
    ``payload["env"]``; prints ``rank R`` to stderr."""
    import sys

    import torch

    print(f"rank {ctx.rank}", file=sys.stderr, flush=True)
    return {"pid": os.getpid(), "ppid": os.getppid(), "threads": torch.get_num_threads(),
            "env": {name: os.environ.get(name) for name in (payload or {}).get("env", ())}}


def allreduce_sum(ctx, payload):
    """payload: {"dtype": str, "values": list[float] (this rank's), "op": "sum"|"max"|"min"}."""
    import torch
    import torch.distributed as dist

    dtype = getattr(torch, payload.get("dtype", "float32"))
    values = payload.get("values", [float(ctx.rank + 1)])
    op = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}[payload.get("op", "sum")]
    t = torch.tensor(values, dtype=dtype)
    dist.all_reduce(t, op=op, group=ctx.group)
    return t


def subgroup_allreduce(ctx, payload):
    """All-reduce within the subgroup ``payload["ranks"]`` (created once, cached across cases)."""
    import torch
    import torch.distributed as dist

    ranks = tuple(payload["ranks"])
    g = ctx.new_group(ranks)
    t = torch.tensor([float(ctx.rank)])
    if ctx.rank in ranks:
        dist.all_reduce(t, group=g)
    return float(t.item()), id(g)


def raise_on(ctx, payload):
    """Rank ``payload["rank"]`` raises ValueError(payload["msg"]); the others enter an all_reduce."""
    import torch
    import torch.distributed as dist

    if ctx.rank == payload["rank"]:
        raise ValueError(payload["msg"])
    t = torch.ones(1)
    dist.all_reduce(t, group=ctx.group)  # blocks: the raising rank never joins
    return t


def hang_on(ctx, payload):
    """Rank ``payload["rank"]`` sleeps forever; the others return at once."""
    if ctx.rank == payload["rank"]:
        time.sleep(1e6)
    return ctx.rank


def sigkill_on(ctx, payload):
    """Rank ``payload["rank"]`` SIGKILLs itself mid-case; the others wait in an all_reduce."""
    import torch
    import torch.distributed as dist

    if ctx.rank == payload["rank"]:
        os.kill(os.getpid(), signal.SIGKILL)
    t = torch.ones(1)
    dist.all_reduce(t, group=ctx.group)
    return t


def exit_on(ctx, payload):
    if ctx.rank == payload["rank"]:
        os._exit(payload.get("code", 7))
    return ctx.rank


def segv_on(ctx, payload):
    """Rank ``payload["rank"]`` segfaults (faulthandler writes its crash traceback)."""
    import ctypes

    if ctx.rank == payload["rank"]:
        ctypes.string_at(0)
    return ctx.rank


def raise_everywhere(ctx, payload):
    """Every rank raises ValueError(payload["msg"]) before any collective (an engine that rejects its
    input on every rank): the group stays consistent and is kept."""
    raise ValueError(f"{payload['msg']} on rank {ctx.rank}")


def raise_after_forgetting_subgroup(ctx, payload):
    """Every rank joins subgroup ``payload["ranks"]``, rank 0 drops it from its cache (the ranks' states
    diverge), every rank raises: all ranks returned, but the health check blocks rank 1 in the subgroup
    rank 0 no longer has, so the group is respawned."""
    key = None
    ctx.new_group(payload["ranks"])
    if ctx.rank == 0:
        key = next(k for k in ctx._groups if k[0] == tuple(payload["ranks"]))
        del ctx._groups[key]
    raise ValueError(f"raised on rank {ctx.rank}")


def compile_limits(ctx, payload):
    """This rank's torch.compile recompile limits (see ``pool_worker._keep_compiling``); imports dynamo
    (``payload`` true: only report whether it was imported before)."""
    import sys

    if payload and "torch._dynamo.config" not in sys.modules:
        return None
    import torch._dynamo.config as dynamo_config

    return {"recompile_limit": dynamo_config.recompile_limit,
            "accumulated_recompile_limit": dynamo_config.accumulated_recompile_limit}
