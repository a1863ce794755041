"""The generic properties: each judges an :class:`~rlconform.harness.evaluation.Evaluation` of one case,
whatever op family produced it.

=============================  ============================================================================
property                       holds when
=============================  ============================================================================
matches_reference              every compared value and gradient is within the tolerance policy
                               (:mod:`rlconform.harness.tolerance`) of the float64 reference
partition_invariant            each alternative partition's results differ from the base partition's by at
                               most the sum of the two tolerance bounds, element by element
non_destructive                no input changed (bitwise, version counters), after forward and backward
finite_where_reference_finite  no NaN/inf (values or gradients) where the reference is finite and
                               representable in the output dtype
metric_integrity               every emitted metric key reaches the final dict as a number
mask_invariant                 garbage (NaN, ±inf, 1e30) at masked positions changes neither the values nor
                               the gradients of the unmasked result (judged like partition_invariant)
=============================  ============================================================================

Every property fails on an Evaluation's ``problems`` (a gradient expected but absent, a wrong shape, a
missing metric key) and on an Evaluation with nothing to compare that does not say why (``undefined``):
silence is never conformance.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from rlconform.harness.evaluation import Compared, Evaluation
from rlconform.harness.opinfo import (
    FINITE, MASK_INVARIANT, MATCHES_REFERENCE, METRIC_INTEGRITY, NON_DESTRUCTIVE, PARTITION_INVARIANT,
)
from rlconform.harness.tensors import representable
from rlconform.harness.tolerance import Comparison, bound, compare


@dataclasses.dataclass
class Outcome:
    """Result of one check: ``ok``; ``message`` (what failed, uniform wording); error measures of the
    worst compared element (``max_abs_err``, ``max_rel_err``, ``tolerance``) and ``ratio`` (error over
    tolerance; > 1 is a discrepancy; the quantity hypothesis ``target()`` climbs)."""

    ok: bool
    message: str = ""
    max_abs_err: float = 0.0
    max_rel_err: float = 0.0
    tolerance: float = 0.0
    ratio: float = 0.0

    def absorb(self, label: str, c: Comparison) -> None:
        if c.max_abs_err >= self.max_abs_err or not c.ok:
            self.max_abs_err = max(self.max_abs_err, c.max_abs_err)
            self.max_rel_err = max(self.max_rel_err, c.max_rel_err)
        if c.worst_ratio >= self.ratio:
            self.ratio, self.tolerance = c.worst_ratio, c.tolerance
        if not c.ok:
            self.ok = False
            self.message += (("\n" if self.message else "") + f"{label}: {c.describe()}")

    def fail(self, message: str) -> None:
        self.ok = False
        self.ratio = max(self.ratio, math.inf)
        self.message += ("\n" if self.message else "") + message


def _compare(c: Compared) -> Comparison:
    return compare(c.engine, c.reference, c.faithful, dtype=c.dtype, kind=c.kind, only_where=c.only_where)


def _nothing(ev: Evaluation, outcome: Outcome, what: str) -> bool:
    """Fail ``outcome`` when ``ev`` has nothing to judge for ``what`` and does not say why."""
    if ev.undefined is not None or ev.problems:
        return False
    outcome.fail(f"nothing to compare: the engine produced no {what} for this case")
    return True


def _start(ev: Evaluation) -> Outcome:
    outcome = Outcome(True)
    for p in ev.problems:
        outcome.fail(p)
    return outcome


def matches_reference(ev: Evaluation) -> Outcome:
    outcome = _start(ev)
    if not ev.outputs:
        _nothing(ev, outcome, "output")
    for c in ev.outputs:
        outcome.absorb(c.label, _compare(c))
    return outcome


def finite_where_reference_finite(ev: Evaluation) -> Outcome:
    outcome = _start(ev)
    if not ev.outputs:
        _nothing(ev, outcome, "output")
    for c in ev.outputs:
        e = np.asarray(c.engine, dtype=np.float64).reshape(-1)
        r = np.broadcast_to(np.asarray(c.reference, dtype=np.float64).reshape(-1), e.shape)
        bad = representable(r, c.dtype) & ~np.isfinite(e)
        if c.only_where is not None:
            bad &= np.asarray(c.only_where, bool).reshape(-1)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            outcome.fail(f"{c.label}: engine {float(e[i])!r} where the reference is finite ({float(r[i])!r}) "
                         f"at flat index {i}")
    return outcome


def non_destructive(ev: Evaluation) -> Outcome:
    outcome = _start(ev)
    for m in ev.mutations:
        outcome.fail(m)
    return outcome


def _invariance(ev: Evaluation, what: str) -> Outcome:
    """Each alternative's outputs against the base outputs, within the sum of both tolerance bounds."""
    outcome = _start(ev)
    if not ev.alternatives:
        _nothing(ev, outcome, f"alternative run ({what})")
    base_list = ev.outputs
    for alt_label, outputs in ev.alternatives:
        if len(outputs) != len(base_list):
            outcome.fail(f"{alt_label}: {len(outputs)} outputs vs {len(base_list)} with {ev.base_label}")
            continue
        for b, a in zip(base_list, outputs):
            x = np.asarray(a.engine, dtype=np.float64).reshape(-1)
            y = np.asarray(b.engine, dtype=np.float64).reshape(-1)
            if x.shape != y.shape:
                outcome.fail(f"{a.label}: shape {x.shape} vs {y.shape} with {ev.base_label}")
                continue
            sel = np.ones(x.shape, bool)
            if b.only_where is not None:
                sel = np.broadcast_to(np.asarray(b.only_where, bool).reshape(-1), x.shape)
            r = np.broadcast_to(np.asarray(b.reference, dtype=np.float64).reshape(-1), x.shape)
            sel = sel & ~np.isnan(r)
            allowed = bound(r, b.faithful, dtype=b.dtype, kind=b.kind) + bound(r, a.faithful, dtype=a.dtype,
                                                                               kind=a.kind)
            with np.errstate(invalid="ignore"):
                diff = np.where(np.isfinite(x) & np.isfinite(y), np.abs(x - y),
                                np.where((x == y) | (np.isnan(x) & np.isnan(y)), 0.0, np.inf))
            diff = np.where(sel, diff, 0.0)
            with np.errstate(divide="ignore", invalid="ignore"):
                ratio = np.where(sel, diff / allowed, 0.0)
            if ratio.size and ratio.max() > 1.0:
                i = int(np.argmax(ratio))
                outcome.fail(f"{a.label} = {float(x[i])!r} vs {b.label} = {float(y[i])!r} at flat index {i} "
                             f"(reference {float(r[i])!r}, allowed difference {float(allowed[i]):.3g})")
                d = float(diff[i])
                outcome.max_abs_err = max(outcome.max_abs_err, d if math.isfinite(d) else math.inf)
            elif ratio.size:
                i = int(np.argmax(ratio))
                if ratio[i] >= outcome.ratio:
                    outcome.ratio, outcome.tolerance = float(ratio[i]), float(allowed[i])
                outcome.max_abs_err = max(outcome.max_abs_err, float(diff[i]))
    return outcome


