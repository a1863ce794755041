"""OpenMP threads that have nothing to do sleep instead of spinning, in every process a run starts.

torch's CPU build runs its intra-op parallel regions on OpenMP (libgomp) threads. With ``OMP_WAIT_POLICY``
unset, a thread that finishes its share of a region spins for the next one before it sleeps. A check is many
small regions in several processes at once (the controller, engine workers, their referees, gloo ranks, and in
the self-tests several test processes), so spinning threads burned the cores another process was waiting
for. ``PASSIVE`` makes them sleep; how work is split over threads and summed does not change, so no number
does: measured on a 2-core machine, a check of verl 0.9.1's ``entropy`` and ``agg_loss``
(``matches_reference``, ``-n 2``) gave bit-identical statuses and error ratios on all 51 findings and used
51 CPU s instead of 68.

libgomp reads the variable once, when it is loaded (``import torch``): :func:`sleep_when_idle` sets it in
the environment before this process imports torch, and every process it starts inherits it. A value the
user set is kept. ``docs/decisions/idle-threads.md`` records the measurement.
"""

from __future__ import annotations

import os

ENV = "OMP_WAIT_POLICY"


def sleep_when_idle(environ=os.environ) -> bool:
    """Set ``OMP_WAIT_POLICY=PASSIVE`` in ``environ`` unless it is set (to anything, even empty). Returns
    whether it was set here. Takes effect for torch in this process only if torch is not imported yet; always
    for the processes started after it."""
    if ENV in environ:
        return False
    environ[ENV] = "PASSIVE"
    return True
