"""Shared piece of the policy-step mutants: the reference binding whose two step ops run the float32 reference
step with one wiring flaw (a keyword of :func:`rlconform.harness.families.policy_step.fp32_step`)."""

from __future__ import annotations

import functools

from rlconform.harness.catalog.binding import Binding, PolicyStep
from rlconform.harness.families.policy_step import METRICS_OP, MODES, STEP_OP, fp32_step
from rlconform.harness.mutants._base import mutant


def step_mutant(name: str, doc: str, **flaw) -> Binding:
    """The reference binding under ``mutants.<name>`` with ``policy_step`` and ``policy_step_metrics`` bound to
    the float32 step with ``flaw`` (e.g. ``temperature_times=2``)."""
    step = PolicyStep(run=functools.partial(fp32_step, **flaw), modes=MODES, token_budgets=True, dp_sizes=(1, 2),
                      mini_batches=True)
    return mutant(name, doc, **{STEP_OP: step, METRICS_OP: step})
