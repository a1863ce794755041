"""Checking one concrete :class:`~rlconform.properties.case.Case` on one process.

``run_check(binding, case)`` asks the op's family (:mod:`rlconform.harness.families`) to evaluate the
case — call the engine through its binding, the float64 reference and the dtype-faithful fp32 path —
and judges the resulting :class:`~rlconform.harness.core.evaluation.Evaluation` with the generic property
(:mod:`rlconform.properties.generic`). It raises :class:`EngineCrash` when the engine itself raises.
The hypothesis tests in this package draw cases and call it; ``rlconform replay`` calls it on a saved
case. A case of a second implementation of a variant (regime ``variant+impl@data``) is
evaluated by :func:`evaluate_implementation`. Distributed families are checked by :func:`rlconform.distributed_tests.checks.run_check`.
"""

from __future__ import annotations

import dataclasses

from rlconform.harness.catalog.ops import family_of, get_op
from rlconform.harness.core import failure
from rlconform.harness.core.evaluation import EngineCrash, Evaluation, call_engine  # noqa: F401 - re-exported
from rlconform.harness.core.opinfo import (
    IMPLEMENTATIONS_AGREE,
    MATCHES_REFERENCE,
    plain_regime,
    regime_implementation,
    split_regime,
)
from rlconform.harness.core.tensors import TORCH_DTYPES, as_numpy, out_dtype, representable, to_tensor  # noqa: F401
from rlconform.harness.families.agg_loss import describe_partition, partition_rows  # noqa: F401
from rlconform.properties.case import Case
from rlconform.properties.generic import JUDGES, Outcome  # noqa: F401 - re-exported


class PropertyFailure(AssertionError):
    """A property does not hold for the engine (a discrepancy)."""


def run_check(binding, case: Case) -> Outcome:
    """Check ``case`` against ``binding``; raises EngineCrash, OpUnavailable, VariantNotProvided or
    BindingError (a distributed op, or a property that does not apply). With a referee connected
    (:mod:`rlconform.properties.referee`) only the engine's calls run here: the evaluation and
    the verdict are the referee's;
    otherwise everything runs on this process (:func:`run_check_here`)."""
    from rlconform.harness.core.compile_limits import keep_compiling
    from rlconform.properties import referee

    keep_compiling()  # a compiled engine function keeps compiling past dynamo's limit, whatever ran before
    try:
        if referee.connected():
            return referee.refereed_check(binding, case)
        return run_check_here(binding, case)
    finally:
        keep_compiling()  # the engine imported dynamo in this case: raised before the next one


def run_check_here(binding, case: Case) -> Outcome:
    """Check ``case`` against ``binding`` on this process (the engine's calls and the judgment both)."""
    from rlconform.harness.catalog.binding import BindingError

    info = get_op(case.op)
    if case.property not in info.properties:
        raise BindingError(f"property {case.property!r} does not apply to op {case.op!r}")
    family = family_of(case.op)
    if family.evaluate is None:
        raise BindingError(f"op {case.op!r} is checked on distributed ranks (rlconform.distributed_tests)")
    impl = regime_implementation(case.regime)
    if impl is None and case.property == IMPLEMENTATIONS_AGREE:
        raise BindingError(f"property {IMPLEMENTATIONS_AGREE!r} is checked only under the regimes of a second "
                           f"implementation (variant+impl@data), not {case.regime!r}")
    try:
        ev = family.evaluate(binding, case) if impl is None else evaluate_implementation(family, binding, case, impl)
    except EngineCrash as exc:
        plain = case if impl is None else dataclasses.replace(case, regime=plain_regime(case.regime))
        guard = declared_guard(binding, plain, exc)
        if guard is None:
            raise
        return Outcome(True, f"declared guard {guard.name}: {_engine_error(exc)}", declared=guard.name)
    outcome = JUDGES[case.property](ev)
    outcome.declared = ev.declared
    return outcome


def evaluate_implementation(family, binding, case: Case, impl: str) -> Evaluation:
    """The Evaluation of a case of a second implementation ``impl`` of a variant (regime
    ``variant+impl@data``): the family evaluates the same inputs under the plain
    ``variant@data`` regime with the binding seen through :class:`ImplementationView`, so every property
    judges the second implementation exactly as it judges the first. For ``implementations_agree`` both
    implementations are evaluated as for ``matches_reference`` and the second one's outputs are the
    Evaluation's alternative, the default one's its base. Raises :class:`VariantNotProvided` when the
    engine has no such implementation of the variant, EngineCrash when either implementation raises."""
    from rlconform.harness.catalog.binding import ImplementationView

    plain = dataclasses.replace(case, regime=plain_regime(case.regime))
    variant = split_regime(case.regime)[0]
    binding.resolve(case.op).get(case.op, variant, binding.name)  # VariantNotProvided before any engine call
    view = ImplementationView(binding, case.op, impl)
    if case.property != IMPLEMENTATIONS_AGREE:
        return family.evaluate(view, plain)
    as_values = dataclasses.replace(plain, property=MATCHES_REFERENCE)
    default = family.evaluate(binding, as_values)
    second = family.evaluate(view, as_values)
    ev = Evaluation(base_label="the default implementation", undefined=default.undefined or second.undefined)
    ev.problems = [_prefixed("default implementation", p) for p in default.problems] + [
        _prefixed(f"{impl} implementation", p) for p in second.problems]
    ev.values = [dataclasses.replace(c, label=f"{c.label} (default)") for c in default.outputs]
    ev.alternatives = [(f"the {impl} implementation",
                        [dataclasses.replace(c, label=f"{c.label} ({impl})") for c in second.outputs])]
    return ev


def _prefixed(which: str, problem):
    """A problem of one of two implementations, saying which: a sentence prefixed, a clause with its text
    prefixed and its fields kept."""
    if isinstance(problem, failure.Clause):
        return dataclasses.replace(problem, text=f"{which}: {problem.text}")
    return f"{which}: {problem}"


def _engine_error(exc: EngineCrash) -> str:
    """The engine's own ``Type: message`` of a crash (the cause's, not the harness wrapper's)."""
    cause = exc.__cause__
    return f"{type(cause).__name__}: {cause}" if cause is not None else str(exc)


def declared_guard(binding, case: Case, exc: EngineCrash):
    """The binding's declared guard that covers this crash, or None: the engine raised the
    declared error type with a matching message where the declared trigger holds on the case's inputs. A
    guard raising anywhere else, or another error, stays a crash."""
    from rlconform.harness.core.declared import matching_guard

    cause = exc.__cause__
    if cause is None:
        return None
    return matching_guard(getattr(binding, "declared", ()), case, type(cause).__name__, str(cause))
