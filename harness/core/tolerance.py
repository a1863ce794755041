"""Error measures and the tolerance policy.

Every engine result is compared with the float64 reference evaluated on the *same* rounded input (the
input converted exactly to float64), so input rounding is never counted as error. An element is a
discrepancy when

    |engine − ref|  >  C · |faithful − ref|  +  ULP_FLOOR[dtype] · ulp_dtype(|ref|)  +  ATOL[kind][dtype]

where ``faithful`` is a dtype-faithful stable computation of the same op (input upcast to fp32 — or
kept fp64 —, computed with the stable formula, output rounded to the engine's output dtype). The
first term scales with the difficulty of the input (cancellation, huge offsets); the floors absorb
the few ulps by which two correct roundings can differ.

Tolerance table (one place; the reason for each entry is given):

==========  ===  =========  ============================================================================
dtype       C    ULP floor  reason
==========  ===  =========  ============================================================================
float64     8    64         fp64 engines sum in other orders (pairwise vs sequential): tens of ulps
float32     8    8          fp32 accumulators over V up to 152k differ by a few ulps from the faithful
bfloat16    2    2          output rounding dominates (8 mantissa bits); two correct roundings ≤ 1 ulp
float16     2    2          as bfloat16 (11 mantissa bits)
==========  ===  =========  ============================================================================

ATOL (absolute floor, for results that are exactly 0 in the reference, e.g. the entropy of a one-hot
row, where a correct fp32 engine leaves rounding residue of the log-terms):

==============  =======  =======  ======  ======  ===============================================
kind            fp64     fp32     bf16    fp16    reason
==============  =======  =======  ======  ======  ===============================================
token_stat      1e-12    2e-6     2e-2    2e-3    entropy/logprob residue of exp/log at scale O(1)
reduction       1e-12    1e-6     1e-2    1e-3    sums of values O(1..100) cancelling to ~0
pipeline        1e-9     1e-5     1e-2    1e-3    metrics/losses formed from fp32 partial sums
advantage       1e-9     1e-4     1e-2    1e-2    cumulative sums over T then ratios (verl: +1e-8)
==============  =======  =======  ======  ======  ===============================================

Resolution floor: a bound is never finer than half an ulp, at |ref|, of the dtype the value
is resolved in: the output dtype, or the coarser ``resolution`` dtype a family names for a value the engine
computes in a narrower dtype than it returns (verl's ``masked_var`` of fp16 values sums them in fp16 and
returns float32: at 16 625 half an fp16 ulp is 8, and a bound of 7.05 would fail a correctly rounded
fp16 computation; a logged metric computed in float32 and handed over as a Python float is resolved in
float32, not float64). With the ULP floors above this only acts through ``resolution``.

Bit-exactness (``non_destructive``) never uses a tolerance.

The margin band: the verdict of an example is drawn from its worst ratio r = error / bound,

===========  ==========================  ================================================================
verdict      when                        reason
===========  ==========================  ================================================================
pass         r ≤ ``PASS_BELOW`` = 1/2    well inside the tolerance: an engine as exact as the dtype-faithful
                                         path scores below 1/C ≤ 1/2, so it always passes
marginal     1/2 < r ≤ 4                 too close to call: an engine's last bits move r by up to 1.6×
                                         between CPUs' vector widths (ATEN_CPU_CAPABILITY default / avx2 /
                                         avx512), thread counts and reduction orders (verl's fp32 entropy:
                                         0.98× with avx2, 1.57× with avx512 on the same example)
discrepancy  r > ``FAIL_ABOVE`` = 4, or  beyond any rounding difference between correct implementations
             a failure with no ratio     (4 is also ``NEAR`` below: the factor within which a failure
             (NaN, crash, mutation)      was already graded rounding-level, never worse)
===========  ==========================  ================================================================

A finding's status follows its worst example: ``discrepancy`` as soon as one example is one (it is then
shrunk), else ``marginal`` when one example is marginal, else ``pass``. ``marginal`` never changes the exit
code, and a ledger line matches a finding that is ``marginal`` or ``discrepancy`` alike (both are ``xfail``,
so a listed finding has one status on every machine). ``rlconform ledger``
also lists a marginal finding above ``LEDGER_ABOVE`` = √(1/2 · 4) ≈ 1.41, the band's geometric centre, so
that a CPU that takes it past 4 keeps the run green. On the machine that wrote the ledger every listed
finding is above 1.41 and every unlisted one below it; so a run's verdict (its exit code) changes on another
machine only when an engine's error moves by more than 2.8× between the two (1.41 → 4, or 1.41 → 1/2).

Thresholds of a *wrong value* (applied by :mod:`rlconform.harness.report.severity` to the numbers a
finding carries: the ``engine E vs reference R … tolerance T`` clauses of its message, ``max_ratio``,
``max_rel_err``). A wrong value is graded by its impact: ``training`` (a loss, gradient,
advantage, log-prob, importance weight), ``logging`` (a metric); a crash or a NaN/±inf is ``robustness``,
a changed input ``destructive``, everything else ``precision`` (severity's module table):

==================  ========================================================  ================================
a wrong value when                                                            reason
==================  ========================================================  ================================
relative error      |E − R| / |R| ≥ ``WRONG_REL`` = 1e-2 in a failing clause   off by more than a percent:
                    at a representable reference (|R| > T: above the          not rounding (bf16 has 2^-8 ≈
                    absolute floor of its own tolerance), and ``max_ratio``   4e-3), a logic error
                    ≥ ``NEAR``
partition           |X − Y| / |R| > ``WRONG_PARTITION`` = 1 % (partition_       results depend on the DP/TP
dependence          invariant, mask_invariant), |R| > D, |X − Y| > D (D: the  layout or on masked garbage
                    allowed difference), and ``max_ratio`` ≥ ``NEAR``          beyond rounding
implementations     two implementations of a variant differ by > 1 % of        a trainer's results depend on
disagree            max(|X|, |Y|, |R|) (implementations_agree), that scale >  which implementation its
                    D, |X − Y| > D, and ``max_ratio`` ≥ ``NEAR``               config names
otherwise           ``precision``                                             beyond the tolerance, but by
                                                                              rounding-sized amounts
==================  ========================================================  ================================

``NEAR`` = 4: a finding whose worst example is within 4× of its tolerance is never a wrong value (since the
margin band, such a finding is ``marginal`` and never fails; ``NEAR`` still grades reports written before it). Relative errors at a reference below its tolerance (an
exact 0, the entropy of a one-hot row) are not used: they measure the floor, not the engine.
"""