def partition_invariant(ev: Evaluation) -> Outcome:
    return _invariance(ev, "another partition")


def mask_invariant(ev: Evaluation) -> Outcome:
    return _invariance(ev, "garbage at masked positions")


def _is_number(x: Any) -> bool:
    """A Python or NumPy real scalar (loggers accept both); not a tensor, not a bool, not an array."""
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, (bool, np.bool_))


def metric_integrity(ev: Evaluation) -> Outcome:
    outcome = _start(ev)
    flow = ev.metrics
    if flow is None or not flow.emitted:
        outcome.fail("nothing to compare: the pipeline emitted no metric key")
        return outcome
    for key in sorted(flow.emitted):
        target = flow.emitted_to_final.get(key, key)
        if target not in flow.final:
            outcome.fail(f"emitted key {key!r} never reached the final dict as {target!r} "
                         f"(final keys: {sorted(flow.final)})")
        elif not _is_number(flow.final[target]):
            value = flow.final[target]
            outcome.fail(f"final {target!r} is a {type(value).__module__}.{type(value).__name__}, "
                         f"not a number: {value!r}")
    return outcome


#: property name -> judgment
JUDGES = {
    MATCHES_REFERENCE: matches_reference,
    PARTITION_INVARIANT: partition_invariant,
    NON_DESTRUCTIVE: non_destructive,
    FINITE: finite_where_reference_finite,
    METRIC_INTEGRITY: metric_integrity,
    MASK_INVARIANT: mask_invariant,
}
