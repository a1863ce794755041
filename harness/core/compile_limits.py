"""torch.compile recompile limits that no run reaches, so that what a process computes does not depend on
the findings it ran before.

dynamo recompiles a compiled engine function per dtype and per size-0/1 specialisation, and past its
limit (8 per function) runs that frame *eagerly* for the rest of the process. A process of rlconform lives
for a whole run and sees every finding's dtypes and shapes: without raised limits the same input gave
another answer after other findings had run (verl's vocab-parallel entropy compiles its ``mul_reduce``
with ``dynamic=True``: ``vocab_parallel_entropy.partition_invariant.float16.tp2_fp16_extreme``, its third
example a discrepancy alone, a pass after 27 other vocab-parallel findings).

:func:`keep_compiling` is applied once dynamo is imported (by the engine; importing it here would cost
every process about a dozen seconds on a loaded 2-core box), before and after each case, so the limits
are raised before a second case can recompile anything. Core layer: imports nothing of the project.
"""

from __future__ import annotations

import sys

#: recompilations allowed per compiled function, and in all (dynamo's defaults: 8 and 256)
RECOMPILE_LIMIT, ACCUMULATED_RECOMPILE_LIMIT = 1 << 12, 1 << 16


def keep_compiling() -> bool:
    """Raise dynamo's recompile limits in this process (never lowers them). Returns False while dynamo is
    not imported (nothing to do yet), True once the limits are raised."""
    dynamo_config = sys.modules.get("torch._dynamo.config")
    if dynamo_config is None:
        return False
    for name, value in (("recompile_limit", RECOMPILE_LIMIT),
                        ("accumulated_recompile_limit", ACCUMULATED_RECOMPILE_LIMIT)):
        if hasattr(dynamo_config, name):
            setattr(dynamo_config, name, max(getattr(dynamo_config, name), value))
    return True
