"""The generic properties: each judges an :class:`~rlconform.harness.core.evaluation.Evaluation` of one case,
whatever op family produced it.

=============================  ============================================================================
property                       holds when
=============================  ============================================================================
matches_reference              every compared value and gradient is within the tolerance policy
                               (:mod:`rlconform.harness.core.tolerance`) of the float64 reference
partition_invariant            each alternative partition's results differ from the base partition's by at
                               most the sum of the two tolerance bounds, element by element
non_destructive                no input changed (bitwise, version counters), after forward and backward
finite_where_reference_finite  no NaN/inf (values or gradients) where the reference is finite and
                               representable in the output dtype
metric_integrity               every emitted metric key reaches the final dict (not dropped, not printed
                               instead) as a number of a type that keeps what was emitted
mask_invariant                 garbage (NaN, ±inf, 1e30) at masked positions changes neither the values nor
                               the gradients of the unmasked result (judged like partition_invariant)
implementations_agree          a second implementation of a variant (``grpo+vectorized``) gives what the
                               default one gives on the same input, element by element, also where the
                               reference is undefined (NaN) or differs from both by a declared convention:
                               within twice the tolerance bound at the larger of the two values (the same
                               NaN / inf on both sides agrees)
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

from rlconform.harness.core import failure
from rlconform.harness.core.evaluation import Compared, Evaluation
from rlconform.harness.core.opinfo import (
    FINITE,
    IMPLEMENTATIONS_AGREE,
    MASK_INVARIANT,
    MATCHES_REFERENCE,
    METRIC_INTEGRITY,
    NON_DESTRUCTIVE,
    PARTITION_INVARIANT,
)
from rlconform.harness.core.tensors import representable
from rlconform.harness.core.tolerance import ATOL, ULP_FLOOR, C, Comparison, bound, compare, ulp, verdict


@dataclasses.dataclass
class Outcome:
    """Result of one check: ``ok``; ``message`` (what failed, uniform wording); error measures of the
    worst compared element (``max_abs_err``, ``max_rel_err``, ``tolerance``) and ``ratio`` (error over
    tolerance; its margin band gives the :attr:`verdict`; the quantity ``rlconform fuzz``'s ``target()`` climbs);
    ``declared``: the name of the binding's declared guard or precondition this example fell under, or None; ``clauses``: what failed, as data (:class:`rlconform.harness.core.failure.Clause`), of which
    a failing outcome's ``message`` is the rendering."""

    ok: bool
    message: str = ""
    max_abs_err: float = 0.0
    max_rel_err: float = 0.0
    tolerance: float = 0.0
    ratio: float = 0.0
    declared: str | None = None
    clauses: list = dataclasses.field(default_factory=list)

    def add(self, clause: failure.Clause) -> None:
        """Record a failing clause; the message gains its line."""
        self.ok = False
        self.clauses.append(clause)
        self.message += ("\n" if self.message else "") + failure.render_clause(clause)

    def absorb(self, c: Compared, cmp: Comparison) -> None:
        if cmp.max_abs_err >= self.max_abs_err or not cmp.ok:
            self.max_abs_err = max(self.max_abs_err, cmp.max_abs_err)
            self.max_rel_err = max(self.max_rel_err, cmp.max_rel_err)
        if cmp.worst_ratio >= self.ratio:
            self.ratio, self.tolerance = cmp.worst_ratio, cmp.tolerance
        if not cmp.ok:
            self.add(cmp.clause(c.label, c.quantity, c.dtype, c.layout))

    @property
    def verdict(self) -> str:
        """``pass``, ``marginal`` or ``discrepancy``: the margin band of
        :func:`rlconform.harness.core.tolerance.verdict` applied to ``ratio``."""
        return verdict(self.ratio, self.ok)

    def fail(self, what) -> None:
        """Record a failure without a ratio (a problem, a mutation, a lost metric): ``what`` is a
        :class:`~rlconform.harness.core.failure.Clause` or the sentence of a ``problem`` clause."""
        self.ratio = max(self.ratio, math.inf)
        self.add(failure.as_clause(what))


def _compare(c: Compared) -> Comparison:
    return compare(c.engine, c.reference, c.faithful, dtype=c.dtype, kind=c.kind, only_where=c.only_where,
                   resolution=c.resolution)


def _nothing(ev: Evaluation, outcome: Outcome, what: str) -> bool:
    """Fail ``outcome`` when ``ev`` has nothing to judge for ``what`` and does not say why."""
    if ev.undefined is not None or ev.problems:
        return False
    outcome.fail(failure.problem("missing output", f"nothing to compare: the engine produced no {what} for this case"))
    return True


def _start(ev: Evaluation) -> Outcome:
    outcome = Outcome(True)
    for p in ev.problems:
        outcome.fail(p)
    return outcome


def _quantities(ev: Evaluation):
    """Each output of ``ev`` with what it is: its own ``quantity``, else ``value`` or ``gradient`` by the list
    that holds it."""
    for c in ev.values:
        yield c, c.quantity or "value"
    for c in ev.gradients:
        yield c, c.quantity or "gradient"


def matches_reference(ev: Evaluation) -> Outcome:
    outcome = _start(ev)
    if not ev.outputs:
        _nothing(ev, outcome, "output")
    for c, quantity in _quantities(ev):
        outcome.absorb(dataclasses.replace(c, quantity=quantity), _compare(c))
    return outcome


def finite_where_reference_finite(ev: Evaluation) -> Outcome:
    outcome = _start(ev)
    if not ev.outputs:
        _nothing(ev, outcome, "output")
    for c, quantity in _quantities(ev):
        e = np.asarray(c.engine, dtype=np.float64).reshape(-1)
        r = np.broadcast_to(np.asarray(c.reference, dtype=np.float64).reshape(-1), e.shape)
        bad = representable(r, c.dtype) & ~np.isfinite(e)
        if c.only_where is not None:
            bad &= np.asarray(c.only_where, bool).reshape(-1)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            outcome.fail(failure.Clause("nonfinite", c.label, quantity, engine=float(e[i]), exact=float(r[i]),
                                        index=i, dtype=c.dtype, layout=c.layout))
    return outcome


def non_destructive(ev: Evaluation) -> Outcome:
    outcome = _start(ev)
    for m in ev.mutations:
        outcome.fail(failure.as_clause(m, "mutation"))
    return outcome


def _aligned_outputs(ev: Evaluation, outcome: Outcome):
    """Each alternative run's outputs next to the base run's, flattened to float64: yields ``(a, b, x, y, sel,
    r)`` — the alternative's and the base's :class:`Compared`, their engine values ``x`` and ``y``, the compared
    positions ``sel`` (the base's ``only_where``) and the base's reference ``r``. A count or shape mismatch is
    recorded as a failure of ``outcome`` and skipped."""
    for alt_label, outputs in ev.alternatives:
        if len(outputs) != len(ev.outputs):
            outcome.fail(failure.problem("missing output", f"{alt_label}: {len(outputs)} outputs vs {len(ev.outputs)} "
                                                           f"with {ev.base_label}"))
            continue
        for k, (b, a) in enumerate(zip(ev.outputs, outputs)):
            if not a.quantity:
                a = dataclasses.replace(a, quantity=b.quantity or ("value" if k < len(ev.values) else "gradient"))
            x = np.asarray(a.engine, dtype=np.float64).reshape(-1)
            y = np.asarray(b.engine, dtype=np.float64).reshape(-1)
            if x.shape != y.shape:
                outcome.fail(failure.problem("missing output", f"{a.label}: shape {x.shape} vs {y.shape} with "
                                                               f"{ev.base_label}"))
                continue
            sel = np.ones(x.shape, bool)
            if b.only_where is not None:
                sel = np.broadcast_to(np.asarray(b.only_where, bool).reshape(-1), x.shape)
            r = np.broadcast_to(np.asarray(b.reference, dtype=np.float64).reshape(-1), x.shape)
            yield a, b, x, y, sel, r


def _judge_difference(outcome: Outcome, a, b, x, y, r, sel, allowed) -> None:
    """``|x − y|`` on ``sel`` against ``allowed`` (flat float64): the same NaN or the same inf on both sides is
    no difference; the worst position beyond 1× is a failure, otherwise the worst ratio is recorded."""
    with np.errstate(invalid="ignore", over="ignore"):  # two huge finite values may differ by more than MAX
        diff = np.where(np.isfinite(x) & np.isfinite(y), np.abs(x - y),
                        np.where((x == y) | (np.isnan(x) & np.isnan(y)), 0.0, np.inf))
    diff = np.where(sel, diff, 0.0)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        ratio = np.where(sel, diff / allowed, 0.0)
    if not ratio.size:
        return
    i = int(np.argmax(ratio))
    if ratio[i] > 1.0:  # beyond 1×: not ok; the margin band of tolerance.verdict grades it, as for the reference
        outcome.add(failure.Clause("difference", a.label, a.quantity or "", engine=float(x[i]), exact=float(r[i]),
                                   index=i, tolerance=float(allowed[i]), ratio=float(ratio[i]), dtype=a.dtype,
                                   other=float(y[i]), other_label=b.label, layout=a.layout))
        d = float(diff[i])
        outcome.max_abs_err = max(outcome.max_abs_err, d if math.isfinite(d) else math.inf)
        if float(ratio[i]) >= outcome.ratio:
            outcome.ratio, outcome.tolerance = float(ratio[i]), float(allowed[i])
    else:
        if ratio[i] >= outcome.ratio:
            outcome.ratio, outcome.tolerance = float(ratio[i]), float(allowed[i])
        outcome.max_abs_err = max(outcome.max_abs_err, float(diff[i]))


def _invariance(ev: Evaluation, what: str) -> Outcome:
    """Each alternative's outputs against the base outputs, within the sum of both tolerance bounds (positions
    where the reference is NaN are not compared)."""
    outcome = _start(ev)
    if not ev.alternatives:
        _nothing(ev, outcome, f"alternative run ({what})")
    for a, b, x, y, sel, r in _aligned_outputs(ev, outcome):
        sel = sel & ~np.isnan(r)
        allowed = (bound(r, b.faithful, dtype=b.dtype, kind=b.kind, resolution=b.resolution)
                   + bound(r, a.faithful, dtype=a.dtype, kind=a.kind, resolution=a.resolution))
        _judge_difference(outcome, a, b, x, y, r, sel, allowed)
    return outcome


def partition_invariant(ev: Evaluation) -> Outcome:
    return _invariance(ev, "another partition")


def mask_invariant(ev: Evaluation) -> Outcome:
    return _invariance(ev, "garbage at masked positions")


def agreement_bound(x, y, reference, faithful, *, dtype: str, kind: str) -> np.ndarray:
    """The allowed difference between two implementations' values ``x`` and ``y`` (flat float64):
    ``2 · (C·|faithful − ref| + ULP_FLOOR·ulp(max(|x|, |y|, |ref|)) + ATOL)`` — the sum of the two tolerance
    bounds, with the ulp taken at the values themselves, so a value the reference does not define (NaN) or
    that both give by a convention the reference does not follow (a singleton group's raw score for a
    reference 0) is judged at its own scale."""
    x = np.asarray(x, np.float64).reshape(-1)
    y = np.asarray(y, np.float64).reshape(-1)
    r = np.broadcast_to(np.asarray(reference, np.float64).reshape(-1), x.shape)
    f = r if faithful is None else np.broadcast_to(np.asarray(faithful, np.float64).reshape(-1), x.shape)
    with np.errstate(invalid="ignore"):
        ferr = np.where(np.isfinite(r) & np.isfinite(f), np.abs(f - r), 0.0)
    finite_abs = [np.where(np.isfinite(v), np.abs(v), 0.0) for v in (x, y, r)]
    scale = np.maximum(np.maximum(finite_abs[0], finite_abs[1]), finite_abs[2])
    return 2.0 * (C[dtype] * ferr + ULP_FLOOR[dtype] * ulp(scale, dtype) + ATOL[kind][dtype])


def implementations_agree(ev: Evaluation) -> Outcome:
    """Each alternative (a second implementation's outputs) against the base outputs (the default
    implementation's) on the compared positions (``only_where``), the reference's NaN positions included:
    within :func:`agreement_bound`; the same NaN or the same inf on both sides agrees."""
    outcome = _start(ev)
    if not ev.alternatives:
        _nothing(ev, outcome, "second implementation to compare with")
    for a, b, x, y, sel, r in _aligned_outputs(ev, outcome):
        if sel.any():
            _judge_difference(outcome, a, b, x, y, r, sel,
                              agreement_bound(x, y, r, b.faithful, dtype=b.dtype, kind=b.kind))
    return outcome


def _is_number(x: Any) -> bool:
    """A Python or NumPy real scalar (loggers accept both); not a tensor, not a bool, not an array."""
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, (bool, np.bool_))


