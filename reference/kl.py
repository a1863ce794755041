"""Per-token KL estimators between the policy and a reference policy, and their gradients.

With Δ = logprob − ref_logprob (the log-ratio log π/π_ref of the sampled token; the samples come
from π) the estimators of KL(π ‖ π_ref) of J. Schulman, "Approximating KL divergence" (2020,
http://joschu.net/blog/kl-approx.html) are

===========================  ================================  =======================================
mode (verl / SkyRL name)     value                             ∂ value / ∂ logprob
===========================  ================================  =======================================
``k1`` (verl also ``kl``)    Δ                                 1
``abs``                      |Δ|                               sign(Δ)  (0 at Δ = 0, as torch)
``k2`` (verl also ``mse``)   Δ²/2                              Δ
``k3`` (``low_var_kl``)      e^{−Δ} − 1 + Δ, clamped (below)   1 − e^{−Δ}  (0 where a clamp is active)
``<mode>+`` (verl only)      the value of ``<mode>``           Δ (the k2 gradient: straight-through)
===========================  ================================  =======================================

k3 clamps (verl ``kl_penalty_forward``, SkyRL ``compute_approx_kl``): d = ref_logprob − logprob is
clamped to [−20, 20] before ``exp``, and the estimate to [−10, 10]. Since e^{±20} ∓ 20 − 1 > 10, the
outer clamp decides alone: k3 = min(e^{d} − d − 1, 10) for every d (NaN aside), with gradient 0
where e^{d} − d − 1 > 10, i.e. for Δ < −2.6108686 or Δ > 10.9999833 (the gradient passes at
exactly 10, torch's clamp convention). ``clamp=False`` gives the unclamped
estimator (finite for −709.78 < Δ; +inf beyond: e^{−Δ} exceeds the float64 range there).

The straight-through modes (verl ``kl_penalty``: "k1+", "kl+", "abs+", "k2+", "mse+", "k3+",
"low_var_kl+") return ``b − sg(b) + sg(f)`` with b = Δ²/2 and f the base estimate: the value is the
base estimate, the gradient that of k2, which is an unbiased estimate of ∇KL. ("k2+"/"mse+" thus
equal "k2"; verl's expression gives NaN if b overflows, not reachable for finite fp32 Δ < 2.6e19.)
verl's "full" mode raises NotImplementedError and is not referenced. SkyRL 0.4.0 registers k1, abs,
k2, k3 (no straight-through) and, given a loss mask, returns 0 at masked positions.

Masked positions (``mask`` given) hold 0 in the value and gradient, whatever the inputs hold there.
"""

from __future__ import annotations

import numpy as np

from ._convert import as_float64
from ._policy_common import exp_minus_one_minus, log_ratio, masked_inputs

__all__ = ["KL_ESTIMATORS", "kl_estimator", "kl_estimator_grad"]

_BASE = {"k1": "k1", "kl": "k1", "abs": "abs", "k2": "k2", "mse": "k2", "k3": "k3", "low_var_kl": "k3"}

#: Every mode name accepted (verl's spellings and SkyRL's; ``+`` = straight-through, verl only).
KL_ESTIMATORS = tuple(_BASE) + tuple(name + "+" for name in _BASE)

#: verl / SkyRL clamp of d = ref − logprob in k3, and of the k3 estimate.
K3_LOG_RATIO_CLAMP = 20.0
K3_VALUE_CLAMP = 10.0


def _mode(mode: str):
    if not isinstance(mode, str) or mode not in KL_ESTIMATORS:
        raise ValueError(f"unknown KL estimator {mode!r}; expected one of: {', '.join(KL_ESTIMATORS)}")
    straight = mode.endswith("+")
    return _BASE[mode[:-1] if straight else mode], straight


def _inputs(logprob, ref_logprob, mask):
    if mask is None:
        lp = as_float64(logprob, "logprob")
        ref = as_float64(ref_logprob, "ref_logprob")
        if lp.shape != ref.shape:
            raise ValueError(f"ref_logprob has shape {ref.shape}, expected {lp.shape} (logprob's)")
        for name, x in (("logprob", lp), ("ref_logprob", ref)):
            if not np.isfinite(x).all():
                pos = tuple(int(i) for i in np.argwhere(~np.isfinite(x))[0])
                raise ValueError(f"{name} has a non-finite entry {x[pos]!r} at {pos} (pass a mask to ignore it)")
        return None, lp, ref
    m, a = masked_inputs(mask, "mask", logprob=logprob, ref_logprob=ref_logprob)
    return m, a["logprob"], a["ref_logprob"]


