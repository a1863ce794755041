"""Self-tests of the fused pass ``rlconform.reference.token_stats``.

It must give the statistics and gradients of the separate references (``softmax_stats``) to within
their error bounds: checked against mpmath at 50 digits with the tolerances of
tests/test_reference_mpmath.py (whose strategy and mpmath formulas are reused, not copied), against
the separate references on larger vocabularies (where the compensated sums take their long path),
and on the edge cases: ``-inf`` / padded vocab, float64 logits whose differences overflow, huge
offsets, one-hot peaks, chunking and threads, torch (bf16) input, errors.
"""

from __future__ import annotations

import importlib.util
import math
import pathlib

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rlconform.reference as R
from rlconform.reference import fused_stats as FS

_spec = importlib.util.spec_from_file_location(
    "_rlconform_mpmath_refs", pathlib.Path(__file__).with_name("test_reference_mpmath.py"))
MP = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(MP)
EPS, FLOOR, DPS, NINF = MP.EPS, MP.FLOOR, MP.DPS, MP.NINF
GRADS = ("logsumexp", "token_logprobs", "entropy", "sum_pi_squared")


def _separate(x, labels, go=None):
    """The separate references, keyed like token_stats' output."""
    return {"logsumexp": R.logsumexp(x), "token_logprobs": R.token_logprobs(x, labels), "entropy": R.entropy(x),
            "sum_pi_squared": R.sum_pi_squared(x), "logsumexp_grad": R.logsumexp_grad(x, go),
            "token_logprobs_grad": R.token_logprobs_grad(x, labels, go), "entropy_grad": R.entropy_grad(x, go),
            "sum_pi_squared_grad": R.sum_pi_squared_grad(x, go)}


@MP.SETTINGS
@given(case=MP.logits_rows())
def test_fused_stats_against_mpmath(case):
    x, labels = case
    before = x.copy()
    out = R.token_stats(x, labels)
    np.testing.assert_array_equal(x, before)
    assert set(out) == set(GRADS)
    for v in out.values():
        assert v.dtype == np.float64 and v.shape == x.shape[:-1]
    lse, tlp, h, s2 = (out[k] for k in GRADS)
    for r in range(x.shape[0]):
        ref = MP.mp_row([float(v) for v in x[r]])
        scale = float(abs(ref["m"]) + abs(ref["logz"]))
        assert MP.err(lse[r], ref["lse"]) <= 4 * EPS * scale + FLOOR, (x[r], lse[r], ref["lse"])
        y = int(labels[r])
        if ref["logp"][y] is None:
            assert tlp[r] == NINF
        else:
            assert MP.err(tlp[r], ref["logp"][y]) <= 4 * EPS * float(abs(ref["logp"][y])) + FLOOR, (x[r], y)
        assert MP.err(h[r], ref["h"]) <= 8 * EPS * float(ref["h"]) + FLOOR, (x[r], h[r], ref["h"])
        assert h[r] >= 0.0
        assert MP.err(s2[r], ref["s2"]) <= MP.S2_EPS * EPS * float(ref["s2"]), (x[r], s2[r], ref["s2"])


@MP.SETTINGS
@given(case=MP.logits_rows(), g=st.none() | MP.grad_outputs)
def test_fused_gradients_against_mpmath_closed_forms(case, g):
    x, labels = case
    go = None if g is None else np.full(x.shape[:-1], g)
    out = R.token_stats(x, labels, grads=True, grad_output=go)
    got = [out[k + "_grad"] for k in GRADS]
    for v in got:
        assert v.dtype == np.float64 and v.shape == x.shape and np.isfinite(v).all()
    gscale = 1.0 if g is None else abs(g)
    for r in range(x.shape[0]):
        ref = MP.mp_row([float(v) for v in x[r]])
        refs = MP.mp_grads(ref, int(labels[r]))
        with mpmath.workdps(DPS):
            gm = mpmath.mpf(1 if g is None else g)
            for v in range(x.shape[1]):
                p = ref["p"][v]
                absl = 0 if ref["logp"][v] is None else abs(ref["logp"][v])
                tols = (4 * EPS * float(p) * gscale, 4 * EPS * float(abs(refs[1][v])) * gscale,
                        16 * EPS * float(p * (absl + ref["h"])) * gscale,
                        16 * EPS * float(2 * p * (p + ref["s2"])) * gscale)
                for k in range(4):
                    assert MP.err(got[k][r, v], gm * refs[k][v]) <= tols[k] + FLOOR, (k, x[r], v, got[k][r, v])
                if x[r, v] == NINF:
                    assert got[0][r, v] == 0 and got[2][r, v] == 0 and got[3][r, v] == 0


