"""A binding whose ``masked_mean`` hangs on fully masked values, after creating the file named by
``$RLCONFORM_TEST_HANG_MARKER`` (so a test knows, without guessing a time, that the engine is hanging)."""

import os
import time

from rlconform.harness.core import faithful as F
from rlconform.harness.catalog.binding import Binding


def masked_mean(values, mask):
    if not mask.any():
        marker = os.environ.get("RLCONFORM_TEST_HANG_MARKER")
        if marker:
            open(marker, "a").close()
        time.sleep(3600)
    return F.masked_mean(values, mask)


binding = Binding(name="hang", ops={"masked_mean": masked_mean, "masked_sum": F.masked_sum})
