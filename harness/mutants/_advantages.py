"""Shared pieces of the advantage-estimator mutants: the reference's ``outcome_advantage`` registry with
some estimators replaced, and the group rows of an ``index``."""

from __future__ import annotations

import numpy as np
import torch

from rlconform.harness.bindings.reference import binding as reference
from rlconform.harness.catalog.binding import Variants
from rlconform.harness.core.faithful import compute_dtype


def outcome_advantage(**faulty) -> Variants:
    """Only the faulty estimators (variant name -> callable): the others are the reference's and cannot
    fail, so the mutant's run is limited to the variants it breaks (the others are reported as not
    provided)."""
    assert set(faulty) <= set(reference.ops["outcome_advantage"].impls)
    return Variants(dict(faulty))


def scores(rewards: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(outcome score per row in the compute dtype, keep mask): masked positions replaced by 0 first."""
    cd = compute_dtype(rewards.dtype)
    keep = mask != 0
    r = torch.where(keep, rewards.to(cd), torch.zeros((), dtype=cd))
    return r.sum(-1), keep


def groups(index) -> list[torch.Tensor]:
    """Row indices of each group id, in order of first appearance."""
    out: dict = {}
    for i, g in enumerate(np.asarray(index).reshape(-1).tolist()):
        out.setdefault(g, []).append(i)
    return [torch.tensor(rows) for rows in out.values()]


def broadcast(a: torch.Tensor, keep: torch.Tensor, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Row advantages [B] -> (advantages, returns) [B, T], 0 at masked positions, in ``dtype``."""
    adv = torch.where(keep, a[:, None].expand(keep.shape), torch.zeros((), dtype=a.dtype)).to(dtype)
    return adv, adv
