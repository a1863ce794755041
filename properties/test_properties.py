"""The generic property tests: one test function, parametrized (by the plugin) over every finding
``op.property.dtype.regime`` that the selected binding provides. Hypothesis draws the inputs;
``target()`` climbs the error/tolerance ratio so fuzzing moves toward the worst case; a failure
carries a uniform message and a reproducer."""

from __future__ import annotations

import pytest
from hypothesis import given, target

from rlconform.harness.binding import BindingError, OpUnavailable
from rlconform.properties.case import Case
from rlconform.properties.checks import EngineCrash, PropertyFailure, run_check
from rlconform.properties.corpus import replay_corpus
from rlconform.properties.strategy_for import strategy_for


def _fail_message(rec, case: Case, message: str) -> str:
    spec = rec.state.binding.spec
    return (f"{case.finding_id}: discrepancy (engine {spec})\n  {message.strip()}\n"
            f"  input: {case.summary()}\n"
            f"  reproduce: rlconform replay {rec.state.out}/cases/{case.finding_id}.json")


@pytest.mark.rlconform_kinds("token_stat", "reduction", "agg_loss", "metric_pipeline", "advantage")
def test_property(rlconform_binding, rlconform_case, rlconform_finding, rlconform_state):
    op, prop, dtype, regime = rlconform_case
    rec = rlconform_finding
    try:
        rlconform_binding.resolve(op)
    except OpUnavailable as exc:
        rec.unavailable_detail = exc.detail[-3000:]
        pytest.skip(str(exc))
    except BindingError as exc:
        rec.unavailable_detail = f"binding error: {exc}"
        rec.binding_error = str(exc)
        pytest.skip(str(exc))

    def check(case: Case) -> None:
        rec.start(case)
        try:
            outcome = run_check(rlconform_binding, case)
        except EngineCrash:
            rec.crashed()
            raise
        rec.observe(outcome)
        if not outcome.ok:
            raise PropertyFailure(_fail_message(rec, case, outcome.message))
        return outcome

    replay_corpus(rlconform_state.corpus, rec.id, check)

    @rlconform_state.settings
    @given(inputs=strategy_for(op, dtype, regime))
    def run(inputs):
        outcome = check(Case(op, prop, dtype, regime, inputs))
        target(min(outcome.ratio, 1e6), label="error / tolerance")

    # one example-database key per finding (the one test function serves every finding)
    run.hypothesis.inner_test._hypothesis_internal_add_digest = rec.id.encode()

    if rlconform_state.seed is not None:
        from hypothesis import seed

        run = seed(rlconform_state.seed)(run)
    run()
