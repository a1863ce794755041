"""A correct ``entropy`` whose refereed check fails on rlconform's side: at import, this binding breaks the
engine's worker's end of the referee's round trip (``rlconform.harness.core.tape.Tape._effects``, which
records what an engine call did to its tensors), the way a harness bug would (e.g. the family code that
once called an engine function outside ``call_engine``: "the engine function X was called outside
call_engine"). The referee's evaluation diverges (``ReplayDiverged``): that is rlconform's own error, so the
finding is ``error`` (exit 2), never the engine's ``crash``. With ``--no-referee`` nothing is recorded and
the op passes."""

from rlconform.harness.catalog.binding import Binding
from rlconform.harness.core import faithful as F
from rlconform.harness.core import tape


def _broken(self, entry):
    raise RuntimeError("imitated harness bug: the worker cannot record the call's effects")


tape.Tape._effects = _broken


def entropy(logits):
    return F.entropy(logits)


binding = Binding(name="referee_diverges", ops={"entropy": entropy})
