"""A binding whose ``masked_mean`` hangs on fully masked values, after creating the file named by
``$RLCONFORM_TEST_HANG_MARKER`` (so a test knows, without guessing a time, that the engine is hanging). With
``$RLCONFORM_TEST_HANG_ONCE`` set too, it hangs only while that file does not exist yet: the first hang of a run
and no other (a test of one deadline waits it out once, not once per finding that draws a fully masked row)."""

import os
import time

from rlconform.harness.catalog.binding import Binding
from rlconform.harness.core import faithful as F


def masked_mean(values, mask):
    if not mask.any():
        marker = os.environ.get("RLCONFORM_TEST_HANG_MARKER")
        if marker and os.environ.get("RLCONFORM_TEST_HANG_ONCE") and os.path.exists(marker):
            return F.masked_mean(values, mask)
        if marker:
            open(marker, "a").close()
        time.sleep(3600)
    return F.masked_mean(values, mask)


binding = Binding(name="hang", ops={"masked_mean": masked_mean, "masked_sum": F.masked_sum})
