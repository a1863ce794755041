"""The distributed property tests: one test function, parametrized (by the plugin) over every finding
``op.property.dtype.regime`` of the distributed op families (``vocab_parallel``, ``context_parallel``,
``dp_metric``) that the selected binding provides. Hypothesis draws in the parent; each example is one round trip to the
session's worker pool (gloo ranks, spawned once; see :mod:`rlconform.distributed_tests.checks`).

Examples per finding are capped at :data:`MAX_DISTRIBUTED_EXAMPLES` (default 10, environment variable
``RLCONFORM_DIST_MAX_EXAMPLES``; ``--max-examples`` below the cap wins): a round trip costs 2–5 ms on
the pool, but an engine's first call in a worker may compile (verl's vocab-parallel entropy uses
``torch.compile``), and there are about 190 distributed findings per engine.
"""

from __future__ import annotations

import os

import pytest

from rlconform.distributed_tests.checks import run_check
from rlconform.harness.catalog import strategy_for
from rlconform.properties.runner import run_finding

MAX_DISTRIBUTED_EXAMPLES = int(os.environ.get("RLCONFORM_DIST_MAX_EXAMPLES", "10"))


@pytest.mark.rlconform_distributed(True)
def test_distributed(rlconform_binding, rlconform_case, rlconform_finding, rlconform_state):
    op, _, dtype, regime = rlconform_case
    run_finding(rlconform_binding, rlconform_case, rlconform_finding, rlconform_state,
                strategy_for(op, dtype, regime), check=run_check, max_examples=MAX_DISTRIBUTED_EXAMPLES)
