"""Fused-linear token statistics: log-probs and entropy from hidden states and the LM-head weight.

``fused_linear_token_stats(hidden [..., H], weight [V, H], labels int [...], temperature) ->
(logprobs [...], entropy [...])``: the logits ``z = hidden @ weightᵀ / temperature`` are formed in
float64 (a [N, V] product of float64 numbers: each logit carries ≲ H·eps₆₄ relative rounding, far below
any engine dtype), then ``logprobs = log softmax(z)_label`` and ``entropy = H(softmax(z))`` with the exact
references of :mod:`.softmax_stats`.

``fused_linear_token_stats_grad(hidden, weight, labels, temperature, grad_logprobs, grad_entropy) ->
(d_hidden [..., H], d_weight [V, H])``: with ``G = grad_logprobs·(e_y − p) − grad_entropy·p ⊙ (log p + H)``
(:func:`.softmax_stats.token_logprobs_grad` + :func:`.softmax_stats.entropy_grad`, the closed forms of
dL/dz) and z = h Wᵀ / τ: ``d_hidden = (G / τ) @ W`` and ``d_weight = (G / τ)ᵀ @ h`` over all rows.

Source: verl 0.9.1 ``verl/utils/experimental/torch_functional.py`` (``FusedLinearForPPO``: chunked
forward ``_fused_linear_for_ppo_fwd`` and the hand-written backward ``_fused_linear_for_ppo_bwd``, which
uses these same closed forms); Liger-Kernel's fused linear cross-entropy computes the same quantities.
NumPy in, float64 out; no torch.
"""

from __future__ import annotations

import numpy as np

from ._convert import as_float64
from .softmax_stats import entropy, entropy_grad, token_logprobs, token_logprobs_grad


def _logits(hidden, weight, temperature):
    h = as_float64(hidden, "hidden")
    w = as_float64(weight, "weight")
    if h.ndim < 1 or w.ndim != 2 or h.shape[-1] != w.shape[1]:
        raise ValueError(f"hidden [..., H] and weight [V, H] do not match: {h.shape} and {w.shape}")
    if not (np.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature must be a positive finite number, got {temperature!r}")
    return h, w, (h @ w.T) / float(temperature)


def fused_linear_token_stats(hidden, weight, labels, temperature=1.0):
    """(logprobs [...], entropy [...]) of ``z = hidden @ weightᵀ / temperature`` in float64 (see module)."""
    _, _, z = _logits(hidden, weight, temperature)
    return token_logprobs(z, labels), entropy(z)


def fused_linear_token_stats_grad(hidden, weight, labels, temperature=1.0, grad_logprobs=None, grad_entropy=None):
    """(d_hidden [..., H], d_weight [V, H]) of Σ grad_logprobs·logprobs + Σ grad_entropy·entropy (see module);
    a ``None`` upstream gradient is zero (that output not used)."""
    h, w, z = _logits(hidden, weight, temperature)
    g = np.zeros_like(z)
    if grad_logprobs is not None:
        g += token_logprobs_grad(z, labels, grad_logprobs)
    if grad_entropy is not None:
        g += entropy_grad(z, grad_entropy)
    g /= float(temperature)
    g2 = g.reshape(-1, w.shape[0])
    return (g2 @ w).reshape(h.shape), g2.T @ h.reshape(-1, w.shape[1])