from __future__ import annotations

import dataclasses

import numpy as np

C = {"float64": 8.0, "float32": 8.0, "bfloat16": 2.0, "float16": 2.0}
ULP_FLOOR = {"float64": 64.0, "float32": 8.0, "bfloat16": 2.0, "float16": 2.0}
ATOL = {
    "token_stat": {"float64": 1e-12, "float32": 2e-6, "bfloat16": 2e-2, "float16": 2e-3},
    "reduction": {"float64": 1e-12, "float32": 1e-6, "bfloat16": 1e-2, "float16": 1e-3},
    "pipeline": {"float64": 1e-9, "float32": 1e-5, "bfloat16": 1e-2, "float16": 1e-3},
    "advantage": {"float64": 1e-9, "float32": 1e-4, "bfloat16": 1e-2, "float16": 1e-2},
}
#: the margin band around the boundary r = 1 (see the verdict table above)
PASS_BELOW = 0.5
FAIL_ABOVE = 4.0
LEDGER_ABOVE = (PASS_BELOW * FAIL_ABOVE) ** 0.5
#: severity thresholds (see the severity table above)
WRONG_REL = 1e-2
WRONG_PARTITION = 1e-2
NEAR = 4.0
#: machine epsilon (spacing at 1.0) per dtype name
EPS = {"float64": 2.0**-52, "float32": 2.0**-23, "bfloat16": 2.0**-7, "float16": 2.0**-10}
#: largest finite value per dtype name
MAX = {"float64": 1.7976931348623157e308, "float32": 3.4028234663852886e38, "bfloat16": 3.3895313892515355e38,
       "float16": 65504.0}
