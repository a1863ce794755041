"""Conversions between the float64 NumPy arrays of a case and the torch tensors an engine sees.

A case's arrays hold values exactly representable in the case's dtype, so :func:`to_tensor` is exact;
:func:`as_numpy` reads any engine output (tensor, NumPy value, Python number) back as float64.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from rlconform.harness.core.tolerance import MAX

TORCH_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
                "float64": torch.float64}


def to_tensor(a: np.ndarray, dtype: str) -> torch.Tensor:
    """Exact conversion of a float64 array whose values are representable in ``dtype``."""
    return torch.from_numpy(np.array(a, dtype=np.float64)).to(TORCH_DTYPES[dtype])


def as_numpy(x: Any) -> np.ndarray:
    """Any engine output (tensor of any dtype, NumPy value, Python number) as a float64 array."""
    if isinstance(x, torch.Tensor):
        return x.detach().to(torch.float64).cpu().numpy()
    return np.asarray(x, dtype=np.float64)


def out_dtype(x: Any, fallback: str) -> str:
    """The dtype name of a floating tensor ``x``, else ``fallback``."""
    if isinstance(x, torch.Tensor) and x.is_floating_point():
        return str(x.dtype).replace("torch.", "")
    return fallback


def round_to(x: torch.Tensor, dtype: str) -> torch.Tensor:
    """``x`` detached and rounded to ``dtype`` (the yardstick rounded to what the engine returns)."""
    return x.detach().to(TORCH_DTYPES[dtype])


def representable(ref, dtype: str) -> np.ndarray:
    """Where the float64 reference is finite and within the finite range of ``dtype``."""
    r = np.asarray(ref, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        return np.isfinite(r) & (np.abs(r) <= MAX[dtype])
