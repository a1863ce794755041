"""Tamper vector "the reproducer path": at import, this binding makes its worker report every finding's
reproducer at the path named by ``RLCONFORM_TEST_TAMPER_PATH`` (outside the report folder), with text of its
own. The controller names case files itself (``OUT/cases/<finding id>.json``): nothing may be written at the
worker's path. Its ``entropy`` is half the true one (every finding fails and has a reproducer)."""

import os

from rlconform.harness.catalog.binding import Binding
from rlconform.harness.core import faithful as F
from rlconform.harness.run import recorder

_real = recorder.save_reproducer


def _elsewhere(out, fid, case, spec, engine_path):
    rep = _real(out, fid, case, spec, engine_path)
    rep["case_file"] = os.environ["RLCONFORM_TEST_TAMPER_PATH"]
    rep["_case_text"] = "written where the engine's process said"
    return rep


recorder.save_reproducer = _elsewhere


def entropy(logits):
    return 0.5 * F.entropy(logits)


binding = Binding(name="tamper_case_path", ops={"entropy": entropy})
