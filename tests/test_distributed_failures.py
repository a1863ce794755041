"""End to end through ``rlconform check``: one TP rank hangs in one case and another rank is SIGKILLed in
another. Both cases fail within their deadline as crashes carrying every rank's traceback, the rest of
the run completes, the report is written, and no worker process outlives the run."""

from __future__ import annotations

import json
import os
import textwrap
import time
import uuid

import forked_cli
import pytest

pytestmark = pytest.mark.distributed

BINDING = textwrap.dedent('''
    import os, signal, time
    import torch.distributed as dist
    from rlconform.harness.bindings import reference as R
    from rlconform.harness.mutants._base import mutant

    SENTINELS = os.environ["RLCONFORM_TEST_SENTINELS"]

    def _first_time(name):
        """True once per op in the whole run (the first call on rank 0 or 1 claims it)."""
        try:
            fd = os.open(os.path.join(SENTINELS, name), os.O_CREAT | os.O_EXCL)
        except FileExistsError:
            return False
        os.close(fd)
        return True

    def vocab_parallel_entropy(local_logits, group):
        if dist.get_rank(group) == 1 and _first_time("hang"):
            time.sleep(3600)                      # rank 1 hangs; rank 0 blocks in the collective
        return R.vocab_parallel_entropy(local_logits, group)

    def vocab_parallel_sum_pi_squared(local_logits, group):
        if dist.get_rank(group) == 0 and _first_time("kill"):
            os.kill(os.getpid(), signal.SIGKILL)  # rank 0 dies mid-case
        return R.vocab_parallel_sum_pi_squared(local_logits, group)

    binding = mutant("failing_ranks", "a hanging rank and a dying rank",
                     vocab_parallel_entropy=vocab_parallel_entropy,
                     vocab_parallel_sum_pi_squared=vocab_parallel_sum_pi_squared)
''')


def _processes_with(marker: str) -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                if marker.encode() in fh.read():
                    found.append(int(pid))
        except OSError:
            continue
    return found


@pytest.mark.cli
def test_hung_and_killed_ranks_fail_their_cases_and_the_run_completes(tmp_path):
    binding = tmp_path / "failing_ranks.py"
    binding.write_text(BINDING)
    sentinels = tmp_path / "sentinels"
    sentinels.mkdir()
    marker = f"RLCONFORM_TEST_MARKER={uuid.uuid4().hex}"
    deadline = 8.0
    env = dict(os.environ, RLCONFORM_TEST_SENTINELS=str(sentinels), RLCONFORM_DIST_DEADLINE_S=str(deadline),
               RLCONFORM_DIST_COLLECTIVE_TIMEOUT_S="20", RLCONFORM_TEST_MARKER=marker.split("=", 1)[1])
    out = tmp_path / "out"
    t0 = time.monotonic()
    proc = forked_cli.run(["check", "--engine", str(binding), "--op", "vocab_parallel_entropy",
         "--op", "vocab_parallel_sum_pi_squared", "--property", "matches_reference", "--dtype", "float32",
         "--max-examples", "2", "--out", str(out), "-q"],
        env=env, timeout=900)
    elapsed = time.monotonic() - t0
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads((out / "report.json").read_text())
    assert doc["run"]["complete"]
    crashes = {f["op"]: f for f in doc["findings"] if f["status"] == "crash"}
    assert set(crashes) == {"vocab_parallel_entropy", "vocab_parallel_sum_pi_squared"}, doc["summary"]
    hung, died = crashes["vocab_parallel_entropy"], crashes["vocab_parallel_sum_pi_squared"]
    for f in (hung, died):
        assert "--- rank 0 ---" in f["traceback"] and "--- rank 1 ---" in f["traceback"], f["traceback"][-2000:]
    assert "hung" in hung["message"] and "failing_ranks.py" in hung["traceback"]  # the hung frame
    assert "died" in died["message"] and "SIGKILL" in died["traceback"]
    # a rank failure is not shrunk: each replay would respawn the pool (or wait out the deadline)
    assert hung["shrink_steps"] == 0 and died["shrink_steps"] == 0, (hung["shrink_steps"], died["shrink_steps"])
    # the rest of the run completed: every other finding was checked and passes
    others = [f for f in doc["findings"] if f["status"] != "crash"]
    assert others and all(f["status"] == "pass" for f in others)
    # the hung case was ended by its deadline (8 s), not by the collective timeout (20 s); how long the run
    # took is not asserted (a loaded machine is slow, never wrong)
    assert "deadline 8 s" in hung["message"] + hung["traceback"], hung["message"]
    assert elapsed > 0
    time.sleep(1.0)
    assert _processes_with(marker) == [], "worker processes outlived the run"
