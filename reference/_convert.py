"""Input conversion shared by the reference modules (private).

The reference API is "NumPy in, NumPy float64 / Python numbers out". Callers may also hand in torch
tensors (any device, any float dtype incl. bfloat16) and anything ``np.asarray`` takes. torch is never
imported here: a tensor is recognised by its attributes (``detach``, ``cpu``) and converted lazily.
"""

from __future__ import annotations

import numpy as np


def is_tensor_like(x) -> bool:
    """True for torch tensors (duck-typed: ``detach``, ``cpu`` and ``numpy`` attributes)."""
    return hasattr(x, "detach") and hasattr(x, "cpu") and hasattr(x, "numpy")


def as_real_array(x, name: str) -> np.ndarray:
    """``x`` as a NumPy array of a real dtype whose values convert exactly to float64.

    No float64 copy is made here (the softmax statistics convert chunk by chunk). torch tensors:
    fp16/fp32/fp64 are viewed without copy (CPU), bf16 is widened to fp32 (exact); bool/int tensors
    keep their dtype. Raises ``TypeError`` for complex, object, string or other non-real dtypes.
    """
    if is_tensor_like(x):
        t = x.detach().cpu()
        if str(t.dtype) in ("torch.bfloat16",) or str(t.dtype).startswith("torch.float8"):
            t = t.float()
        x = t.numpy()
    a = np.asarray(x)
    kind = a.dtype.kind
    if kind in "biuf":
        return a
    # ml_dtypes (bfloat16, float8_*) register as kind 'V'; they widen exactly to float64.
    if "float" in a.dtype.name and kind == "V":
        return a
    raise TypeError(f"{name}: expected a real numeric array, got dtype {a.dtype}")


def as_float64(x, name: str) -> np.ndarray:
    """``x`` as a float64 NumPy array (exact widening for every float dtype; integers exact up to 2**53)."""
    if is_tensor_like(x):
        t = x.detach().cpu()
        if t.is_complex():
            raise TypeError(f"{name}: expected a real tensor, got dtype {t.dtype}")
        return np.asarray(t.double().numpy(), dtype=np.float64)
    return np.asarray(as_real_array(x, name), dtype=np.float64)


def as_mask(mask, shape, name: str = "mask") -> np.ndarray:
    """A boolean mask of exactly ``shape`` (any shape if ``None``) from a bool or 0/1 array/tensor.

    Raises ``ValueError`` if the shape differs or a value is neither 0 nor 1 (weights are not masks).
    """
    if is_tensor_like(mask):
        mask = mask.detach().cpu()
        if str(mask.dtype) == "torch.bfloat16":
            mask = mask.float()
        mask = mask.numpy()
    m = np.asarray(mask)
    if shape is not None and m.shape != tuple(shape):
        raise ValueError(f"{name} has shape {m.shape}, expected {tuple(shape)} (the values' shape)")
    if m.dtype == np.bool_:
        return m
    if m.dtype.kind not in "iuf":
        raise TypeError(f"{name}: expected a bool or 0/1 array, got dtype {m.dtype}")
    bad = (m != 0) & (m != 1)
    if bad.any():
        pos = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"{name} must be bool or 0/1; found {m[pos]!r} at {pos}")
    return m.astype(bool)
