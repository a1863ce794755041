"""SkyRL's policy step, checked through SkyRL's own trainer and worker code: its entropy bonus is pinned.

SkyRL 0.4.0's ``PolicyWorkerBase._forward_backward_micro`` adds the entropy bonus per micro-batch as
``masked_mean(entropy, loss_mask) · entropy_loss_coef``, weighted by the micro-batch's share of *rows*
(``microbatch_weight = len(microbatch) / len(data)``), while the policy loss is pre-scaled over the whole mini-batch
(``apply_loss_reduction_to_advantages_minibatch``). So the gradient of the entropy bonus depends on how the
mini-batch is cut into micro-batches whenever rows hold different numbers of tokens: with rows of 2 and 1 tokens
cut into micro-batches of one row, the bonus weights each token of the short row twice as much as a token of the
long one. The old log-probs and the policy-loss gradient agree with the exact step.
"""

from __future__ import annotations

import importlib.util
import json

import forked_cli
import pytest

pytestmark = pytest.mark.engines


def _check(out, prop: str):
    if importlib.util.find_spec("skyrl") is None:
        pytest.skip("SkyRL is not installed (bash install/engines.sh .venv/bin/python skyrl)")
    args = ["check", "--engine", "skyrl", "--op", "policy_step",
            "--property", prop, "--regime", "token-mean@trainer_batches", "--out", str(out), "-q"]
    done = forked_cli.run(args, timeout=1200)
    assert done.returncode in (0, 1), done.stdout[-3000:] + done.stderr[-3000:]
    (finding,) = [f for f in json.loads((out / "report.json").read_text())["findings"] if f["op"] == "policy_step"]
    return finding


@pytest.mark.cli
def test_skyrls_entropy_bonus_gradient_depends_on_the_micro_batch_split(tmp_path):
    finding = _check(tmp_path / "split", "partition_invariant")
    assert finding["status"] == "discrepancy", finding
    clauses = finding["failure"]["clauses"]
    assert clauses and all(c["quantity"] == "gradient" for c in clauses), clauses
    # the shrunk example needs the entropy bonus and uneven rows
    assert "entropy_coeff 0.01" in clauses[0]["label"], clauses[0]["label"]
