"""Shared piece of the value-loss mutants: a plain torch token-mean clipped value loss with switchable
faults (which side the clip takes, whether the numerator is masked)."""

from __future__ import annotations

import torch

from rlconform.harness.families import value_loss as VL


def token_mean_value_loss(pick=torch.maximum, mask_numerator: bool = True):
    """``value_loss[token-mean]`` in fp64 (rounded to vpreds' dtype): ½·Σ pick((v − R)², (v_clip − R)²)·m /
    global nnz, metric vf_clipfrac = token mean of [(v_clip − R)² > (v − R)²]. ``pick`` = torch.maximum is
    correct; ``mask_numerator=False`` sums every position, padding included."""
    eps, _ = VL.VARIANTS["token-mean"]

    def value_loss(vpreds, values, returns, response_mask, info):
        m = response_mask.bool()
        z = torch.zeros((), dtype=torch.float64)
        v = vpreds.double()
        v_old = torch.where(m, values.double(), z)
        ret = torch.where(m, returns.double(), z) if mask_numerator else returns.double()
        v_clip = v_old + (v - v_old).clamp(-eps, eps)
        l1, l2 = (v - ret) ** 2, (v_clip - ret) ** 2
        per_token = pick(l1, l2)
        total = torch.where(m, per_token, z).sum() if mask_numerator else per_token.sum()
        loss = 0.5 * total / max(info.global_nnz, 1)
        n = int(m.sum())
        metrics = {"vf_clipfrac": float(((l2 > l1) & m).sum()) / n} if n else {}
        return loss.to(vpreds.dtype), metrics

    return value_loss
