"""A hung or dying engine costs one deadline per finding, not one per example or per
shrink step.

* ``check --timeout S``: a finding whose engine hangs ends its worker after S seconds (faulthandler) and
  is a crash saying so, with the engine's stack; the run goes on;
* ``fuzz --timeout S``: the same for one example;
* a distributed case whose ranks died, hung or raised is not shrunk (each replay would respawn the
  worker pool or wait out a deadline): the finding fails on that first case.
"""

from __future__ import annotations

import json
import os

import forked_cli
import numpy as np
import pytest
from hypothesis import strategies as st

BINDINGS = os.path.join(os.path.dirname(__file__), "bindings")
HANG = os.path.join(BINDINGS, "hang.py")


def cli(*args, cwd=None, env=None):
    return forked_cli.run(args, cwd=cwd, timeout=900, env=env)


@pytest.mark.cli
@pytest.mark.slow
def test_a_hung_finding_ends_at_its_deadline_with_the_engines_stack(tmp_path):
    out = tmp_path / "out"
    # the regime that always hangs, and one after it (catalog order) that the run must still check
    proc = cli("check", "--engine", HANG, "--op", "masked_mean", "--property", "matches_reference", "--dtype",
               "float64", "--regime", "all_off", "--regime", "multi_turn", "--max-examples", "2", "--timeout", "5",
               "--out", str(out), "-q")
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    doc = json.loads((out / "report.json").read_text())
    assert doc["run"]["complete"]
    hung = next(f for f in doc["findings"] if f["regime"] == "all_off")
    assert hung["status"] == "crash" and "exceeded the deadline of 5 s" in hung["message"]
    assert "hang.py" in hung["traceback"] and "masked_mean" in hung["traceback"]  # where it hung
    assert hung["examples"] == 1 and hung["reproducer"] is not None
    after = [f for f in doc["findings"] if f["regime"] == "multi_turn"]
    assert after and {f["status"] for f in after} <= {"pass", "crash"}  # and the run went on


@pytest.mark.cli
def test_fuzz_reports_an_example_that_hangs(tmp_path):
    # the first fully masked example hangs, no later one (three findings draw one: three deadlines otherwise)
    env = dict(os.environ, RLCONFORM_TEST_HANG_MARKER=str(tmp_path / "hanging"), RLCONFORM_TEST_HANG_ONCE="1")
    proc = cli("fuzz", "--engine", HANG, "--op", "masked_mean", "--property", "matches_reference", "--dtype",
               "float64", "--max-examples", "2", "--timeout", "20", cwd=tmp_path, env=env)  # an example budget
    # --timeout bounds one engine call (masked_mean on a few elements: milliseconds), not the example: a
    # loaded machine's slow generation or referee round-trip is not counted (below:
    # test_the_fuzz_deadline_counts_engine_calls_only), so 20 s is a thousand times the call
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "exceeded the deadline of 20 s" in proc.stderr and "hang.py" in proc.stderr, proc.stderr[-3000:]
    assert (tmp_path / "hanging").exists() and proc.stderr.count("exceeded the deadline") == 1, proc.stderr[-3000:]


class _State:
    def __init__(self, out):
        from hypothesis import HealthCheck, settings

        self.settings = settings(max_examples=20, database=None, deadline=None, derandomize=True,
                                 suppress_health_check=list(HealthCheck))
        self.corpus, self.seed, self.out, self.xfails, self.inflight = None, None, out, {}, None
        self.binding = type("B", (), {"spec": "fake", "path": None, "resolve": lambda self, op: None})()


def test_a_rank_failure_is_not_shrunk(tmp_path, monkeypatch):
    from rlconform.harness.core.evaluation import EngineCrash
    from rlconform.harness.run.recorder import FindingRecorder
    from rlconform.harness.workers.pool import RankFailure
    from rlconform.properties import runner

    calls = []

    def run_check(binding, case):  # every example "kills a rank"
        calls.append(case)
        try:
            raise RankFailure("died", {0: "killed", 1: "completed"}, [0], 0.1)
        except RankFailure as exc:
            raise EngineCrash("vocab_parallel_entropy", exc) from exc

    state = _State(str(tmp_path))
    fid = ("cp_masked_mean", "matches_reference", "float32", "cp2_padded")
    rec = FindingRecorder(state, ".".join(fid))
    strategy = st.fixed_dictionaries({"values": st.just(np.ones((2, 4))), "n": st.integers(0, 1000)})
    with pytest.raises(EngineCrash):
        runner.run_finding(state.binding, fid, rec, state, strategy, check=run_check)
    assert len(calls) == 1 and rec.examples == 1 and rec.shrink_steps == 0
    assert rec.failing is calls[0]


def test_the_fuzz_deadline_counts_engine_calls_only(tmp_path):
    # set_engine_call_deadline: each engine call gets the deadline; the time between calls (the referee's
    # judgment, hypothesis' generation on a loaded machine) is not the engine's, however long it is
    import subprocess
    import sys

    code = (
        "import sys, time\n"
        "from rlconform.harness.workers import isolated\n"
        "from rlconform.harness.core.evaluation import call_engine\n"
        "isolated._FAULT_FILE[:] = [open(sys.argv[1], 'w', buffering=1)]\n"
        "isolated.set_engine_call_deadline(1.5)\n"
        "for _ in range(3):\n"
        "    call_engine('fast', time.sleep, 0.05)\n"
        "    time.sleep(1.0)\n"
        "print('between calls: 3 s, past the deadline, not ended', flush=True)\n"
        "call_engine('hung', time.sleep, 60)\n"
        "print('the hung call returned')\n")
    fault = tmp_path / "fault.txt"
    proc = subprocess.run([sys.executable, "-c", code, str(fault)], capture_output=True, text=True, timeout=300)
    assert "between calls: 3 s" in proc.stdout and "returned" not in proc.stdout, proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Timeout" in fault.read_text(), fault.read_text()


def test_a_deadline_dump_keeps_every_threads_innermost_frames():
    """fuzz prints a hung child's faulthandler dump: each thread is cut to its most recent frames, never the
    dump's tail, so the engine's thread (where it hangs) stays in view behind a deep hypothesis stack."""
    from rlconform.harness.workers.isolated import brief_stack

    engine = ["Thread 0x00007f01 (most recent call first):", '  File "/x/bindings/hang.py", line 20 in masked_mean',
              '  File "/x/harness/core/tape.py", line 655 in guarded']
    main = ["", "Current thread 0x00007f00 (most recent call first):"] + \
        [f'  File "/x/hypothesis/core.py", line {n} in run' for n in range(200)]
    text = brief_stack("\n".join(engine + main), frames=10)
    assert "hang.py" in text and "tape.py" in text and "Current thread 0x00007f00" in text
    assert text.count("hypothesis/core.py") == 10 and text.splitlines()[-1] == "  ..."
    assert "hang.py" not in "\n".join(engine + main)[-3000:]  # the tail the fuzz CLI printed before
