"""A binding whose import blocks (after creating ``$RLCONFORM_TEST_HANG_MARKER``): an interrupt while the
engine is being loaded, i.e. during start-up. ``$RLCONFORM_TEST_HANG_IN=worker`` blocks only in the
pytest-xdist workers (the controller's probe loads it normally), ``probe`` (default) everywhere."""

import os
import time

if os.environ.get("RLCONFORM_TEST_HANG_IN", "probe") == "probe" or os.environ.get("PYTEST_XDIST_WORKER"):
    marker = os.environ.get("RLCONFORM_TEST_HANG_MARKER")
    if marker:
        open(marker, "a").close()
    time.sleep(3600)

from rlconform.harness.bindings.reference import binding  # noqa: E402,F401
