"""Where ``mask_invariant`` writes its garbage: a masked position that leaves the clean problem as it is.

A fully valid mask has no masked position. Clearing a valid one (the last token of the last row) changes
the problem: whatever sits there leaves it, and for an outcome reward, which sits on a row's last valid
token, that moves the row's score to a masked position (a card showed −1.0 vs −0.5 in a check
about garbage values). :func:`with_masked_column` appends one masked time step instead, as padding is in
a real batch. Core layer: imports NumPy only.
"""

from __future__ import annotations

from typing import Iterable, Mapping

import numpy as np


def with_masked_column(arrays: Mapping, mask_key: str, time_keys: Iterable[str],
                       fill: Mapping[str, float] | None = None) -> dict:
    """``arrays`` with one masked time step appended when ``arrays[mask_key]`` (bool ``[B, T]``) is all valid.

    The mask gets a column of ``False``; each array named in ``time_keys`` and present (float ``[..., B, T]``,
    time last) gets a column of ``fill.get(key, 0.0)`` (what padding holds, a legal value of the input:
    ``mask_invariant`` then overwrites it with garbage). Other entries
    are kept. A mask with a masked position already, or with no time step, is returned unchanged (a copy of
    the mapping). Raises ValueError when a time array's last dim differs from the mask's.
    """
    out = dict(arrays)
    mask = np.asarray(arrays[mask_key]).astype(bool)
    if mask.size == 0 or not mask.all():
        return out
    t = mask.shape[-1]
    out[mask_key] = np.concatenate([mask, np.zeros(mask.shape[:-1] + (1,), bool)], axis=-1)
    for k in (k for k in time_keys if k in arrays):
        a = np.asarray(arrays[k])
        if a.shape[-1] != t:
            raise ValueError(f"{k}: last dim {a.shape[-1]} is not the mask's time dim {t}")
        pad = np.full(a.shape[:-1] + (1,), (fill or {}).get(k, 0.0), a.dtype)
        out[k] = np.concatenate([a, pad], axis=-1)
    return out
