"""A binding whose import blocks (after creating ``$RLCONFORM_TEST_HANG_MARKER``): an interrupt while the
engine is being loaded, i.e. during start-up."""

import os
import time

marker = os.environ.get("RLCONFORM_TEST_HANG_MARKER")
if marker:
    open(marker, "a").close()
time.sleep(3600)

from rlconform.harness.bindings.reference import binding  # noqa: E402,F401