def _k3(lp, ref, clamp):
    """(k3 value, d k3 / d logprob) with d = ref − logprob = s + e exactly (double-double):
    f(d) = e^d − d − 1 ≈ f(s) + expm1(s)·e and −f'(d) = −expm1(d) ≈ −(expm1(s) + e^s·e); the
    derivative is 0 where a clamp is active."""
    s, e = log_ratio(ref, lp)
    if clamp:
        inner = (s >= -K3_LOG_RATIO_CLAMP) & (s <= K3_LOG_RATIO_CLAMP)
        s = np.clip(s, -K3_LOG_RATIO_CLAMP, K3_LOG_RATIO_CLAMP)
        e = np.where(inner, e, 0.0)
    with np.errstate(over="ignore", invalid="ignore"):
        em1 = np.expm1(s)
        v = exp_minus_one_minus(s) + np.where(e == 0, 0.0, em1 * e)
        g = -(em1 + np.where(e == 0, 0.0, np.exp(s) * e))
    if not clamp:
        return v, g
    passes = inner & (v <= K3_VALUE_CLAMP)  # v >= 0 > −10 always
    return np.minimum(v, K3_VALUE_CLAMP), np.where(passes, g, 0.0)


def kl_estimator(logprob, ref_logprob, mode: str, *, mask=None, clamp: bool = True) -> np.ndarray:
    """Per-token KL estimate (nats) of KL(π ‖ π_ref) from the sampled tokens' log-probs.

    logprob, ref_logprob: ``[...]`` (usually ``[B, T]``; any real dtype or torch tensor), log π and
    log π_ref of the sampled tokens. mode: one of :data:`KL_ESTIMATORS` (table in the module doc).
    mask: optional ``[B, T]`` bool/0-1; masked entries are 0 whatever the inputs hold there.
    clamp: apply the engines' k3 clamps (default, as verl and SkyRL); ``False`` gives the exact
    unclamped e^{−Δ} − 1 + Δ. No effect on the other modes.
    Returns float64 of the inputs' shape. Accuracy: k1 and abs within ½ ulp, k2 within 2 ulps of the exact
    value of the float64 inputs; k3 a few ulps relative (Δ kept exact as a double-double; a Taylor series
    for |Δ| < 0.5, expm1 elsewhere).
    Raises ValueError: unknown mode, shapes that differ, NaN/±inf at an unmasked entry.
    Source: verl 0.9.1 ``core_algos.kl_penalty`` / ``kl_penalty_forward``; SkyRL 0.4.0
    ``ppo_utils.compute_approx_kl``; Schulman (2020).
    """
    base, _ = _mode(mode)
    m, lp, ref = _inputs(logprob, ref_logprob, mask)
    delta = lp - ref
    if base == "k1":
        out = delta
    elif base == "abs":
        out = np.abs(delta)
    elif base == "k2":
        out = 0.5 * delta * delta
    else:
        out, _ = _k3(lp, ref, clamp)
    if m is not None:
        out = np.where(m, out, 0.0)
    return out


def kl_estimator_grad(logprob, ref_logprob, mode: str, grad_output=None, *, mask=None,
                      clamp: bool = True) -> np.ndarray:
    """∂ kl_estimator / ∂ logprob, elementwise, times ``grad_output`` (default ones).

    Same arguments as :func:`kl_estimator`; grad_output broadcastable to the inputs' shape. Returns
    float64 of the inputs' shape: 1 (k1), sign(Δ) (abs; 0 at Δ = 0), Δ (k2 and every ``+`` mode),
    1 − e^{−Δ} = −expm1(−Δ) (k3; 0 where a clamp is active, see the module doc). Masked entries are
    exactly 0. Accuracy: ≤ 2 ulps relative per element before the product with grad_output.
    Raises ValueError as :func:`kl_estimator`, and for a grad_output that does not broadcast.
    The gradient w.r.t. ref_logprob is the negative of this one for k1, abs, k2 and the ``+``
    modes, and e^{−Δ} − 1 for k3 (not provided: engines treat π_ref as a constant).
    """
    base, straight = _mode(mode)
    m, lp, ref = _inputs(logprob, ref_logprob, mask)
    delta = lp - ref
    if straight or base == "k2":
        g = delta.copy()
    elif base == "k1":
        g = np.ones_like(delta)
    elif base == "abs":
        g = np.sign(delta)
    else:
        _, g = _k3(lp, ref, clamp)
    if grad_output is not None:
        go = as_float64(grad_output, "grad_output")
        try:
            go = np.broadcast_to(go, g.shape)
        except ValueError:
            raise ValueError(f"grad_output has shape {go.shape}, expected (broadcastable to) {g.shape}") from None
        g = g * go
    if m is not None:
        g = np.where(m, g, 0.0)
    return g
