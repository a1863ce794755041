"""One fused float64 pass for the four softmax statistics of the same logits: :func:`token_stats`.

``token_stats(logits [..., V], labels [...] | None, grads=False)`` returns logsumexp, the label
log-probability (when labels are given), the entropy and Σπ² (``sum_pi_squared``) — and, when asked,
their gradients w.r.t. the logits — from a single chunked pass over the rows, as a dict of NumPy
float64 arrays. It computes the same formulas as :mod:`rlconform.reference.softmax_stats` (one
function per statistic, NumPy) with torch float64 kernels, so that checking at real shapes
(``[4096, 151936]``) costs no more than the engine under check (see
``benchmarks/bench_reference.py`` and ``benchmarks/results/bench_reference.md``).

Inputs, outputs and errors are those of the separate references (see the softmax_stats module doc):
logits of any real dtype (NumPy incl. ml_dtypes bfloat16, or torch tensors on any device), widened
exactly to float64; ``-inf`` is a legal masked / padded vocab entry (p = 0, 0·log 0 = 0, gradient 0);
NaN, ``+inf``, an all ``-inf`` row, V = 0 or a 0-d input raise ``ValueError``; non-real dtypes raise
``TypeError``; labels must be integers in ``[0, V)`` of the leading shape (``ValueError`` otherwise).
The input is never modified and, when C-contiguous, never copied as a whole.

Algorithm (per chunk of rows, float64 throughout; the formulas of softmax_stats)
    m = max_v x_v at one argmax j*; d_v = x_v − m by TwoSum as d + δ exactly; e_v = exp(d_v)·(1 + δ_v)
    (exp of the exact difference to within exp's own rounding, ≤ 1 ulp); e_{j*} = 1 exactly and
    t = Σ_{v≠j*} e_v, s = 1 + t, L = log1p(t). Then logsumexp = m + L; log p_y = (d_y − L) + δ_y;
    entropy = L + A with A = Σ_v e_v·(−d_v) / s ≥ 0; Σπ² = Σ_v e_v² / s². The three sums run over
    non-negative terms and are compensated (see "Accuracy"). Gradients (closed forms of the rlconform
    design): d lse = p; d log p_y = onehot(y) − p with 1 − p_y = t/s at the argmax, (s − e_y)/s
    elsewhere; dH = −p ⊙ (d + A) (= −p ⊙ (log p + H)); dΣπ² = 2p ⊙ (p − Σπ²); with p = e / s.

Accuracy (u = 2**-53; checked against mpmath at 50 digits and against softmax_stats in
tests/test_reference_fused.py)
    Each sum Σ_v a_v of non-negative terms (t, Σ e·(−d), Σ e²) is split error-free against a power of
    two σ ≥ V·max_v a_v (ExtractScalar, Rump-Ogita-Oishi 2008; see ``_sum_nonneg``): the high parts add
    up exactly in any order, the low parts are below ulp(σ)/2, so the sum's relative error is ≤ 2u
    whatever torch's summation order and thread count. The statistics therefore keep the bounds of the
    separate references (whose compensated sums are ≤ ~1u): token_logprobs, entropy, Σπ² a few u
    relative (mpmath tests at 4u, 8u for H); logsumexp a few u of |m| + log s; gradients a few u
    relative per element for d lse and d log p_y, and |err_v| ≲ 8u·p_v·(|log p_v| + H) and
    ≲ 8u·2p_v·(p_v + Σπ²) for dH and dΣπ² (differences that cross zero). Values may differ from the
    separate references in the last bits (torch's exp vs NumPy's, other sums), never by more than the
    sum of the two bounds.

Memory and time
    Rows run in chunks; the float64 working set of all chunks in flight (``_WORK_ARRAYS`` arrays of
    ``rows × V`` each) stays under ``_MAX_CHUNK_BYTES`` and ``_INPUT_FRACTION`` of the input's size
    (≥ one row), so a ``[T, 151936]`` fp32 input needs ≤ 25 % of its size in extra memory (measured:
    benchmarks/results/bench_reference.md). About 25 elementwise passes and one ``exp`` per element.
    With ``torch.get_num_threads()`` = k > 1, k Python threads each run a chunk with torch
    single-threaded (no OpenMP barrier per op, which costs a scheduler slice each on a busy machine);
    torch's thread count is set to 1 meanwhile and restored afterwards. Gradients allocate their own
    float64 ``[..., V]`` outputs (each 2× an fp32 input) and no other full-size array.

Sources: the formulas and their sources are those of :mod:`rlconform.reference.softmax_stats` (torch
``logsumexp``; verl ``logprobs_from_logits``, ``entropy_from_logits``,
``calculate_sum_pi_squared_from_logits`` (verl PR #6153); Megatron ``vocab_parallel_cross_entropy``,
``vocab_parallel_entropy``); ExtractScalar: Rump, Ogita & Oishi, "Accurate floating-point summation
part I: faithful rounding", SIAM J. Sci. Comput. 31(1), 2008; TwoSum: Knuth, TAOCP vol. 2, §4.2.2.
"""

