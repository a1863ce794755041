"""Running one finding (``op.property.dtype.regime``) under hypothesis: shared by the generic property
tests and the distributed tests.

Resolves the op (an unavailable one is skipped and recorded), replays the corpus of saved
counterexamples first, then draws examples, records each outcome in the finding recorder, climbs the
error/tolerance ratio with ``target()`` and raises :class:`PropertyFailure` with a uniform message and
a reproducer command.
"""

from __future__ import annotations

import pytest
from hypothesis import given, seed, settings, target

from rlconform.harness.binding import BindingError, OpUnavailable
from rlconform.harness.evaluation import EngineCrash
from rlconform.properties.case import Case
from rlconform.properties.checks import PropertyFailure
from rlconform.properties.corpus import replay_corpus


def failure_message(rec, case: Case, message: str) -> str:
    """The uniform failure text: finding id, engine, what failed, the input, the reproducer."""
    return (f"{case.finding_id}: discrepancy (engine {rec.state.binding.spec})\n  {message.strip()}\n"
            f"  input: {case.summary()}\n"
            f"  reproduce: rlconform replay {rec.state.out}/cases/{case.finding_id}.json")


def run_finding(binding, finding, rec, state, strategy, *, check, max_examples: int | None = None) -> None:
    """Check one finding ``(op, property, dtype, regime)`` of ``binding`` with inputs from ``strategy``;
    ``check(binding, case) -> Outcome`` judges one case (:func:`rlconform.properties.checks.run_check`,
    or :func:`rlconform.distributed_tests.checks.run_check` for the distributed families)."""
    op, prop, dtype, regime = finding
    try:
        binding.resolve(op)
    except OpUnavailable as exc:
        rec.unavailable_detail = exc.detail[-3000:]
        pytest.skip(str(exc))
    except BindingError as exc:
        rec.unavailable_detail = f"binding error: {exc}"
        rec.binding_error = str(exc)
        pytest.skip(str(exc))

    def check_one(case: Case):
        rec.start(case)
        try:
            outcome = check(binding, case)
        except EngineCrash:
            rec.crashed()
            raise
        rec.observe(outcome)
        if not outcome.ok:
            raise PropertyFailure(failure_message(rec, case, outcome.message))
        return outcome

    replay_corpus(state.corpus, rec.id, check_one)

    hsettings = state.settings
    if max_examples is not None:
        hsettings = settings(hsettings, max_examples=max(1, min(hsettings.max_examples, max_examples)))

    @hsettings
    @given(inputs=strategy)
    def run(inputs):
        outcome = check_one(Case(op, prop, dtype, regime, inputs))
        target(min(outcome.ratio, 1e6), label="error / tolerance")

    # one example-database key per finding (one test function serves every finding)
    run.hypothesis.inner_test._hypothesis_internal_add_digest = rec.id.encode()
    if state.seed is not None:
        run = seed(state.seed)(run)
    run()
