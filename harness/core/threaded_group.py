"""A DP group whose ranks are threads of one process: the collectives of an engine's step, run in-process.

A step binding that drives an engine's update on several DP ranks without launching processes runs each rank's
code in a thread and hands the engine a :class:`ThreadedGroup` as its DP group. While :func:`collectives` is
active, ``torch.distributed.all_reduce`` / ``all_gather`` / ``all_gather_object`` / ``broadcast`` /
``barrier`` / ``get_world_size`` / ``get_rank`` called with such a group exchange the ranks' values through
the group (every rank blocks until all have arrived, as the real collective does), and pass any other group to
torch unchanged. The arithmetic is the collective's: SUM, AVG (the sum divided by the group size), MAX, MIN,
PRODUCT over the ranks' tensors in rank order, in their dtype. Nothing else of the engine is touched: this is
collective plumbing, listed as a stand-in on the findings of the bindings that use it.

A rank that never reaches a collective the others wait in (a wiring bug, or an exception) breaks the barrier
after ``timeout_s``: every rank then raises, and :meth:`ThreadedGroup.run` re-raises the first rank's own
exception.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Iterator, Sequence

__all__ = ["ThreadedGroup", "collectives"]

_PATCH_LOCK = threading.Lock()


class ThreadedGroup:
    """``size`` DP ranks run as threads (module doc). ``rank()`` is the calling thread's rank inside :meth:`run`."""

    def __init__(self, size: int, timeout_s: float = 300.0):
        if size < 1:
            raise ValueError(f"a group has at least one rank, got {size}")
        self.size = size
        self._barrier = threading.Barrier(size, timeout=timeout_s)
        self._slots: list[Any] = [None] * size
        self._local = threading.local()

    def rank(self) -> int:
        rank = getattr(self._local, "rank", None)
        if rank is None:
            raise RuntimeError("ThreadedGroup.rank() outside one of its ranks' threads")
        return rank

    def exchange(self, value: Any) -> list:
        """Every rank's ``value``, in rank order (blocks until all ranks have called it)."""
        self._slots[self.rank()] = value
        self._barrier.wait()
        out = list(self._slots)
        self._barrier.wait()  # nobody overwrites a slot before every rank has read them all
        return out

    def run(self, work: Sequence[Callable[[], Any]]) -> list:
        """Call ``work[k]()`` as rank k, each in its own thread; their results in rank order. Raises the first
        rank's exception (a rank that raised breaks the barrier, so the others do not wait forever)."""
        if len(work) != self.size:
            raise ValueError(f"{len(work)} pieces of work for {self.size} ranks")
        results: list[Any] = [None] * self.size
        errors: list[BaseException | None] = [None] * self.size

        def body(rank: int) -> None:
            self._local.rank = rank
            try:
                results[rank] = work[rank]()
            except BaseException as exc:  # handed to the caller below
                errors[rank] = exc
                self._barrier.abort()

        threads = [threading.Thread(target=body, args=(k,), name=f"dp-rank-{k}") for k in range(self.size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        own = [e for e in errors if e is not None and not isinstance(e, threading.BrokenBarrierError)]
        if own or any(errors):
            raise (own or [e for e in errors if e is not None])[0]
        return results


def _reduce(values: list, op) -> Any:
    import torch
    import torch.distributed as dist

    stacked = torch.stack([v.detach() for v in values])
    if op == dist.ReduceOp.SUM:
        return stacked.sum(0)
    if op == dist.ReduceOp.AVG:
        return stacked.sum(0) / len(values)
    if op == dist.ReduceOp.MAX:
        return stacked.max(0).values
    if op == dist.ReduceOp.MIN:
        return stacked.min(0).values
    if op == dist.ReduceOp.PRODUCT:
        return stacked.prod(0)
    raise ValueError(f"reduce op {op} is not simulated")


@contextlib.contextmanager
def collectives() -> Iterator[None]:
    """``torch.distributed``'s collectives answer a :class:`ThreadedGroup` in-process inside the block (module doc);
    one block at a time in a process."""
    import torch.distributed as dist

    names = ("all_reduce", "all_gather", "all_gather_object", "broadcast", "barrier", "get_world_size", "get_rank")
    with _PATCH_LOCK:
        real = {n: getattr(dist, n) for n in names}

        def group_of(args, kwargs, at):
            group = kwargs.get("group", args[at] if len(args) > at else None)
            return group if isinstance(group, ThreadedGroup) else None

        def all_reduce(tensor, *args, **kwargs):
            g = group_of(args, kwargs, 1)
            if g is None:
                return real["all_reduce"](tensor, *args, **kwargs)
            op = kwargs.get("op", args[0] if args else dist.ReduceOp.SUM)
            tensor.copy_(_reduce(g.exchange(tensor.detach().clone()), op).to(tensor.dtype))

        def all_gather(tensor_list, tensor, *args, **kwargs):
            g = group_of(args, kwargs, 0)
            if g is None:
                return real["all_gather"](tensor_list, tensor, *args, **kwargs)
            for out, value in zip(tensor_list, g.exchange(tensor.detach().clone())):
                out.copy_(value)

        def all_gather_object(object_list, obj, *args, **kwargs):
            g = group_of(args, kwargs, 0)
            if g is None:
                return real["all_gather_object"](object_list, obj, *args, **kwargs)
            object_list[:] = g.exchange(obj)

        def broadcast(tensor, src, *args, **kwargs):
            g = group_of(args, kwargs, 0)
            if g is None:
                return real["broadcast"](tensor, src, *args, **kwargs)
            tensor.copy_(g.exchange(tensor.detach().clone())[src])

        def barrier(*args, **kwargs):
            g = group_of(args, kwargs, 0)
            if g is None:
                return real["barrier"](*args, **kwargs)
            g.exchange(None)

        def get_world_size(*args, **kwargs):
            g = group_of(args, kwargs, 0)
            return g.size if g is not None else real["get_world_size"](*args, **kwargs)

        def get_rank(*args, **kwargs):
            g = group_of(args, kwargs, 0)
            return g.rank() if g is not None else real["get_rank"](*args, **kwargs)

        patched = dict(all_reduce=all_reduce, all_gather=all_gather, all_gather_object=all_gather_object,
                       broadcast=broadcast, barrier=barrier, get_world_size=get_world_size, get_rank=get_rank)
        try:
            for n, fn in patched.items():
                setattr(dist, n, fn)
            yield
        finally:
            for n, fn in real.items():
                setattr(dist, n, fn)