#: NumPy scalar types narrower than float64: a value logged as one of them lost precision on the way
_NARROW_FLOATS = (np.float32, np.float16)


def _type_name(x: Any) -> str:
    return f"{type(x).__module__}.{type(x).__name__}"


def _is_integer_typed(x: Any) -> bool:
    """An integer as a trainer logs it: Python int, NumPy integer, integer 0-d tensor (by duck typing)."""
    if isinstance(x, (bool, np.bool_)):
        return False
    if isinstance(x, (int, np.integer)):
        return True
    dtype = getattr(x, "dtype", None)
    return dtype is not None and getattr(dtype, "is_floating_point", True) is False and "int" in str(dtype)


def _is_wide_float_typed(x: Any) -> bool:
    """A float64-precision value: Python float, NumPy float64, float64 0-d tensor."""
    if isinstance(x, (float, np.float64)):
        return True
    return str(getattr(x, "dtype", "")) == "torch.float64"


def _printed_line(printed: str, key: str) -> str | None:
    for line in printed.splitlines():
        if key in line:
            return line.strip()[:200]
    return None


def metric_integrity(ev: Evaluation) -> Outcome:
    """Every emitted key reaches the final dict (not dropped, not printed instead of logged) as a real
    number whose type keeps what was emitted: an integer statistic stays an integer (int, NumPy integer,
    or an integral float64), a float64 value is not narrowed to float32 / float16."""
    outcome = _start(ev)
    flow = ev.metrics
    def lost(text: str, key: str = "", printed: str = "") -> None:
        outcome.fail(failure.Clause("metric", text=text, what="lost metric", key=key, printed=printed))

    if flow is None or not flow.emitted:
        outcome.fail(failure.problem("missing output", "nothing to compare: the pipeline emitted no metric key"))
        return outcome
    for key in sorted(flow.emitted):
        target = flow.emitted_to_final.get(key, key)
        emitted = flow.emitted_values.get(key)
        if target not in flow.final:
            line = _printed_line(flow.printed, key) if flow.printed else None
            how = f"was printed instead of logged ({line!r})" if line else "never reached the final dict"
            lost(f"emitted key {key!r} {how} as {target!r} (final keys: {sorted(flow.final)})", key, line or "")
            continue
        value = flow.final[target]
        if not _is_number(value):
            lost(f"final {target!r} is a {_type_name(value)}, not a number: {value!r}")
        elif target in flow.integral and not (isinstance(value, (int, np.integer)) or (
                _is_wide_float_typed(value) and math.isfinite(value) and float(value).is_integer())):
            lost(f"final {target!r} changed in type: an integer statistic logged as {_type_name(value)} "
                 f"{value!r} (emitted as {_type_name(emitted)})")
        elif isinstance(value, _NARROW_FLOATS) and emitted is not None and (
                _is_wide_float_typed(emitted) or _is_integer_typed(emitted)):
            lost(f"final {target!r} changed in type: {_type_name(value)} {value!r} from a value emitted as "
                 f"{_type_name(emitted)} (narrowed below float64)")
    return outcome


#: property name -> judgment
JUDGES = {
    MATCHES_REFERENCE: matches_reference,
    PARTITION_INVARIANT: partition_invariant,
    NON_DESTRUCTIVE: non_destructive,
    FINITE: finite_where_reference_finite,
    METRIC_INTEGRITY: metric_integrity,
    MASK_INVARIANT: mask_invariant,
    IMPLEMENTATIONS_AGREE: implementations_agree,
}
