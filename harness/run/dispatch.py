"""Runner layer: check one saved case with the checker of its op's family (single process, or gloo ranks),
and the judge a referee serves for every family."""

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


def run_check_here(binding, case):
    """The referee's check of ``case`` (every family: the evaluation and the judgment on this process, the
    engine's calls made by the engine's worker)."""
    here = distributed_checks.run_check_here if get_op(case.op).distributed else process_checks.run_check_here
    return here(binding, case)


def referee_judge(payload: bytes, exchange=None):
    """What a referee process serves (:func:`rlconform.properties.referee.judge` with :func:`run_check_here`)."""
    from rlconform.properties import referee

    return referee.judge(payload, run_check_here, exchange)


def fork_helper_copy() -> bool:
    """Before a command starts its referee, probe or isolated child: fork the clean copy they fork from
    (:mod:`rlconform.harness.workers.zygote`), with the referee's judge already imported. Returns whether the
    copy runs (False: this process has loaded engine code or runs threads; they are spawned)."""
    import rlconform.harness.workers.isolated  # noqa: F401 - the probe's and the isolated child's runner
    import rlconform.harness.workers.referee  # noqa: F401
    from rlconform.harness.workers import zygote
    from rlconform.properties import referee

    return zygote.start(referee.check_copyable, referee.inherit_modules)
