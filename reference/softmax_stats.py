"""Exact float64 softmax statistics over the last dim of logits ``[..., V]`` and their closed-form gradients.

Every function takes logits as a NumPy array (any real dtype: float16/32/64, ml_dtypes bfloat16,
integers) or anything ``np.asarray`` takes, including CPU/GPU torch tensors (bf16 included). Values
are widened *exactly* to float64 before any arithmetic; results are NumPy float64 (``[...]`` for the
statistics, ``[..., V]`` for the gradients; a 1-D input ``[V]`` gives 0-d arrays). Units: nats.

Masked vocab and errors
    ``-inf`` is a legal logit (a masked / padded vocab entry, e.g. Megatron's padding of V to a multiple
    of TP): it has p = 0, contributes 0·log 0 = 0 and gets gradient 0 (except ``token_logprobs_grad``
    at the label itself, see there). A row whose logits are all ``-inf`` raises ``ValueError`` naming
    the row; NaN or ``+inf`` anywhere raises ``ValueError``; so does an empty vocab (V = 0) or a 0-d
    input. Non-real dtypes (and floats wider than 64 bits) raise ``TypeError``.

Algorithm (one pass per chunk of rows, all in float64)
    m = max_v x_v (one argmax j*), d_v = x_v - m kept as a double-double (d, δ) by TwoSum, so that
    e_v = exp(d_v)·(1 + δ_v) is exp of the *exact* difference to within exp's own rounding (< 1 ulp).
    e_{j*} = 1 exactly, and t = Σ_{v≠j*} e_v is a compensated sum (``_compensated.sum_lastdim``), so
    s = Σ_v e_v = 1 + t and log s = log1p(t) keep full relative accuracy even when t ≪ 1 (peaked rows).
    Then
        logsumexp   = m + log1p(t)
        log p_y     = (x_y − m) − log1p(t)                   (two non-positive terms: no cancellation)
        entropy     = log1p(t) + Σ_v e_v·(m − x_v) / s       (two non-negative terms: no cancellation)
        Σπ²         = Σ_v e_v² / s²
    and the gradients use p = e / s (see each function).

Accuracy (eps = 2**-53; checked against mpmath at 50 digits in tests/test_reference_mpmath.py)
    token_logprobs, entropy, sum_pi_squared: a few ulps *relative* in every regime (offsets ±1e4,
    spreads of 1e3, -inf entries, fp16 extremes). logsumexp: a few ulps relative to |m| + log s, i.e.
    relative unless m < 0 and log s ≈ −m cancel (lse ≈ 0). Gradients: logsumexp_grad and
    token_logprobs_grad a few ulps relative per element; entropy_grad and sum_pi_squared_grad are
    differences that cross zero, so their error is a few ulps of the scale of their terms:
    |err_v| ≲ 8·eps·p_v·(|log p_v| + H) and ≲ 8·eps·2p_v·(p_v + Σπ²) (times |grad_output|).

Memory and time
    Rows of the flattened ``[N, V]`` are processed in chunks sized from V and the input's itemsize: the
    float64 working set of a chunk (about ``_WORK_ARRAYS`` arrays of ``rows × V``) is kept under both
    ``_MAX_CHUNK_BYTES`` and ``_INPUT_FRACTION`` of the input's own size, so a ``[4096, 151936]`` fp32
    input needs far less than 25 % of its size in extra memory (``benchmarks/bench_reference.py --mem-what
    separate``; benchmarks/results/reference.json). For all four statistics of the same logits at once,
    ``fused_stats.token_stats`` is one torch float64 pass, several times faster.
    The input is never modified and, if C-contiguous, never copied as a whole. Gradients allocate
    their float64 ``[..., V]`` output (2× the size of an fp32 input) and no other full-size array.

Sources: logsumexp / log-softmax as in torch; entropy as verl ``entropy_from_logits`` and Megatron
``vocab_parallel_entropy``; token log-probs as verl ``logprobs_from_logits`` / Megatron
``vocab_parallel_cross_entropy`` (= −log p_y); Σπ² as verl ``calculate_sum_pi_squared_from_logits`` and
``vocab_parallel_sum_pi_squared`` verl PR #6153. Gradients are the closed forms of the
rlconform design (d log p_y = e_y − p; dH = −p ⊙ (log p + H); dΣπ² = 2p ⊙ (p − Σπ²)).
"""