#: smallest positive normal per dtype name (below it ulp is constant)
TINY = {"float64": 2.0**-1022, "float32": 2.0**-126, "bfloat16": 2.0**-126, "float16": 2.0**-14}


def verdict(ratio: float, ok: bool = True) -> str:
    """``"pass"``, ``"marginal"`` or ``"discrepancy"`` for an example whose worst error / bound is ``ratio``
    (``ok``: every element within its bound; a failure without a ratio has ``ratio`` = inf)."""
    if not ratio <= FAIL_ABOVE:  # NaN counts as beyond the band
        return "discrepancy"
    if ratio > PASS_BELOW or not ok:
        return "marginal"
    return "pass"


def ulp(x: np.ndarray, dtype: str) -> np.ndarray:
    """Spacing of ``dtype`` floats at |x| (float64 array), for dtype names of :data:`EPS`."""
    a = np.abs(np.asarray(x, dtype=np.float64))
    a = np.where(np.isfinite(a), a, 0.0)
    exponent = np.floor(np.log2(np.maximum(a, TINY[dtype])))
    with np.errstate(over="ignore"):  # |x| beyond the dtype's range: an infinite spacing
        return np.exp2(exponent) * EPS[dtype]


def coarser(dtype: str, resolution: str | None) -> str:
    """The coarser (larger machine epsilon) of ``dtype`` and ``resolution`` (``None``: ``dtype``)."""
    if resolution is None or EPS[resolution] <= EPS[dtype]:
        return dtype
    return resolution


def resolution_floor(reference, dtype: str, resolution: str | None = None) -> np.ndarray:
    """Half an ulp at |ref| of the dtype the value is resolved in (:func:`coarser` of ``dtype`` and
    ``resolution``): the least error a correct rounding may have, under which no bound goes (flat float64;
    0 at a non-finite reference)."""
    r = np.asarray(reference, dtype=np.float64).reshape(-1)
    return np.where(np.isfinite(r), 0.5 * ulp(r, coarser(dtype, resolution)), 0.0)


def bound(reference, faithful, *, dtype: str, kind: str, resolution: str | None = None) -> np.ndarray:
    """The allowed error at each element: ``C·|faithful − ref| + ULP_FLOOR·ulp(ref) + ATOL``, never below
    :func:`resolution_floor` (flat float64). ``resolution``: a dtype coarser than ``dtype`` that the value is
    computed in (module doc), or None."""
    r = np.asarray(reference, dtype=np.float64).reshape(-1)
    f = r if faithful is None else np.asarray(faithful, dtype=np.float64).reshape(-1)
    r, f = np.broadcast_arrays(r, f)
    with np.errstate(invalid="ignore"):
        ferr = np.where(np.isfinite(r) & np.isfinite(f), np.abs(f - r), 0.0)
    policy = C[dtype] * ferr + ULP_FLOOR[dtype] * ulp(r, dtype) + ATOL[kind][dtype]
    return np.maximum(policy, resolution_floor(r, dtype, resolution))


@dataclasses.dataclass
class Comparison:
    """Result of comparing an engine array with the reference.

    ``ok``: every element within its bound; ``max_abs_err``; ``max_rel_err`` (|err|/|ref|, over
    elements with ref ≠ 0); ``max_ulp_err`` (err in ulps of ``dtype`` at |ref|); ``worst_index``
    (flat index of the element with the largest err/bound ratio); ``worst_ratio`` (err/bound there,
    > 1 means discrepancy); ``tolerance`` (bound at the worst element).
    """

    ok: bool
    max_abs_err: float
    max_rel_err: float
    max_ulp_err: float
    worst_index: int
    worst_ratio: float
    tolerance: float
    engine_value: float
    reference_value: float
    #: the error measures of the worst element itself (``max_*`` are over every compared element)
    worst_abs_err: float = float("nan")
    worst_rel_err: float = float("nan")
    worst_ulp_err: float = float("nan")

    def clause(self, label: str = "", quantity: str = "", dtype: str | None = None, layout: dict | None = None):
        """This comparison's worst element as a ``value`` :class:`~rlconform.harness.core.failure.Clause`: the
        element's own error measures (the largest errors of other elements are the finding's ``max_abs_err``
        / ``max_rel_err`` fields, never quoted next to this element's index)."""
        from rlconform.harness.core import failure

        own = lambda mine, largest: largest if np.isnan(mine) else mine  # noqa: E731 - a Comparison built by hand
        return failure.value(label, quantity, engine=self.engine_value, exact=self.reference_value,
                             index=self.worst_index, abs_err=own(self.worst_abs_err, self.max_abs_err),
                             rel_err=own(self.worst_rel_err, self.max_rel_err),
                             ulp_err=own(self.worst_ulp_err, self.max_ulp_err), tolerance=self.tolerance,
                             ratio=self.worst_ratio, dtype=dtype, layout=layout)

    def describe(self) -> str:
        """One line: the worst element and its own error measures, only those that mean something there (no
        relative error or ulp count at a zero reference; none at all for a NaN/inf engine value)
        (:func:`rlconform.harness.core.failure.render_clause` of :meth:`clause`)."""
        from rlconform.harness.core import failure

        return failure.render_clause(self.clause())


