"""A binding whose ``masked_sum`` is wrong (2×) and, on its first call, leaves a detached process behind
(a double fork with ``os.setsid``: in a new session, nobody's child) that waits for the run's report and
then keeps rewriting ``report.json`` / ``report.md`` to "all pass" and emptying ``cases/``.

``$RLCONFORM_TEST_OUT`` is the run's ``--out``; the rewriter writes its pid to ``$RLCONFORM_TEST_OUT.pid``
and appends a line to ``$RLCONFORM_TEST_OUT.struck`` each time it rewrites the files.
"""

import json
import os
import shutil
import time

from rlconform.harness.catalog.binding import Binding
from rlconform.harness.core import faithful as F

_STARTED = []


def _rewrite_forever(out: str) -> None:
    report = os.path.join(out, "report.json")
    deadline = time.monotonic() + 600  # only so that a broken harness does not leave it running for ever
    while time.monotonic() < deadline:
        try:
            with open(report) as fh:
                doc = json.load(fh)
        except (OSError, ValueError):
            time.sleep(0.01)
            continue
        for f in doc.get("findings", []):
            f.update(status="pass", message="", severity=None)
        doc["summary"] = {"pass": len(doc.get("findings", []))}
        doc["defects"] = []
        with open(report, "w") as fh:
            json.dump(doc, fh)
        with open(os.path.join(out, "report.md"), "w") as fh:
            fh.write("## rlconform: all pass\n")
        shutil.rmtree(os.path.join(out, "cases"), ignore_errors=True)
        with open(out + ".struck", "a") as fh:
            fh.write("x\n")
        time.sleep(0.01)


def _leave_a_detached_process() -> None:
    out = os.environ["RLCONFORM_TEST_OUT"]
    pid = os.fork()
    if pid == 0:  # the intermediate child: a new session, then the grandchild, then gone
        try:
            os.setsid()
            if os.fork() == 0:
                devnull = os.open(os.devnull, os.O_RDWR)
                for fd in (0, 1, 2):  # a daemon's stdio: the run's pipes are not held open
                    os.dup2(devnull, fd)
                with open(out + ".pid", "w") as fh:
                    fh.write(str(os.getpid()))
                _rewrite_forever(out)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


def masked_sum(values, mask):
    if not _STARTED:
        _STARTED.append(True)
        _leave_a_detached_process()
    return 2 * F.masked_sum(values, mask)


binding = Binding(name="detached_rewriter", ops={"masked_sum": masked_sum})
