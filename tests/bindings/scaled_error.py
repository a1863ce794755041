"""A ``masked_sum`` whose float64 error is a chosen multiple of the tolerance's floor, for the margin band: ``RLCONFORM_TEST_ERROR_RATIO`` = r gives an error of r × (64 ulp + 1e-12) at the exact sum —
the float64 reduction tolerance's ULP floor and ATOL (harness/core/tolerance.py), to which the faithful
path adds at most a few ulps, so the example's ratio lies in [r/2, r]: r = 0.1 passes, r = 2 is marginal
(inside 1/2 … 4), r = 40 is a discrepancy."""

import math
import os

import numpy as np
import torch

from rlconform.harness.catalog.binding import Binding

RATIO = float(os.environ.get("RLCONFORM_TEST_ERROR_RATIO", "2"))


def masked_sum(values, mask):
    v = values.detach().double().numpy()[mask.numpy().astype(bool)]
    exact = math.fsum(v.tolist())
    floor = 64 * np.spacing(max(abs(exact), 2.0**-1022)) + 1e-12
    return torch.tensor(exact + RATIO * floor, dtype=values.dtype)


binding = Binding(name="scaled_error", ops={"masked_sum": masked_sum})
