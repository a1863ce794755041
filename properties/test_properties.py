"""The generic property tests: one test function, parametrized (by the plugin) over every finding
``op.property.dtype.regime`` of the single-process op families that the selected binding provides.
Hypothesis draws the inputs from the op family's strategy; ``target()`` climbs the error/tolerance ratio
so fuzzing moves toward the worst case; a failure carries a uniform message and a reproducer (see
:mod:`rlconform.properties.runner`)."""

from __future__ import annotations

import pytest

from rlconform.harness.catalog.ops import strategy_for
from rlconform.properties.checks import run_check
from rlconform.properties.runner import run_finding


@pytest.mark.rlconform_distributed(False)
def test_property(rlconform_binding, rlconform_case, rlconform_finding, rlconform_state):
    op, _, dtype, regime = rlconform_case
    run_finding(rlconform_binding, rlconform_case, rlconform_finding, rlconform_state,
                strategy_for(op, dtype, regime), check=run_check)