def compare(engine, reference, faithful, *, dtype: str, kind: str, only_where=None,
            resolution: str | None = None) -> Comparison:
    """Compare ``engine`` with ``reference`` (float64) under the tolerance policy.

    ``engine``/``faithful``: arrays (any float dtype) broadcastable to ``reference``; ``dtype``: the
    engine's output dtype name; ``kind``: a key of :data:`ATOL`; ``only_where``: optional boolean
    mask of the elements to compare (others ignored); ``resolution``: as for :func:`bound`. Non-finite reference elements must be matched
    exactly (same inf sign), NaN reference elements (undefined, e.g. a mean over no tokens) are
    skipped; an engine NaN/inf where the reference is finite is a discrepancy (ratio = inf), unless the
    reference lies beyond the output dtype's range and the engine returns the inf it rounds to.
    """
    e = np.asarray(engine, dtype=np.float64).reshape(-1)
    r = np.asarray(reference, dtype=np.float64).reshape(-1)
    f = np.asarray(faithful, dtype=np.float64).reshape(-1) if faithful is not None else r
    e, r, f = np.broadcast_arrays(e, r, f)
    sel = np.ones(r.shape, bool) if only_where is None else np.asarray(only_where, bool).reshape(-1)
    if r.size == 0 or not sel.any():
        return Comparison(True, 0.0, 0.0, 0.0, -1, 0.0, 0.0, float("nan"), float("nan"))
    sel = sel & ~np.isnan(r)  # the reference is undefined there (e.g. the mean of nothing)
    rfin = np.isfinite(r)
    # a finite reference beyond the output dtype's range rounds to ±inf: an engine ±inf of that sign is exact
    overflow = rfin & (np.abs(r) > MAX[dtype]) & np.isinf(e) & (np.sign(e) == np.sign(r))
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.where(rfin, np.abs(e - r), np.where(e == r, 0.0, np.inf))
        err = np.where(overflow, 0.0, err)
        ferr = np.where(rfin & np.isfinite(f), np.abs(f - r), 0.0)
        bound = np.maximum(C[dtype] * ferr + ULP_FLOOR[dtype] * ulp(r, dtype) + ATOL[kind][dtype],
                           resolution_floor(r, dtype, resolution))
        err = np.where(np.isnan(err), np.inf, err)
        ratio = np.where(sel, err / bound, 0.0)
        rel = np.where(sel & rfin & (r != 0), err / np.abs(np.where(r == 0, 1.0, r)), 0.0)
        ulps = np.where(sel & rfin, err / ulp(r, dtype), 0.0)
    worst = int(np.argmax(ratio))
    abs_sel = np.where(sel, err, 0.0)
    return Comparison(
        ok=bool(ratio.max() <= 1.0),
        max_abs_err=float(abs_sel.max()),
        max_rel_err=float(rel.max()),
        max_ulp_err=float(ulps.max()),
        worst_index=worst,
        worst_ratio=float(ratio[worst]),
        tolerance=float(bound[worst]),
        engine_value=float(e[worst]),
        reference_value=float(r[worst]),
        worst_abs_err=float(err[worst]),
        worst_rel_err=float(rel[worst]),
        worst_ulp_err=float(ulps[worst]),
    )
