"""Where a batch's valid tokens sit in each row: the layout an engine's callers give a response mask.

verl pads responses on the right (valid tokens first); SkyRL left-pads prompt + response and right-aligns
the response-level tensors (``skyrl/train/dataset/preprocess.py``: "Response tokens occupy the trailing
response_len positions", ``response_mask = col >= max_response - response_len``). A recursion over time
(GAE, REINFORCE++'s discounted returns) carried through masked positions is exact on one layout and not on
another, so a binding declares its callers' layout (:class:`~rlconform.harness.core.declared.Declared`
``mask_layout``) and the family draws its masks in it, moving each row's data with its mask.
"""

from __future__ import annotations

from typing import Iterable, Mapping

import numpy as np

#: the layouts a binding may declare: ``right_aligned`` — each row's valid tokens are its last ones, in order
LAYOUTS = ("right_aligned",)


def right_aligned(arrays: Mapping, mask_key: str, time_keys: Iterable[str]) -> dict:
    """``arrays`` with each row of ``arrays[mask_key]`` (bool ``[B, T]``) right-aligned: the row's valid
    positions, in their order, move to its end and its masked positions (in their order) to its start; every
    array named in ``time_keys`` and present (``[..., B, T]``, time last) is permuted with its row, so a value
    stays at the token it was drawn for (the outcome reward on the last valid token stays there). Other entries
    are kept. Raises ValueError when a time array's last two dims are not the mask's."""
    out = dict(arrays)
    mask = np.asarray(arrays[mask_key]).astype(bool)
    if mask.ndim != 2 or mask.size == 0:
        return out
    # a stable sort on "valid": masked positions first, then valid ones, each in their order
    order = np.argsort(mask, axis=-1, kind="stable")
    out[mask_key] = np.take_along_axis(mask, order, axis=-1)
    for k in (k for k in time_keys if k in arrays):
        a = np.asarray(arrays[k])
        if a.shape[-2:] != mask.shape:
            raise ValueError(f"{k}: shape {a.shape} does not end with the mask's {mask.shape}")
        out[k] = np.take_along_axis(a, np.broadcast_to(order, a.shape), axis=-1)
    return out


def apply(layout: str, arrays: Mapping, mask_key: str, time_keys: Iterable[str]) -> dict:
    """``arrays`` in ``layout`` (one of :data:`LAYOUTS`; ``""``: unchanged). Raises ValueError on another."""
    if not layout:
        return dict(arrays)
    if layout == "right_aligned":
        return right_aligned(arrays, mask_key, time_keys)
    raise ValueError(f"unknown mask layout {layout!r} (one of {', '.join(LAYOUTS)})")
