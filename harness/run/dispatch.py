"""Runner layer: check one saved case with the checker of its op's family (single process, or gloo ranks)."""

from __future__ import annotations

from rlconform.distributed_tests import checks as distributed_checks
from rlconform.harness.catalog.ops import get_op
from rlconform.properties import checks as process_checks


def checker_for(op: str):
    """``run_check(binding, case) -> Outcome`` for ``op``: distributed families run on gloo ranks."""
    return distributed_checks.run_check if get_op(op).distributed else process_checks.run_check


def run_check(binding, case):
    """Check ``case`` against ``binding``; raises EngineCrash, OpUnavailable, VariantNotProvided or BindingError."""
    return checker_for(case.op)(binding, case)
