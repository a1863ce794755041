"""A check of a fork runs the fork's code: a fork of SkyRL 0.4.0 that applies the upstream
sum/count fix of the policy-entropy metric (SkyRL issue #1822, SkyRL issue #1822: workers emit masked sums and
counts, the reducers sum them, the trainer divides once) passes ``metric_pipeline``; 0.4.0 itself, checked
the same way, fails it (a mean of per-shard means).

The fork is built here from the installed package and the small patch below, and checked with
``--engine-path`` in a subprocess. ``mask_invariant`` is left out: the fix keeps SkyRL's ``x * mask``
idiom, so a NaN at a masked position still reaches the sum (a different defect); bf16 / fp64 are left
out: SkyRL's DP all-reduce goes through float32 (``DistributedStrategy.all_reduce``), which a float64
sum does not survive at fp64 tolerance.
"""

from __future__ import annotations

import json

import engine_fork
import forked_cli
import pytest

pytestmark = pytest.mark.engines

#: file (relative to the skyrl package) -> [(0.4.0's text, the fix's text)]; each original occurs once
FIX = {
    "backends/skyrl_train/workers/worker.py": [(
        '                "policy_entropy": entropy.item(),\n',
        '                "policy_entropy_sum": (entropy_BS * loss_mask).sum().item(),\n'
        '                "loss_mask_nnz": float(loss_mask.sum().item()),\n')],
    "backends/skyrl_train/workers/worker_utils.py": [(
        '        elif sum_loss_metrics and (k == "loss" or k.endswith("_loss")) and k not in MEAN_LOSS_METRICS:\n'
        '            reduced_metrics[k] = sum(v)\n',
        '        elif sum_loss_metrics and (k == "loss" or k.endswith("_loss")) and k not in MEAN_LOSS_METRICS:\n'
        '            reduced_metrics[k] = sum(v)\n'
        '        elif k.endswith(("_sum", "_nnz")):\n'
        '            reduced_metrics[k] = sum(v)\n'), (
        '        if sum_loss_metrics and (k == "loss" or k.endswith("_loss")) and k not in MEAN_LOSS_METRICS\n'
        '    }\n',
        '        if sum_loss_metrics and (k == "loss" or k.endswith("_loss")) and k not in MEAN_LOSS_METRICS\n'
        '        or k.endswith(("_sum", "_nnz"))\n'
        '    }\n')],
    "train/utils/trainer_utils.py": [(
        'class ResumeMode(Enum):\n',
        'def finalize_policy_entropy(metrics):\n'
        '    """policy_entropy = policy_entropy_sum / loss_mask_nnz, once, in place."""\n'
        '    if "policy_entropy_sum" in metrics and "loss_mask_nnz" in metrics:\n'
        '        metrics["policy_entropy"] = metrics["policy_entropy_sum"] / max(metrics["loss_mask_nnz"], 1.0)\n'
        '\n\n'
        'class ResumeMode(Enum):\n')],
    "train/trainer.py": [(
        '    finalize_minibatch_rollout_logprob_diff_std,\n',
        '    finalize_minibatch_rollout_logprob_diff_std,\n    finalize_policy_entropy,\n'), (
        '        finalize_minibatch_rollout_logprob_diff_std(reduced_metrics)\n',
        '        finalize_minibatch_rollout_logprob_diff_std(reduced_metrics)\n'
        '        finalize_policy_entropy(reduced_metrics)\n')],
}

PROPERTIES = ("matches_reference", "partition_invariant", "metric_integrity")
#: examples per finding: 0.4.0's mean of shard means fails on the 3rd, and the examples are derandomized
#: and never follow the engine's output, so the fork passes the very examples 0.4.0 fails (were its own
#: code not run, it would fail as 0.4.0 does); 8 leave a margin. No shrinking: it only sizes the reproducer,
#: never a status (harness/core/profiles.py), and it was 100 of 0.4.0's engine calls
EXAMPLES = 8


def _fork(root) -> str:
    source = engine_fork.package_dir("skyrl", "bash install/engines.sh .venv/bin/python skyrl")
    return engine_fork.fork(root, "skyrl", source, FIX)


def _check(out, *extra):
    args = ["check", "--engine", "skyrl", "--op", "metric_pipeline",
            "--dtype", "float32", "--max-examples", str(EXAMPLES), "--max-shrinks", "0", "--out", str(out), "-q",
            *extra]
    for prop in PROPERTIES:
        args += ["--property", prop]
    return forked_cli.run(args, timeout=1200)


def _statuses(out) -> dict:
    doc = json.loads((out / "report.json").read_text())
    return {f["property"]: f["status"] for f in doc["findings"] if f["op"] == "metric_pipeline"}


@pytest.mark.cli
def test_the_fork_with_the_sum_count_fix_passes_and_040_fails(tmp_path):
    fork = _fork(tmp_path / "skyrl-fork")

    forked = _check(tmp_path / "fork", "--engine-path", fork)
    assert forked.returncode == 0, forked.stdout[-3000:] + forked.stderr[-3000:]
    assert _statuses(tmp_path / "fork") == dict.fromkeys(PROPERTIES, "pass")
    assert json.loads((tmp_path / "fork" / "report.json").read_text())["engine"]["path"] == fork

    installed = _check(tmp_path / "installed")
    assert installed.returncode == 1, installed.stdout[-3000:] + installed.stderr[-3000:]
    statuses = _statuses(tmp_path / "installed")
    assert statuses["matches_reference"] == statuses["partition_invariant"] == "discrepancy", statuses
    assert statuses["metric_integrity"] == "pass", statuses
