"""The generic property tests: one test function, parametrized (by the plugin) over every finding
``op.property.dtype.regime`` that the selected binding provides. Hypothesis draws the inputs;
``target()`` climbs the error/tolerance ratio so fuzzing moves toward the worst case; a failure
carries a uniform message and a reproducer (see :mod:`rlconform.properties.runner`)."""

from __future__ import annotations

import pytest

from rlconform.properties.runner import run_finding
from rlconform.properties.strategy_for import strategy_for


@pytest.mark.rlconform_kinds("token_stat", "reduction", "agg_loss", "metric_pipeline", "advantage")
def test_property(rlconform_binding, rlconform_case, rlconform_finding, rlconform_state):
    op, _, dtype, regime = rlconform_case
    run_finding(rlconform_binding, rlconform_case, rlconform_finding, rlconform_state,
                strategy_for(op, dtype, regime))
