"""The distributed property tests: one test function, parametrized (by the plugin) over every finding
``op.property.dtype.regime`` of the kinds ``vocab_parallel``, ``context_parallel`` and ``dp_metric`` that
the selected binding provides. Hypothesis draws in the parent; each example is one round trip to the
session's worker pool (gloo ranks, spawned once; see :mod:`rlconform.distributed_tests.checks`).

Examples per finding are capped at :data:`MAX_DISTRIBUTED_EXAMPLES` (default 10, environment variable
``RLCONFORM_DIST_MAX_EXAMPLES``; ``--max-examples`` below the cap wins): a round trip costs 2–5 ms on
the pool, but an engine's first call in a worker may compile (verl's vocab-parallel entropy uses
``torch.compile``), and there are about 190 distributed findings per engine.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings, target

from rlconform.distributed_tests.strategies import strategy_for
from rlconform.harness.binding import BindingError, OpUnavailable
from rlconform.properties.case import Case
from rlconform.properties.checks import EngineCrash, PropertyFailure, run_check
from rlconform.properties.corpus import replay_corpus

MAX_DISTRIBUTED_EXAMPLES = int(os.environ.get("RLCONFORM_DIST_MAX_EXAMPLES", "10"))


def _fail_message(rec, case: Case, message: str) -> str:
    spec = rec.state.binding.spec
    return (f"{case.finding_id}: discrepancy (engine {spec})\n  {message.strip()}\n"
            f"  input: {case.summary()}\n"
            f"  reproduce: rlconform replay {rec.state.out}/cases/{case.finding_id}.json")


@pytest.mark.rlconform_kinds("vocab_parallel", "context_parallel", "dp_metric")
def test_distributed(rlconform_binding, rlconform_case, rlconform_finding, rlconform_state):
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

    def check(case: Case):
        rec.start(case)
        try:
            outcome = run_check(rlconform_binding, case)
        except EngineCrash:
            if hasattr(rec, "crashed"):
                rec.crashed()
            raise
        rec.observe(outcome)
        if not outcome.ok:
            raise PropertyFailure(_fail_message(rec, case, outcome.message))
        return outcome

    replay_corpus(rlconform_state.corpus, rec.id, check)

    base = rlconform_state.settings
    capped = settings(base, max_examples=max(1, min(base.max_examples, MAX_DISTRIBUTED_EXAMPLES)))

    @capped
    @given(inputs=strategy_for(op, dtype, regime))
    def run(inputs):
        outcome = check(Case(op, prop, dtype, regime, inputs))
        target(min(outcome.ratio, 1e6), label="error / tolerance")

    if rlconform_state.seed is not None:
        from hypothesis import seed

        run = seed(rlconform_state.seed)(run)
    run()
