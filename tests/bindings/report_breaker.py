"""A binding that, on its first call, turns the run's ``report.json`` into a folder (path in
``$RLCONFORM_TEST_REPORT``): the report can no longer be written, a harness-side failure that must end the
run with exit code 2 and a message, never a traceback or a crash blamed on the engine."""

import os

from rlconform.harness.catalog.binding import Binding
from rlconform.harness.core import faithful as F


def masked_sum(values, mask):
    path = os.environ["RLCONFORM_TEST_REPORT"]
    if not os.path.isdir(path):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        os.mkdir(path)
    return F.masked_sum(values, mask)


binding = Binding(name="report_breaker", ops={"masked_sum": masked_sum})
