"""A binding written for another version of its engine: three ops, three different failures.

* ``masked_sum``: the adapter passes a keyword the engine function does not take (``dp_size``, as a binding
  of a newer verl calls an older ``agg_loss``): a TypeError raised at the adapter's call, its frame
  innermost -> ``binding_error``, not ``crash``.
* ``masked_mean``: the adapter imports a module this engine version does not have: the op is ``unavailable``
  and the other ops are still checked.
* ``masked_max``: the engine's own code raises TypeError (a torch function called wrongly inside the
  engine: the innermost Python frame is not the adapter's) -> ``crash``.
"""

from rlconform.harness.catalog.binding import Binding, Lazy
from rlconform.harness.core import faithful as F


def engine_masked_sum(values, mask):
    """The installed "engine" function: no ``dp_size`` keyword."""
    return F.masked_sum(values, mask)


def _masked_sum():
    def masked_sum(values, mask):
        return engine_masked_sum(values, mask, dp_size=1)

    return masked_sum


def _masked_mean():
    import rlconform_no_such_engine.utils.metric as metric  # noqa: F401 - absent in this version

    return metric.masked_mean


def _masked_max():
    import torch.nn.functional as nnf

    def masked_max(values, mask):
        return nnf.softmax(values, dim="last")  # TypeError raised inside torch's own Python frame

    return masked_max


binding = Binding(name="adapter_mismatch", version="0.1.0", ops={
    "masked_sum": Lazy(loader=_masked_sum), "masked_mean": Lazy(loader=_masked_mean),
    "masked_max": Lazy(loader=_masked_max)})
