"""The distributed property tests: one test function, parametrized (by the plugin) over every finding
``op.property.dtype.regime`` of the distributed op families (``vocab_parallel``, ``context_parallel``,
``dp_metric``) that the selected binding provides. Hypothesis draws in the parent; each example is one round trip to the
session's worker pool (gloo ranks, spawned once; see :mod:`rlconform.distributed_tests.checks`).

Examples per finding are capped by the op's :meth:`~rlconform.harness.core.opinfo.OpInfo.example_cap`
(:data:`~rlconform.harness.core.profiles.DISTRIBUTED_CAP`: default 10, environment variable
``RLCONFORM_DIST_MAX_EXAMPLES``; ``--max-examples`` below the cap wins), as every other finding's.
"""

from __future__ import annotations

import pytest

from rlconform.distributed_tests.checks import run_check
from rlconform.harness.catalog.ops import strategy_for
from rlconform.properties.runner import run_finding


@pytest.mark.rlconform_distributed(True)
def test_distributed(rlconform_binding, rlconform_case, rlconform_finding, rlconform_state):
    op, _, dtype, regime = rlconform_case
    run_finding(rlconform_binding, rlconform_case, rlconform_finding, rlconform_state,
                strategy_for(op, dtype, regime), check=run_check)