from __future__ import annotations

import numpy as np

from ._compensated import sum_lastdim
from ._convert import as_float64, as_real_array

__all__ = [
    "logsumexp",
    "token_logprobs",
    "entropy",
    "sum_pi_squared",
    "logsumexp_grad",
    "token_logprobs_grad",
    "entropy_grad",
    "sum_pi_squared_grad",
]

#: float64 arrays of ``rows × V`` alive at once inside one chunk (an upper estimate, used for sizing).
_WORK_ARRAYS = 6
#: Cap on the float64 working set of one chunk, in bytes.
_MAX_CHUNK_BYTES = 48 << 20
#: Cap on the working set of one chunk as a fraction of the input's own size (the target is ≤ 25 %).
_INPUT_FRACTION = 0.125


# --------------------------------------------------------------------------------------------------
# input handling


def _logits_2d(logits):
    """Return (x2 [N, V] real array view, leading shape, V) after validating dtype and shape."""
    a = as_real_array(logits, "logits")
    if a.dtype.kind == "f" and a.dtype.itemsize > 8:
        raise TypeError(f"logits: dtype {a.dtype} does not convert exactly to float64")
    if a.ndim == 0:
        raise ValueError("logits must have at least one dimension (the vocab, last)")
    vocab = a.shape[-1]
    if vocab == 0:
        raise ValueError(f"logits have an empty vocab dimension (shape {a.shape}); the softmax is undefined")
    lead = a.shape[:-1]
    return a.reshape(-1, vocab), lead, vocab


def _labels_1d(labels, lead, vocab):
    lab = as_real_array(labels, "labels")
    if lab.dtype.kind not in "iu":
        raise ValueError(f"labels must be an integer array, got dtype {lab.dtype}")
    if lab.shape != tuple(lead):
        raise ValueError(f"labels have shape {lab.shape}, expected the logits' leading shape {tuple(lead)}")
    bad = (lab < 0) | (lab >= vocab)
    if bad.any():
        pos = tuple(int(i) for i in np.argwhere(bad)[0]) if lab.ndim else ()
        raise ValueError(f"label {int(lab[pos])} at {pos} is out of range [0, {vocab})")
    return lab.reshape(-1).astype(np.intp)


def _grad_output_1d(grad_output, lead):
    if grad_output is None:
        return None
    g = as_float64(grad_output, "grad_output")
    try:
        g = np.broadcast_to(g, lead)
    except ValueError:
        raise ValueError(f"grad_output has shape {g.shape}, expected (broadcastable to) {tuple(lead)}") from None
    return np.ascontiguousarray(g).reshape(-1)