from __future__ import annotations

import math
import queue
from concurrent.futures import ThreadPoolExecutor
from typing import Iterable

import numpy as np

from ._convert import is_tensor_like
from .softmax_stats import _grad_output_1d, _labels_1d, _logits_2d, _raise_bad_row

__all__ = ["token_stats", "STATS"]

#: The statistics of :func:`token_stats`, in output order (``token_logprobs`` only with labels).
STATS = ("logsumexp", "token_logprobs", "entropy", "sum_pi_squared")

#: float64 arrays of ``rows × V`` alive at once inside one chunk (x/δ, d, e, scratch).
_WORK_ARRAYS = 4
#: Cap on the float64 working set of one chunk, in bytes (small chunks stay in the last-level cache).
_MAX_CHUNK_BYTES = 24 << 20
#: Cap on the working set of one chunk as a fraction of the input's own size (the target is ≤ 25 %).
_INPUT_FRACTION = 0.125

#: NumPy dtypes that torch.from_numpy takes and copies exactly into float64; others go through NumPy.
_TORCH_OK = {np.dtype(t) for t in (np.float16, np.float32, np.float64, np.int8, np.int16, np.int32, np.int64,
                                   np.uint8, np.bool_)}
#: torch dtypes taken as they are besides the floating ones (exact in float64 up to 2**53).
_TORCH_INT = ("torch.bool", "torch.uint8", "torch.int8", "torch.int16", "torch.int32", "torch.int64")


