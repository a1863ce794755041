"""Runner layer: check one saved case with the checker of its op's family (single process, or gloo ranks)."""

from __future__ import annotations

from rlconform.distributed_tests import checks as distributed_checks
from rlconform.harness.catalog.ops import get_op
from rlconform.properties import checks as process_checks


def checker_for(op: str):
    """``run_check(binding, case) -> Outcome`` for ``op``: distributed families run on gloo ranks."""
    return distributed_checks.run_check if get_op(op).distributed else process_checks.run_check


def run_check(binding, case):
    """Check ``case`` against ``binding``; raises EngineCrash, OpUnavailable (also for an op that needs CUDA
    on a CPU run), VariantNotProvided or BindingError."""
    gap = getattr(binding, "device_gap", None)
    gap = gap(case.op, case.regime) if callable(gap) else None
    if gap is not None:
        from rlconform.harness.catalog.binding import OpUnavailable

        raise OpUnavailable(case.op, gap)
    return checker_for(case.op)(binding, case)