def _chunk_rows(n_rows: int, vocab: int, itemsize: int) -> int:
    """Rows per chunk: working set ≤ min(_MAX_CHUNK_BYTES, _INPUT_FRACTION × input bytes), ≥ 1 row."""
    per_row = vocab * 8 * _WORK_ARRAYS
    budget = min(_MAX_CHUNK_BYTES, int(_INPUT_FRACTION * n_rows * vocab * itemsize))
    return max(1, min(max(n_rows, 1), budget // per_row))


def _row_name(r: int, lead) -> str:
    idx = tuple(int(i) for i in np.unravel_index(r, lead)) if len(lead) else ()
    return f"row {idx} (flattened row {r})"


def _raise_bad_row(m, r0, lead):
    """m: the per-row argmax value of a chunk that contains a non-finite one."""
    for kind, test in (("NaN", np.isnan), ("+inf", np.isposinf)):
        hit = np.flatnonzero(test(m))
        if hit.size:
            raise ValueError(f"logits contain {kind} in {_row_name(r0 + int(hit[0]), lead)}; "
                             "only finite values and -inf (masked vocab entries) are allowed")
    hit = np.flatnonzero(np.isneginf(m))
    raise ValueError(f"logits {_row_name(r0 + int(hit[0]), lead)} is all -inf: "
                     "the softmax of a fully masked row is undefined")


# --------------------------------------------------------------------------------------------------
# the per-chunk kernel


class _Chunk:
    """Shared per-chunk quantities (all float64; ``rows`` = chunk rows, V = vocab).

    m [rows] max; jmax [rows] its index; d [rows, V] = fl(x − m) (−inf at masked entries);
    e [rows, V] = exp(x − m) corrected for the rounding of d; t [rows] = Σ_{v≠jmax} e_v;
    s = 1 + t; L = log1p(t); work [rows, V] a scratch buffer; masked: bool [rows, V] where d is −inf
    (or None). dy: [rows] exact x_y − m as hi + lo when labels were given.
    """

    __slots__ = ("m", "jmax", "d", "e", "t", "s", "L", "work", "masked", "dy_hi", "dy_lo", "ar")

    def __init__(self, xc, r0, lead, labels=None):
        x = np.asarray(xc, dtype=np.float64)  # exact widening; no copy for float64 input
        ar = np.arange(x.shape[0])
        jmax = np.argmax(x, axis=1)  # the first NaN if any (argmax propagates NaN)
        m = x[ar, jmax]
        if not np.isfinite(m).all():
            _raise_bad_row(m, r0, lead)
        # TwoSum of x + (−m): d + lo = x − m exactly (lo is NaN where d = −inf; fixed below)
        d = x - m[:, None]
        with np.errstate(invalid="ignore"):
            bb = d - x
            lo = d - bb
            np.subtract(x, lo, out=lo)
            np.subtract(-m[:, None], bb, out=bb)
            lo += bb
        del bb, x
        masked = ~np.isfinite(lo)
        if masked.any():
            lo[masked] = 0.0
        else:
            masked = None
        if labels is not None:
            self.dy_hi = d[ar, labels]
            self.dy_lo = lo[ar, labels]
        e = np.exp(d)
        np.multiply(lo, e, out=lo)  # exp(d + lo) = exp(d)·(1 + lo) + O(lo²), |lo| ≤ 2**-53·|d|
        e += lo
        e[ar, jmax] = 0.0
        t = sum_lastdim(e)
        e[ar, jmax] = 1.0
        self.m, self.jmax, self.d, self.e, self.t = m, jmax, d, e, t
        self.s = 1.0 + t
        self.L = np.log1p(t)
        self.work = lo  # scratch from here on
        self.masked = masked
        self.ar = ar

    def finite_d(self):
        """d with its −inf (masked) entries set to 0, for sums of e·d (e is 0 there)."""
        if self.masked is not None:
            self.d[self.masked] = 0.0
            self.masked = None
        return self.d

    def entropy_terms(self):
        """A = Σ_v p_v·(m − x_v) = Σ_v e_v·(−d_v) / s  (≥ 0), so that H = L + A."""
        np.multiply(self.e, self.finite_d(), out=self.work)
        return -sum_lastdim(self.work) / self.s

    def sum_pi_squared(self):
        np.multiply(self.e, self.e, out=self.work)
        return sum_lastdim(self.work) / (self.s * self.s)

    def probs_into(self, out):
        np.divide(self.e, self.s[:, None], out=out)
        return out


def _chunks(x2, lead, labels=None):
    n, vocab = x2.shape
    step = _chunk_rows(n, vocab, x2.dtype.itemsize)
    for r0 in range(0, n, step):
        r1 = min(n, r0 + step)
        yield r0, r1, _Chunk(x2[r0:r1], r0, lead, None if labels is None else labels[r0:r1])


def _reduce(logits, fn, labels=None):
    x2, lead, vocab = _logits_2d(logits)
    lab = None if labels is None else _labels_1d(labels, lead, vocab)
    out = np.empty(x2.shape[0])
    for r0, r1, c in _chunks(x2, lead, lab):
        out[r0:r1] = fn(c)
    return out.reshape(lead)


def _grad(logits, grad_output, fn, labels=None):
    x2, lead, vocab = _logits_2d(logits)
    lab = None if labels is None else _labels_1d(labels, lead, vocab)
    g = _grad_output_1d(grad_output, lead)
    out = np.empty(x2.shape, dtype=np.float64)
    for r0, r1, c in _chunks(x2, lead, lab):
        o = out[r0:r1]
        fn(c, o, None if lab is None else lab[r0:r1])
        if g is not None:
            o *= g[r0:r1, None]
    return out.reshape(*lead, vocab)


# --------------------------------------------------------------------------------------------------
# statistics


def logsumexp(logits) -> np.ndarray:
    """log Σ_v exp(x_v) over the last dim.

    logits: ``[..., V]`` any real dtype (or torch tensor); returns float64 ``[...]`` (nats).
    Formula: m + log1p(Σ_{v≠argmax} exp(x_v − m)), m = max_v x_v.
    Accuracy: ≤ ~4 ulps of |m| + log Σ exp(x − m) (relative unless the two cancel, i.e. lse ≈ 0 with m < 0).
    Raises ValueError: all −inf row (named), NaN, +inf, V = 0. Source: standard (torch.logsumexp).
    """
    return _reduce(logits, lambda c: c.m + c.L)


def token_logprobs(logits, labels) -> np.ndarray:
    """log softmax(x)_y = x_y − logsumexp(x): the log-probability of each label.

    logits: ``[..., V]``; labels: integer ``[...]`` in ``[0, V)`` (no ignore_index: mask instead).
    Returns float64 ``[...]`` (nats, ≤ 0). A label that points at a ``-inf`` logit gives ``-inf``.
    Formula: (x_y − m) − log1p(Σ_{v≠argmax} exp(x_v − m)), with x_y − m exact (double-double);
    both terms are ≤ 0, so the result is accurate to a few ulps relative.
    Raises ValueError: bad logits (see module doc), labels of wrong shape, non-integer or out of range.
    Source: verl ``logprobs_from_logits``; Megatron ``vocab_parallel_cross_entropy`` (= −log p_y).
    """
    return _reduce(logits, lambda c: (c.dy_hi - c.L) + c.dy_lo, labels=labels)


def entropy(logits) -> np.ndarray:
    """Shannon entropy H = −Σ_v p_v log p_v of softmax(x) over the last dim.

    logits: ``[..., V]``; returns float64 ``[...]`` (nats, in [0, log V']), V' = unmasked entries.
    ``-inf`` entries contribute 0·log 0 = 0 (entropy([0, −inf]) = 0, entropy([0, 0, −inf]) = ln 2,
    fp16 [65504, −65504] → 0.0).
    Formula: H = log1p(t) + Σ_v e_v·(m − x_v)/s with e_v = exp(x_v − m), t = Σ_{v≠argmax} e_v, s = 1 + t
    (= logsumexp(x) − Σ p x, rearranged into two non-negative terms). Accuracy: a few ulps relative,
    also for nearly deterministic rows (H ≪ 1) — stronger than the absolute bound the catalog needs.
    Raises ValueError: as logsumexp. Source: verl ``entropy_from_logits``; Megatron ``vocab_parallel_entropy``.
    """
    return _reduce(logits, lambda c: c.L + c.entropy_terms())


def sum_pi_squared(logits) -> np.ndarray:
    """Σπ² = Σ_v softmax(x)_v² over the last dim (the collision probability, in [1/V', 1]).

    logits: ``[..., V]``; returns float64 ``[...]`` (dimensionless).
    Formula: Σ_v e_v² / (Σ_v e_v)², e_v = exp(x_v − m) — the same as exp(lse(2x) − 2·lse(x)), with no
    overflow; all terms positive, accurate to a few ulps relative.
    Raises ValueError: as logsumexp. Source: verl PR #6153 (``calculate_sum_pi_squared_from_logits``,
    ``vocab_parallel_sum_pi_squared``), the w_t = 1 − 2π_t + Σπ² weights of the optimal token baseline.
    """
    return _reduce(logits, lambda c: c.sum_pi_squared())


# --------------------------------------------------------------------------------------------------
# closed-form gradients: grad_output[..., None] * d stat / d logits, float64 [..., V]


def logsumexp_grad(logits, grad_output=None) -> np.ndarray:
    """d logsumexp / d logits = p = softmax(x), times ``grad_output[..., None]``.

    logits: ``[..., V]``; grad_output: ``[...]`` (broadcastable; default ones). Returns float64 ``[..., V]``;
    0 at ``-inf`` entries. Accuracy: a few ulps relative per element. Raises ValueError as logsumexp
    (and for a grad_output that does not broadcast).
    """
    return _grad(logits, grad_output, lambda c, o, lab: c.probs_into(o))


def _tlp_grad(c, o, lab):
    c.probs_into(o)
    np.negative(o, out=o)
    ar = c.ar
    ey = c.e[ar, lab]
    # 1 − p_y = (s − e_y)/s; when y is the argmax, s − e_y = t exactly (no cancellation)
    num = np.where(lab == c.jmax, c.t, c.s - ey)
    o[ar, lab] = num / c.s


def token_logprobs_grad(logits, labels, grad_output=None) -> np.ndarray:
    """d log p_y / d logits = e_y − p (one-hot of the label minus softmax), times ``grad_output[..., None]``.

    logits: ``[..., V]``; labels: integer ``[...]``; grad_output: ``[...]`` (default ones).
    Returns float64 ``[..., V]``. At the label, 1 − p_y is computed as Σ_{v≠y} e_v / s (accurate even for
    p_y → 1). At ``-inf`` entries the value is 0, except at the label itself, where it is 1 (the
    closed form e_y − p with p_y = 0, as autograd of log_softmax gives; the value there is −inf).
    Accuracy: a few ulps relative per element. Raises ValueError as token_logprobs.
    """
    return _grad(logits, grad_output, _tlp_grad, labels=labels)


def _entropy_grad(c, o, lab):
    a = c.entropy_terms()  # needs work; done before work is reused
    p = c.probs_into(o)
    w = np.add(c.finite_d(), a[:, None], out=c.work)  # log p_v + H = (x_v − m) + A
    w *= p
    np.negative(w, out=o)


def entropy_grad(logits, grad_output=None) -> np.ndarray:
    """dH / d logits = −p ⊙ (log p + H), times ``grad_output[..., None]``.

    logits: ``[..., V]``; grad_output: ``[...]`` (default ones). Returns float64 ``[..., V]``; 0 at ``-inf``
    entries (p = 0). Computed as −p_v·((x_v − m) + A) with A = Σ p (m − x) ≥ 0 (log p_v + H = x_v − m + A:
    the log-sum-exp cancels analytically). Accuracy: |err_v| ≲ 8·eps·p_v·(|log p_v| + H)·|grad_output|
    (the bracket crosses zero, so relative accuracy is impossible near p_v = exp(−H)).
    Raises ValueError as entropy.
    """
    return _grad(logits, grad_output, _entropy_grad)


def _s2_grad(c, o, lab):
    s2 = c.sum_pi_squared()
    p = c.probs_into(o)
    w = np.subtract(p, s2[:, None], out=c.work)
    w *= p
    np.multiply(w, 2.0, out=o)


def sum_pi_squared_grad(logits, grad_output=None) -> np.ndarray:
    """dΣπ² / d logits = 2p ⊙ (p − Σπ²), times ``grad_output[..., None]``.

    logits: ``[..., V]``; grad_output: ``[...]`` (default ones). Returns float64 ``[..., V]``; 0 at ``-inf``
    entries. Accuracy: |err_v| ≲ 8·eps·2p_v·(p_v + Σπ²)·|grad_output| (p_v − Σπ² crosses zero).
    Raises ValueError as sum_pi_squared. Source: verl PR #6153 (Σπ² is differentiated when it is
    computed from logits that require grad).
    """
    return _grad(logits, grad_output, _s2_grad)