def _plan(n_rows: int, vocab: int, itemsize: int, threads: int) -> tuple[int, int]:
    """(workers, rows per chunk): the working set of all workers stays ≤ min(_MAX_CHUNK_BYTES,
    _INPUT_FRACTION × input bytes); at least one worker with one row (the floor for tiny inputs)."""
    per_row = vocab * 8 * _WORK_ARRAYS
    budget = min(_MAX_CHUNK_BYTES, int(_INPUT_FRACTION * n_rows * vocab * itemsize))
    workers = max(1, min(threads, n_rows, budget // per_row))
    return workers, max(1, min(max(n_rows, 1), budget // (per_row * workers)))


def _grad_names(grads, with_labels: bool) -> tuple[str, ...]:
    if grads is False or grads is None:
        return ()
    names = tuple(s for s in STATS if s != "token_logprobs" or with_labels) if grads is True else tuple(grads)
    for g in names:
        if g not in STATS:
            raise ValueError(f"grads: unknown statistic {g!r}; expected some of {STATS}")
        if g == "token_logprobs" and not with_labels:
            raise ValueError("grads: the token_logprobs gradient needs labels")
    return tuple(s for s in STATS if s in names)


def _rows(torch, logits):
    """(x2 [N, V] NumPy array or CPU torch tensor, leading shape, V), validated as softmax_stats does.

    A torch tensor stays a tensor (bf16 and fp16 included), so that chunks are widened one at a time
    and a bf16 input is never copied as a whole (``_logits_2d`` would widen it to fp32 first).
    """
    if not is_tensor_like(logits) or not isinstance(logits, torch.Tensor):
        return _logits_2d(logits)
    t = logits.detach()
    if not (t.is_floating_point() or str(t.dtype) in _TORCH_INT):
        raise TypeError(f"logits: expected a real numeric array, got dtype {t.dtype}")
    if t.dim() == 0:
        raise ValueError("logits must have at least one dimension (the vocab, last)")
    vocab = t.shape[-1]
    if vocab == 0:
        raise ValueError(f"logits have an empty vocab dimension (shape {tuple(t.shape)}); the softmax is undefined")
    return t.cpu().reshape(-1, vocab), tuple(t.shape[:-1]), vocab


def _as_torch_rows(torch, xc):
    """A torch view (or, for dtypes torch lacks, an exact float64 copy) of the chunk ``xc``."""
    if isinstance(xc, torch.Tensor):
        return xc
    if xc.dtype not in _TORCH_OK:
        return torch.from_numpy(np.asarray(xc, dtype=np.float64))
    try:
        return torch.from_numpy(xc)
    except ValueError:  # negative strides
        return torch.from_numpy(np.ascontiguousarray(xc))


# --------------------------------------------------------------------------------------------------
# compensated row sums of non-negative terms


def _sum_nonneg(torch, a, hi, lo, amax=None):
    """Σ over dim 1 of float64 ``a [n, N]`` (terms ≥ 0, finite), returned as float64 ``[n]``.

    One error-free extraction (ExtractScalar of Rump, Ogita & Oishi, "Accurate floating-point
    summation part I", SIAM J. Sci. Comput. 31(1), 2008): with M_r = max_v a_v and σ_r the power of two
    ≥ N·M_r, hi = fl(σ + a) − σ and lo = a − hi exactly. Every hi is a multiple of ulp(σ) and
    Σ|hi| ≤ 2σ, so Σ hi is exact in any summation order; |lo| ≤ ulp(σ)/2, so even the crude bound
    (N − 1)·u·Σ|lo| ≤ 2N³u²·M ≤ 2N³u²·S gives Σ lo to < 0.8u·S for N ≤ 2**17.3 (V = 151 936).
    Result: relative error ≤ 2u, independent of torch's summation order and thread count.

    ``hi``, ``lo``: float64 ``[n, N]`` buffers (any content, disjoint from ``a``); ``lo`` may be ``a``
    itself (then ``a`` is overwritten). ``amax``: ``[n]`` row maxima when known (else computed).
    """
    n, size = a.shape
    if size == 0:
        return torch.zeros(n, dtype=torch.float64)
    m = a.amax(1) if amax is None else amax
    sigma = torch.ldexp(torch.ones(n, dtype=torch.float64), torch.frexp(m * size)[1])
    sigma = torch.where(m > 0, sigma, 1.0)[:, None]   # an all-zero row: hi = lo = 0
    torch.add(a, sigma, out=hi)
    hi.sub_(sigma)
    torch.sub(a, hi, out=lo)
    return hi.sum(1) + lo.sum(1)


# --------------------------------------------------------------------------------------------------
# the fused pass


def token_stats(logits, labels=None, grads: bool | Iterable[str] = False, grad_output=None) -> dict:
    """logsumexp, token log-prob, entropy and Σπ² of ``logits`` (and gradients) from one float64 pass.

    logits: ``[..., V]`` any real dtype (NumPy, ml_dtypes bfloat16, or a torch tensor on any device).
    labels: integer ``[...]`` in ``[0, V)`` or None (then no ``token_logprobs``).
    grads: False (default), True (the gradients of every returned statistic) or an iterable of names
    from :data:`STATS`. grad_output: ``[...]`` (broadcastable; default ones) multiplying each gradient,
    as the ``*_grad`` functions of softmax_stats do (a vector-Jacobian product per statistic).

    Returns a dict of NumPy float64 arrays: ``logsumexp``, ``entropy`` (nats), ``sum_pi_squared``
    (dimensionless) of shape ``[...]``, ``token_logprobs`` (nats, ≤ 0) when labels are given, and
    ``<stat>_grad`` of shape ``[..., V]`` for each requested gradient. The values equal those of
    ``softmax_stats.<stat>`` / ``softmax_stats.<stat>_grad`` to within both functions' error bounds
    (module doc: a few u = 2**-53 relative; see there for the gradients of H and Σπ²).

    Raises ValueError: NaN or +inf logits, an all ``-inf`` row (named), V = 0, 0-d logits, bad labels,
    an unknown name in ``grads`` or a ``token_logprobs`` gradient without labels, a grad_output that
    does not broadcast. TypeError: a non-real dtype.
    Sources: see the module doc (verl ``entropy_from_logits``, ``logprobs_from_logits``,
    ``calculate_sum_pi_squared_from_logits``; torch ``logsumexp``).
    """
    import torch

    x2, lead, vocab = _rows(torch, logits)
    lab = None if labels is None else _labels_1d(labels, lead, vocab)
    want = _grad_names(grads, lab is not None)
    g = _grad_output_1d(grad_output, lead) if want else None
    n = x2.shape[0]
    f64 = torch.float64

    stats = {k: torch.empty(n, dtype=f64) for k in STATS if k != "token_logprobs" or lab is not None}
    gout = {k: torch.empty(n, vocab, dtype=f64) for k in want}
    lab_t = None if lab is None else torch.from_numpy(lab.astype(np.int64))
    g_t = None if g is None else torch.tensor(g, dtype=f64)

    itemsize = x2.element_size() if isinstance(x2, torch.Tensor) else x2.dtype.itemsize
    workers, step = _plan(n, vocab, itemsize, torch.get_num_threads())
    starts = range(0, n, step)
    workers = min(workers, len(starts))
    pool = queue.SimpleQueue()  # one set of chunk buffers per worker thread
    for _ in range(workers):
        pool.put(tuple(torch.empty(min(step, n), vocab, dtype=f64) for _ in range(_WORK_ARRAYS)))

    def chunk(r0):
        bufs = pool.get()
        try:
            _chunk(torch, x2, r0, min(n, r0 + step), lead, bufs, stats, gout, lab_t, g_t)
        finally:
            pool.put(bufs)

    if workers == 1:
        for r0 in starts:
            chunk(r0)
    else:
        # Each worker runs torch single-threaded on its own chunks: no OpenMP barrier per op, which on
        # a shared (oversubscribed) machine costs a scheduler slice each. Restored afterwards.
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        ex = ThreadPoolExecutor(workers)
        try:
            for _ in ex.map(chunk, starts):  # in order: the first bad chunk's error is raised
                pass
        finally:  # an error or an interrupt: the chunks not started yet are dropped
            ex.shutdown(wait=True, cancel_futures=True)
            torch.set_num_threads(threads)

    out = {k: v.numpy().reshape(lead) for k, v in stats.items()}
    for k, v in gout.items():
        out[k + "_grad"] = v.numpy().reshape(*lead, vocab)
    return out


def _chunk(torch, x2, r0, r1, lead, bufs, stats, gout, lab_t, g_t):
    """Rows ``r0:r1`` of ``x2`` into ``stats[name][r0:r1]`` (and ``gout``); ``bufs``: 4 float64 ``[≥ rows, V]``."""
    k = r1 - r0
    x, d, e, w = (b[:k] for b in bufs)   # x, then δ, then the sums' scratch; d; e; scratch
    x.copy_(_as_torch_rows(torch, x2[r0:r1]))
    m, jmax = torch.max(x, dim=1)
    if not bool(torch.isfinite(m).all()):
        _raise_bad_row(m.numpy(), r0, lead)
    # d = −inf somewhere (a masked entry, or x − m overflowing for float64 input): then δ has NaNs
    masked = math.isinf(float(x.amin()) - float(m.amax()))
    mc = m[:, None]
    # TwoSum(x, −m): d + δ = x − m exactly; δ lands in x (NaN where d = −inf: set to 0)
    torch.sub(x, mc, out=d)
    torch.sub(d, x, out=w)             # bb = d − x
    torch.sub(d, w, out=e)             # d − bb
    x.sub_(e)                          # x − (d − bb)
    w.neg_().sub_(mc)                  # −m − bb
    x.add_(w)                          # δ
    if masked:
        torch.nan_to_num(x, nan=0.0, out=x)
    ar = torch.arange(k)
    lab = None if lab_t is None else lab_t[r0:r1]
    if lab is not None:
        dy_hi, dy_lo = d[ar, lab], x[ar, lab]
    torch.exp(d, out=e)
    x.mul_(e)
    e.add_(x)                          # exp(d + δ) = exp(d)·(1 + δ) + O(δ²)
    if masked:
        torch.nan_to_num(d, neginf=0.0, out=d)   # e = 0 there, so e·d must be 0
    # x (δ is used up) and w are the sums' scratch
    e[ar, jmax] = 0.0
    t = _sum_nonneg(torch, e, x, w)
    e[ar, jmax] = 1.0
    s = 1.0 + t
    L = torch.log1p(t)
    torch.mul(e, d, out=w)
    w.neg_()                           # e·(m − x) ≥ 0
    A = _sum_nonneg(torch, w, x, w) / s
    torch.mul(e, e, out=w)
    s2 = _sum_nonneg(torch, w, x, w, amax=torch.ones(k, dtype=torch.float64)) / (s * s)   # max e² = e_{j*}² = 1
    stats["logsumexp"][r0:r1] = m + L
    if lab is not None:
        stats["token_logprobs"][r0:r1] = (dy_hi - L) + dy_lo
    stats["entropy"][r0:r1] = L + A
    stats["sum_pi_squared"][r0:r1] = s2
    if gout:
        _grads_into(torch, gout, r0, r1, e, d, s, t, A, s2, jmax, lab, None if g_t is None else g_t[r0:r1], w)


def _grads_into(torch, gout, r0, r1, e, d, s, t, A, s2, jmax, lab, g, w):
    """Closed-form gradients of one chunk into ``gout[name][r0:r1]`` (formulas as softmax_stats)."""
    p = torch.div(e, s[:, None], out=w)
    ar = torch.arange(r1 - r0)
    if "logsumexp" in gout:
        gout["logsumexp"][r0:r1].copy_(p)
    if "token_logprobs" in gout:
        o = gout["token_logprobs"][r0:r1]
        torch.neg(p, out=o)
        ey = e[ar, lab]
        # 1 − p_y = (s − e_y)/s; when y is the argmax, s − e_y = t exactly (no cancellation)
        o[ar, lab] = torch.where(lab == jmax, t, s - ey) / s
    if "entropy" in gout:
        o = gout["entropy"][r0:r1]
        torch.add(d, A[:, None], out=o)    # log p_v + H = (x_v − m) + A
        o.mul_(p).neg_()
    if "sum_pi_squared" in gout:
        o = gout["sum_pi_squared"][r0:r1]
        torch.sub(p, s2[:, None], out=o)
        o.mul_(p).mul_(2.0)
    if g is not None:
        for o in gout.values():
            o[r0:r1].mul_(g[:, None])
