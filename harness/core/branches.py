"""The branches of a piecewise definition, as data.

A clip, a dual clip, a cap, a clamp, a threshold or a ``where`` splits an op's definition into branches. A
family lists, per variant, each branch as a :class:`Branch`: a name and a predicate over the inputs dict
of a Case (the family strategy's draw) that marks where the branch is taken. The predicate returns a bool
array: ``[B, T]`` (tokens; only the valid tokens of ``inputs[mask_key]`` count) or ``[B]`` (rows or
groups; counted as given). :func:`branch_counts` counts how many times each branch is taken, so a test
can require that the CI profile's examples take every listed branch at ordinary magnitudes
(tests/test_branch_coverage.py): a branch no example takes is a bug the catalog cannot catch.

Also :func:`place_in_regions`, the strategies' tool to take the branches: it moves chosen entries of an
array into given intervals (one entry per interval first, then a random fraction), so that even a small
example takes several branches.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np


@dataclasses.dataclass(frozen=True)
class Branch:
    """One branch of a variant's definition: ``name`` (what a maintainer reads: "ratio above the dual-clip
    constant c with A < 0") and ``taken(inputs) -> bool ndarray`` ([B, T] over tokens or [B] over rows)."""

    name: str
    taken: Callable[[dict], np.ndarray]


def branch_counts(branches, inputs: dict, mask_key: str = "mask") -> dict[str, int]:
    """How many valid tokens (or rows, for a ``[B]`` predicate) of ``inputs`` take each branch:
    ``{branch.name: int}``. A ``[B, T]`` predicate is counted where ``inputs[mask_key]`` is True.
    Raises ValueError for a predicate whose result is neither ``[B, T]`` nor ``[B]``."""
    mask = np.asarray(inputs[mask_key], bool)
    out = {}
    for br in branches:
        with np.errstate(all="ignore"):
            hit = np.asarray(br.taken(inputs), bool)
        if hit.shape == mask.shape:
            out[br.name] = int((hit & mask).sum())
        elif hit.shape == mask.shape[:1]:
            out[br.name] = int(hit.sum())
        else:
            raise ValueError(f"branch {br.name!r}: predicate shape {hit.shape}, expected {mask.shape} or "
                             f"{mask.shape[:1]}")
    return out


def place_in_regions(rng: np.random.Generator, x: np.ndarray, regions, *, where: np.ndarray | None = None,
                     fraction: float = 0.25) -> tuple[np.ndarray, np.ndarray]:
    """``x`` (float64, any shape) with entries moved into ``regions`` (a sequence of intervals ``(lo, hi)``,
    drawn uniformly inside): first one distinct entry per region (positions where ``where`` is True
    preferred, in random order), then each other entry with probability ``fraction`` into a random region.
    Returns ``(new x, region index per entry: int ndarray, -1 where unchanged)``. With fewer entries
    than regions, a random subset of the regions is placed."""
    x = np.array(x, dtype=np.float64, copy=True)
    which = np.full(x.shape, -1, dtype=np.int64)
    if not regions or x.size == 0:
        return x, which
    flat, wflat = x.reshape(-1), which.reshape(-1)
    pref = np.ones(flat.size, bool) if where is None else np.asarray(where, bool).reshape(-1)
    order = np.concatenate([rng.permutation(np.flatnonzero(pref)), rng.permutation(np.flatnonzero(~pref))])
    k = len(regions)
    for pos, reg in zip(order, rng.permutation(k)):
        wflat[pos] = reg
    rest = (wflat < 0) & (rng.random(flat.size) < fraction)
    wflat[rest] = rng.integers(0, k, size=int(rest.sum()))
    lo = np.array([r[0] for r in regions], dtype=np.float64)
    hi = np.array([r[1] for r in regions], dtype=np.float64)
    hit = wflat >= 0
    flat[hit] = rng.uniform(lo[wflat[hit]], hi[wflat[hit]])
    return x, which


def place_rows_in_regions(rng: np.random.Generator, x: np.ndarray, mask: np.ndarray, regions, *,
                          reduce: str = "mean") -> tuple[np.ndarray, np.ndarray]:
    """``x`` [B, T] with whole rows shifted so that the row's mean (``reduce="mean"``) or sum (``"sum"``) over
    its valid tokens (``mask``) falls in a region: one distinct row with a valid token per region, in random
    order (a random subset of the regions when there are fewer such rows). Every entry of a chosen row moves
    by the same amount (its masked entries too), so the row's own spread is kept.
    Returns ``(new x, region index per row [B]: -1 where unchanged)``."""
    x = np.array(x, dtype=np.float64, copy=True)
    which = np.full(x.shape[0], -1, dtype=np.int64)
    rows = rng.permutation(np.flatnonzero(np.asarray(mask, bool).any(-1)))
    for i, reg in zip(rows, rng.permutation(len(regions))):
        lo, hi = regions[reg]
        n = int(mask[i].sum())
        current = x[i][mask[i]].sum()
        target = rng.uniform(lo, hi)
        x[i] += (target - current / n) if reduce == "mean" else (target - current) / n
        which[i] = reg
    return x, which
