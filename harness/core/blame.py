"""Whose exception is it: the engine's, or rlconform's own yardstick's.

An exception raised while a case is checked, other than by the engine's own call (that is an
:class:`~rlconform.harness.core.evaluation.EngineCrash`), is decided by where it was raised:

* in the code that reads what the engine returned (a family module unpacking, converting or shaping the
  engine's output): the engine broke its output contract (type, shape, dtype) — the engine's crash;
* in rlconform's yardstick — the float64 reference, the dtype-faithful path, the tolerance policy, the
  comparison and the property judgments (:data:`YARDSTICK`): rlconform's own error. Whatever the engine
  returned (±inf, NaN, huge values, empty tensors) is data those judge; if they raise on it anyway, the
  finding is ``error`` (exit 2), never the engine's crash.

The decision reads the traceback's frames (their modules), never the exception's text.
"""

from __future__ import annotations

import traceback

__all__ = ["YARDSTICK", "OwnCodeRaised", "own_code_raised"]

#: modules of rlconform's yardstick (module name prefixes)
YARDSTICK = ("rlconform.reference", "rlconform.harness.core.faithful", "rlconform.harness.core.tolerance",
             "rlconform.properties.generic", "rlconform.properties.checks")


class OwnCodeRaised(Exception):
    """rlconform's yardstick raised while judging a case: status ``error`` (rlconform's, not the engine's),
    never shrunk. ``where``: ``module:function:line`` of the yardstick frame that raised."""

    def __init__(self, where: str, error: str):
        self.where, self.error = where, error
        super().__init__(f"rlconform's own code raised while judging what the engine returned (rlconform's "
                         f"error, not the engine's): {error} at {where}")


def own_code_raised(exc: BaseException) -> str | None:
    """``module:function:line`` of the deepest frame of rlconform's code in ``exc``'s traceback when that frame
    is in the yardstick (:data:`YARDSTICK`), else None (the engine's, or a frame that reads its output)."""
    deepest = None
    for frame, line in traceback.walk_tb(exc.__traceback__):
        module = frame.f_globals.get("__name__", "")
        if isinstance(module, str) and module.startswith("rlconform."):
            deepest = (module, frame.f_code.co_name, line)
    if deepest is None or not deepest[0].startswith(YARDSTICK):
        return None
    return "{}:{}:{}".format(*deepest)
