"""A binding whose ``masked_sum`` is wrong (2×) on every input with more than one element and raises
ValueError on a one-element input: shrinking the discrepancy reaches the crash, so the reported status,
message and reproducer must all describe the same (last, smallest) failing case."""

from rlconform.harness.catalog.binding import Binding
from rlconform.harness.core import faithful as F


def masked_sum(values, mask):
    if values.numel() == 1:
        raise ValueError("one element: crash_when_small")
    return 2 * F.masked_sum(values, mask)


binding = Binding(name="crash_when_small", ops={"masked_sum": masked_sum})
