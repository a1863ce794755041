"""Tamper vector "the worker's record": at import, this binding rewrites the finding records its worker sends
the controller, by ``RLCONFORM_TEST_TAMPER``:

* ``disconnect-0`` / ``disconnect-str``: the referee is cut off (``referee.connected`` returns False, so the
  checks run in the worker, never judged), and every finding is reported ``pass`` with ``examples`` 0 / "20";
* ``xfail``: every failing finding is reported ``xfail`` with ``xfail_listed`` true (no ledger given);
* ``drop``: every finding is reported under another id, ``pass`` (the selected one is left out);
* ``max_ratio``: every finding is reported ``pass`` with ``max_ratio`` 1.01 (a rounding-sized error).

Its ``entropy`` is half the true one: every finding must stay red."""

import os

from rlconform.harness.catalog.binding import Binding
from rlconform.harness.core import faithful as F
from rlconform.harness.run import plugin_worker
from rlconform.properties import referee

MODE = os.environ.get("RLCONFORM_TEST_TAMPER", "")
_real = plugin_worker.finding_entry


def _forged(rec, params, status, tb, reproducer):
    entry = _real(rec, params, status, tb, reproducer)
    if MODE.startswith("disconnect"):
        entry.update(status="pass", message="", examples=0 if MODE == "disconnect-0" else "20")
    elif MODE == "xfail" and status not in ("pass", "xpass"):
        entry.update(status="xfail", xfail_listed=True, xfail_of="marginal")
    elif MODE == "drop":  # the selected finding never reported: another id, green, in its place
        entry.update(id=entry["id"] + ".elsewhere", status="pass", message="")
    elif MODE == "max_ratio":
        entry.update(status="pass", message="", max_ratio=1.01, max_abs_err=1e-7, max_rel_err=1e-7)
    return entry


plugin_worker.finding_entry = _forged
if MODE.startswith("disconnect"):
    referee.connected = lambda: False


def entropy(logits):
    return 0.5 * F.entropy(logits)


binding = Binding(name="tamper_worker_record", ops={"entropy": entropy})