@settings(max_examples=8, deadline=None, database=None)
@given(seed=st.integers(0, 2**32 - 1), vocab=st.sampled_from([257, 700, 4099]),
       regime=st.sampled_from(["moderate", "peaked", "padded", "offset"]))
def test_long_rows_against_mpmath(seed, vocab, regime):
    """V > 256: the extraction sums run over long rows (mpmath on one row per example)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, vocab)) * 4
    if regime == "peaked":
        x[:, 3] += 60.0  # one-hot: t ~ V·e^-60, H ~ 1e-23
    elif regime == "padded":
        x[:, vocab - vocab // 3:] = NINF  # Megatron-style padding of V to a multiple of TP
    elif regime == "offset":
        x += 1e4
    x = x.astype(np.float32)
    labels = np.array([3, vocab // 2])
    out = R.token_stats(x, labels)
    ref = MP.mp_row([float(v) for v in x[1]])
    assert MP.err(out["logsumexp"][1], ref["lse"]) <= 4 * EPS * float(abs(ref["m"]) + abs(ref["logz"]))
    lp = ref["logp"][vocab // 2]
    assert out["token_logprobs"][1] == NINF if lp is None else \
        MP.err(out["token_logprobs"][1], lp) <= 4 * EPS * float(abs(lp))
    assert MP.err(out["entropy"][1], ref["h"]) <= 8 * EPS * float(ref["h"])
    assert MP.err(out["sum_pi_squared"][1], ref["s2"]) <= 4 * EPS * float(ref["s2"])


def _agree(out, sep, keys=GRADS, ulps=8):
    for k in keys:
        a, b = out[k], sep[k]
        assert a.shape == b.shape
        np.testing.assert_array_equal(np.isfinite(a), np.isfinite(b))
        fin = np.isfinite(b)
        np.testing.assert_array_less(np.abs(a[fin] - b[fin]), ulps * EPS * np.abs(b[fin]) + FLOOR, err_msg=k)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_agrees_with_separate_references(dtype):
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((5, 3, 1000)) * 6).astype(dtype)
    x[0, :, 900:] = NINF                    # padded vocab
    x[1, 0, 17] = 90.0                      # one-hot peak
    x[2] += dtype(200.0) if dtype != np.float16 else dtype(60000.0)   # huge offset
    labels = rng.integers(0, 1000, (5, 3))
    labels[0, 0] = 950                      # a label on a masked entry: log p = -inf, gradient 1 there
    go = rng.standard_normal((5, 3))
    out = R.token_stats(x, labels, grads=True, grad_output=go)
    sep = _separate(x, labels, go)
    _agree(out, sep)
    # gradients: within the sum of both bounds (the same closed forms; per-element scale as documented)
    p = sep["logsumexp_grad"] / go[..., None]
    h, s2 = sep["entropy"][..., None], sep["sum_pi_squared"][..., None]
    logp = np.where(p > 0, x.astype(np.float64) - sep["logsumexp"][..., None], 0.0)
    scale = {"logsumexp_grad": 8 * p, "token_logprobs_grad": 8 * np.abs(sep["token_logprobs_grad"] / go[..., None]),
             "entropy_grad": 32 * p * (np.abs(logp) + h), "sum_pi_squared_grad": 32 * 2 * p * (p + s2)}
    for k, sc in scale.items():
        assert np.all(np.abs(out[k] - sep[k]) <= EPS * sc * np.abs(go[..., None]) + FLOOR), k
    assert out["token_logprobs"][0, 0] == NINF and out["token_logprobs_grad"][0, 0, 950] == pytest.approx(go[0, 0])


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # softmax_stats: x − m overflows
def test_float64_overflowing_differences_and_huge_logits():
    # x − m overflows to -inf for the smallest entry: p = 0 there, as in the separate references
    x = np.array([[1.7e308, -1.7e308, 1.0e308], [1e300, -1e300, 0.0], [65504.0, -65504.0, 0.0]])
    labels = np.array([1, 2, 0])
    out = R.token_stats(x, labels, grads=True)
    _agree(out, _separate(x, labels), ulps=4)
    assert out["entropy"].tolist() == [0.0, 0.0, 0.0] and out["sum_pi_squared"].tolist() == [1.0, 1.0, 1.0]
    assert np.isfinite(out["entropy_grad"]).all()


def test_one_hot_peak_keeps_relative_accuracy():
    x = np.zeros((1, 5000), np.float32)
    x[0, 11] = 100.0
    out = R.token_stats(x, np.array([11]), grads=("token_logprobs",))
    ref = MP.mp_row([float(v) for v in x[0]])
    assert MP.err(out["token_logprobs"][0], ref["logp"][11]) <= 2 * EPS * float(abs(ref["logp"][11]))
    assert MP.err(out["entropy"][0], ref["h"]) <= 4 * EPS * float(ref["h"])
    assert MP.err(out["token_logprobs_grad"][0, 11], ref["one_minus_p"][11]) <= 2 * EPS * float(ref["one_minus_p"][11])
    assert set(out) == set(GRADS) | {"token_logprobs_grad"}


def test_chunks_and_threads_do_not_change_the_result(monkeypatch):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((37, 300)) * 5).astype(np.float32)
    x[5, :7] = NINF
    labels = rng.integers(0, 300, 37)
    full = R.token_stats(x, labels, grads=True)
    threads = torch.get_num_threads()
    # budget for exactly 3 one-row chunks at a time: up to 3 worker threads, each on one row
    monkeypatch.setattr(FS, "_MAX_CHUNK_BYTES", 3 * 300 * 8 * FS._WORK_ARRAYS)
    monkeypatch.setattr(FS, "_INPUT_FRACTION", 10.0)
    assert FS._plan(37, 300, 4, 3) == (3, 1) and FS._plan(37, 300, 4, 1) == (1, 3)
    for n in (1, 3):
        torch.set_num_threads(n)
        try:
            small = R.token_stats(x, labels, grads=True)
        finally:
            torch.set_num_threads(threads)
        assert torch.get_num_threads() == threads
        assert set(small) == set(full)
        for k in full:
            np.testing.assert_array_equal(small[k], full[k], err_msg=k)


def test_torch_input_shapes_and_no_labels():
    torch = pytest.importorskip("torch")
    x = torch.randn(2, 3, 50, dtype=torch.float32).to(torch.bfloat16).requires_grad_()
    before = x.detach().clone()
    out = R.token_stats(x)
    assert set(out) == {"logsumexp", "entropy", "sum_pi_squared"}
    xb = x.detach().float().numpy()
    for k, v in out.items():
        assert v.shape == (2, 3)
        np.testing.assert_array_equal(v, R.token_stats(xb)[k])
    assert torch.equal(x.detach(), before)
    one = R.token_stats(np.array([0.0, 1.0, NINF]), np.int64(1), grads=True)
    assert one["entropy"].shape == () and one["entropy_grad"].shape == (3,)
    assert one["logsumexp"] == pytest.approx(math.log(1 + math.e))


def test_errors_name_the_row():
    x = np.zeros((6, 4), np.float32)
    x[4] = NINF
    with pytest.raises(ValueError, match=r"row \(4,\).*all -inf"):
        R.token_stats(x)
    x[4] = 0.0
    x[2, 1] = np.nan
    with pytest.raises(ValueError, match=r"NaN in row \(2,\)"):
        R.token_stats(x)
    x[2, 1] = np.inf
    with pytest.raises(ValueError, match=r"\+inf"):
        R.token_stats(x)
    x[2, 1] = 0.0
    with pytest.raises(ValueError, match="out of range"):
        R.token_stats(x, np.full(6, 4))
    with pytest.raises(ValueError, match="needs labels"):
        R.token_stats(x, grads=("token_logprobs",))
    with pytest.raises(ValueError, match="unknown statistic"):
        R.token_stats(x, grads=("kl",))
    with pytest.raises(ValueError, match="empty vocab"):
        R.token_stats(np.zeros((2, 0)))
    with pytest.raises(TypeError):
        R.token_stats(np.zeros((2, 3), np.complex128))
