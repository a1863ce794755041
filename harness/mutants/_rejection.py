"""Shared piece of the rejection-mask mutants: the reference ``rollout_rejection_mask`` with a switchable
fault in how the inputs reach the decision (``inputs``), in the options (``options``), in the kept mask
(``keep``) or in the logged metrics (``metrics``)."""

from __future__ import annotations

import numpy as np
import torch

import rlconform.reference as R
from rlconform.harness.catalog.binding import Variants
from rlconform.harness.core.tensors import as_numpy
from rlconform.harness.families import rejection_mask as RS


def faulty(inputs=None, options=None, keep=None, metrics=None) -> Variants:
    """Every variant of the reference with the given faults: ``inputs(lp, old, m) -> (lp, old)`` (what the
    decision sees), ``options(opts) -> opts``, ``keep(kept, lp, old, m, variant) -> kept``, ``metrics(d, lp,
    old, m, kept) -> d``; the metrics are always taken on the true inputs."""

    def make(variant):
        def rollout_rejection_mask(log_prob, old_log_prob, mask):
            lp, old, m = as_numpy(log_prob), as_numpy(old_log_prob), mask.detach().cpu().numpy().astype(bool)
            dlp, dold = inputs(lp, old, m) if inputs else (lp, old)
            opts = options(RS.VARIANTS[variant]) if options else RS.VARIANTS[variant]
            kept = R.rollout_rejection_mask(dlp, dold, m, opts)
            if keep:
                kept = keep(kept, lp, old, m, variant)
            out = RS.reference_metrics(lp, old, m, kept)
            if metrics:
                out = metrics(out, lp, old, m, kept)
            return torch.from_numpy(kept).to(log_prob.dtype), out

        rollout_rejection_mask.__qualname__ = f"mutant.rollout_rejection_mask[{variant}]"
        return rollout_rejection_mask

    return Variants({v: make(v) for v in RS.VARIANTS})


def ess_with_epsilon(lp, old, m, cap=RS.IS_CAP):
    """verl's ESS: 1 / mean((w / (mean w + 1e-8))²) of the truncated token weights."""
    d = (lp - old)[m]
    w = np.minimum(np.exp(np.clip(d, -20, 20)), cap)
    wn = w / (w.mean() + 1e-8)
    return float(1.0 / np.mean(wn * wn))
