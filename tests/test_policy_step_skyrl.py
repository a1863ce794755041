"""SkyRL's policy step, checked through SkyRL's own trainer and worker code: its entropy bonus is pinned.

SkyRL 0.4.0's ``PolicyWorkerBase._forward_backward_micro`` adds the entropy bonus per micro-batch as
``masked_mean(entropy, loss_mask) · entropy_loss_coef``, weighted by the micro-batch's share of *rows*
(``microbatch_weight = len(microbatch) / len(data)``), while the policy loss is pre-scaled over the whole mini-batch
(``apply_loss_reduction_to_advantages_minibatch``). So the gradient of the entropy bonus depends on how the
mini-batch is cut into micro-batches whenever rows hold different numbers of tokens: with rows of 2 and 1 tokens
cut into micro-batches of one row, the bonus weights each token of the short row twice as much as a token of the
long one. The old log-probs and the policy-loss gradient agree with the exact step.

Also pinned: with off-policy correction's row mask (``sequence_mask_metric="geometric"``) the rejection happens
inside the policy loss of each micro-batch (``apply_off_policy_correction`` rewrites ``loss_mask`` there), after
``_normalize_advantages`` has divided the advantages by the token count of the unmasked mini-batch: under
``token_mean`` the gradient is the kept-token one times kept tokens / tokens. SkyRL documents this (a masked token
contributes zero gradient, the others are unaffected): the binding declares it (``off_policy_mask_keeps_normaliser``)
and the reference follows it. Token TIS with no rejection agrees with the exact step. And its KL loss compares the policy at the
sampling temperature with a reference model at temperature 1 (``RefWorkerBase._forward_micro_batch``).
The GSPO loss (``policy_loss_type="gspo"``) gives the exact gradient under every cut; ``sequence_mean`` counts a row
with no valid token in its divisor. The token mask (``token_mask_is_threshold_low`` / ``_high``) is applied like the row
mask: inside the policy loss, the normaliser counting the masked tokens as declared, while the entropy bonus still
reads the loss mask from before it. Cut into several mini-batches (``policy_mini_batch_size``), each optimizer step
gives the exact gradient of its own rows: ``_normalize_advantages`` pre-scales each mini-batch by its own count.
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


def test_skyrls_token_mean_normaliser_counts_the_masked_rows_tokens_as_declared():
    if importlib.util.find_spec("skyrl") is None:
        pytest.skip("SkyRL is not installed (bash install/engines.sh .venv/bin/python skyrl)")
    import numpy as np
    from step_cases import find

    import rlconform.reference as R
    from rlconform.harness.bindings.load import load_engine
    from rlconform.harness.families import policy_step as S

    step = load_engine("skyrl").resolve("policy_step")
    for variant in ("token-mean-with-rejection", "token-mean-with-tis"):
        inp = find(S.inputs(variant), lambda i: len(i["input_ids"]) == 4)
        inp = dict(inp, entropy_coeff=0.0)  # the entropy bonus has its own (pinned) micro-batch weighting
        rc = S.variant_knobs(inp)
        ref = R.policy_step(*(inp[k].astype(np.float32) for k in ("embed", "head", "old_embed", "old_head")),
                            inp["input_ids"], inp["response_mask"], inp["advantages"],
                            temperature=float(np.float32(inp["temperature"])), loss_agg_mode=inp["mode"],
                            **S.CLIP, rollout_log_probs=inp["rollout_log_probs"], rollout_is=rc.get("is_level"),
                            rollout_is_cap=rc.get("is_cap"), rejection=rc.get("rejection", ()))
        mask = inp["response_mask"].astype(bool)
        kept = ref["kept_mask"].sum() / mask.sum()
        assert (0 < kept < 1) if rc.get("rejection") else kept == 1
        grad = S.run_step(step, inp, 4)["grads"]["head.weight"].double().numpy()
        np.testing.assert_allclose(grad, ref["grad_head"] * kept, rtol=1e-4, atol=1e-6)
        declared = R.policy_step(*(inp[k].astype(np.float32) for k in ("embed", "head", "old_embed", "old_head")),
                                 inp["input_ids"], inp["response_mask"], inp["advantages"],
                                 temperature=float(np.float32(inp["temperature"])), loss_agg_mode=inp["mode"],
                                 **S.CLIP, rollout_log_probs=inp["rollout_log_probs"], rollout_is=rc.get("is_level"),
                                 rollout_is_cap=rc.get("is_cap"), rejection=rc.get("rejection", ()),
                                 rejection_normaliser="batch")
        np.testing.assert_allclose(grad, declared["grad_head"], rtol=1e-4, atol=1e-6)


def test_skyrls_kl_loss_compares_a_tempered_policy_with_an_untempered_reference():
    """``RefWorkerBase._forward_micro_batch`` computes the reference log-probs at temperature 1 (unless sample-support
    replay is on), the policy's at ``algorithm.temperature``: with the reference model equal to the policy, the KL
    loss is 0 only at temperature 1."""
    if importlib.util.find_spec("skyrl") is None:
        pytest.skip("SkyRL is not installed (bash install/engines.sh .venv/bin/python skyrl)")
    from step_cases import find

    from rlconform.harness.bindings.load import load_engine
    from rlconform.harness.families import policy_step as S

    step = load_engine("skyrl").resolve("policy_step")
    inp = find(S.inputs("token-mean-with-kl"), lambda i: True)
    same = dict(inp, ref_embed=inp["embed"], ref_head=inp["head"])
    kl = {T: S.run_step(step, dict(same, temperature=T), len(inp["input_ids"]))["metrics"]["kl_loss"]
          for T in (1.0, 0.7)}
    assert abs(kl[1.0]) < 1e-6, kl
    assert kl[0.7] > 1e-3, kl


def test_skyrls_is_ratio_min_is_taken_over_the_masked_zeros():
    """``compute_off_policy_correction`` logs ``is_ratio_min = (is_ratio * loss_mask).min()``: every padding or
    observation token contributes a 0, so the logged minimum of the importance ratio is 0 on any trainer batch;
    its ``is_ratio_max`` and the clip fraction (over one micro-batch) are the exact ones."""
    if importlib.util.find_spec("skyrl") is None:
        pytest.skip("SkyRL is not installed (bash install/engines.sh .venv/bin/python skyrl)")
    import numpy as np
    from step_cases import find

    import rlconform.reference as R
    from rlconform.harness.bindings.load import load_engine
    from rlconform.harness.families import policy_step as S

    step = load_engine("skyrl").resolve("policy_step")
    inp = find(S.inputs("token-mean-with-tis"), lambda i: not i["response_mask"].all())
    ref = R.policy_step(*(inp[k].astype(np.float32) for k in ("embed", "head", "old_embed", "old_head")),
                        inp["input_ids"], inp["response_mask"], inp["advantages"],
                        temperature=float(np.float32(inp["temperature"])), **S.CLIP,
                        rollout_log_probs=inp["rollout_log_probs"], rollout_is="token", rollout_is_cap=S.IS_CAP,
                        is_metric_weights="raw")["metrics"]
    got = S.run_step(step, inp, len(inp["input_ids"]))["metrics"]
    assert got["rollout_is_min"] == 0.0 < ref["rollout_is_min"]
    for name in ("rollout_is_max", "rollout_is_fraction_high", "rollout_is_mean"):
        assert got[name] == pytest.approx(ref[name], rel=1e-5, abs=1e-7), name


def test_skyrls_step_on_two_dp_ranks_keeps_the_policy_gradient_and_averages_the_entropy_bonus_over_ranks():
    """DP 2 as threads of one process (SkyRL's own staging, ``forward_backward`` per rank and metric all-reduce):
    the policy-loss gradient is the one-rank step's (``grad_sum_correction_factor = dp_size`` undoes FSDP's mean over
    the pre-scaled sums), while the entropy bonus, "averaged across microbatches and DP workers", weighs each rank's
    token mean equally: ranks of unequal token counts move its gradient, as micro-batches do."""
    if importlib.util.find_spec("skyrl") is None:
        pytest.skip("SkyRL is not installed (bash install/engines.sh .venv/bin/python skyrl)")
    import numpy as np
    from step_cases import find

    from rlconform.harness.bindings.load import load_engine
    from rlconform.harness.families import policy_step as S

    step = load_engine("skyrl").resolve("policy_step")
    assert 2 in step.dp_sizes
    inp = find(S.inputs("token-mean"), lambda i: len(i["input_ids"]) == 4 and
               np.asarray(i["response_mask"])[:2].sum() != np.asarray(i["response_mask"])[2:].sum())

    def gap(entropy_coeff):
        case = dict(inp, entropy_coeff=entropy_coeff)
        one = S.run_step(step, case, 4)["grads"]["head.weight"].double().numpy()
        two = S.run_step(step, case, 2, dp_size=2)["grads"]["head.weight"].double().numpy()
        return np.abs(one - two).max() / np.abs(one).max()

    assert gap(0.0) < 1e-5
    assert gap(0.1) > 1e-3


def test_skyrls_sequence_tis_counts_a_row_with_no_valid_token_and_leaks_a_masked_nan_into_the_rows_weight():
    """``tis_ratio_type="sequence"``: the gradient is the exact step's (one capped weight per row); but
    ``compute_tis_ratio`` logs ``tis_seq_clip_high_ratio`` as the capped rows over ``seq_tis_ratio.shape[0]``, every
    row (one with no valid token too), and sums the row's log-ratios as ``token_tis_log_ratio * loss_mask``: a NaN
    rollout log-prob at a masked position (advantages clean) makes the row's weight, the loss and the gradient NaN."""
    if importlib.util.find_spec("skyrl") is None:
        pytest.skip("SkyRL is not installed (bash install/engines.sh .venv/bin/python skyrl)")
    import numpy as np
    from step_cases import find

    import rlconform.reference as R
    from rlconform.harness.bindings.load import load_engine
    from rlconform.harness.families import policy_step as S

    step = load_engine("skyrl").resolve("policy_step")
    inp = find(S.inputs("token-mean-with-seq-tis"),
               lambda i: len(i["input_ids"]) == 3 and not i["response_mask"].any(1).all())
    inp = dict(inp, entropy_coeff=0.0)  # the entropy bonus has its own (pinned) micro-batch weighting
    ref = R.policy_step(*(inp[k].astype(np.float32) for k in ("embed", "head", "old_embed", "old_head")),
                        inp["input_ids"], inp["response_mask"], inp["advantages"],
                        temperature=float(np.float32(inp["temperature"])), **S.CLIP,
                        rollout_log_probs=inp["rollout_log_probs"], rollout_is="sequence_product",
                        rollout_is_cap=S.SEQ_IS_CAP)
    out = S.run_step(step, inp, 3)
    np.testing.assert_allclose(out["grads"]["head.weight"].double().numpy(), ref["grad_head"], rtol=1e-4, atol=1e-6)
    live, rows = int(inp["response_mask"].any(1).sum()), len(inp["input_ids"])
    high = ref["metrics"]["rollout_is_fraction_high"]
    assert 0 < high < 1 and out["metrics"]["rollout_is_fraction_high"] == pytest.approx(high * live / rows, rel=1e-6)
    mask = inp["response_mask"].astype(bool)
    dirty = np.where(mask, inp["rollout_log_probs"], np.float32(np.nan)).astype(np.float32)
    grad = S.run_step(step, inp, 3, rollout_log_probs=dirty)["grads"]["head.weight"]
    assert not grad.isfinite().all()


def test_skyrls_gspo_step_is_exact_under_any_split_and_its_sequence_mean_counts_a_row_with_no_valid_token():
    """``policy_loss_type="gspo"`` with ``loss_reduction="sequence_mean"``: each row's ratio (``masked_mean`` of its
    log-ratios) is computed inside the micro-batch loop, and the gradient is the exact step's whatever the cut
    (rows, DP ranks). A row with no valid token (an overlong-filtered response) still counts in
    ``apply_loss_reduction_to_advantages_minibatch``'s ``batch_size``: the gradient and the logged ``policy_loss``
    are the exact ones times rows with a valid token / rows (that function's known row)."""
    if importlib.util.find_spec("skyrl") is None:
        pytest.skip("SkyRL is not installed (bash install/engines.sh .venv/bin/python skyrl)")
    import numpy as np
    import step_cases

    from rlconform.harness.bindings.load import load_engine
    from rlconform.harness.families import policy_step as S

    step = load_engine("skyrl").resolve("policy_step")
    full, empty = step_cases.gspo_cases()
    step_cases.assert_exact_under_every_split(step, full, step_cases.exact(full, policy_loss_variant="gspo"))
    live, rows = int(empty["response_mask"].any(1).sum()), len(empty["input_ids"])
    ref = step_cases.exact(empty, policy_loss_variant="gspo")
    out = S.run_step(step, empty, 3)
    np.testing.assert_allclose(out["grads"]["head.weight"].double().numpy(), ref["grad_head"] * live / rows,
                               rtol=1e-4, atol=1e-6)
    assert out["metrics"]["pg_loss"] == pytest.approx(ref["metrics"]["pg_loss"] * live / rows, rel=1e-5)


def test_skyrls_token_mask_keeps_the_normaliser_and_leaves_the_entropy_bonus_on_the_masked_tokens():
    """``compute_token_mask`` multiplies the loss mask inside the policy loss of each micro-batch, after
    ``_normalize_advantages`` divided the advantages by the unmasked token count: without the entropy bonus the
    gradient is the declared step's (``rejection_normaliser="batch"``) whatever the cut. ``_forward_backward_micro``'s
    entropy bonus reads ``loss_mask`` from before the correction: on one micro-batch the gradient with the bonus is
    the masked step's plus the bonus over every valid token, the masked ones included (that function's known row)."""
    if importlib.util.find_spec("skyrl") is None:
        pytest.skip("SkyRL is not installed (bash install/engines.sh .venv/bin/python skyrl)")
    import numpy as np
    import step_cases

    from rlconform.harness.bindings.load import load_engine
    from rlconform.harness.families import policy_step as S

    step = load_engine("skyrl").resolve("policy_step")
    inp = step_cases.token_mask_case()
    plain = dict(inp, entropy_coeff=0.0)
    ref = step_cases.exact(plain, rollout_log_probs=inp["rollout_log_probs"], rejection=S.TOKEN_MASK,
                           rejection_normaliser="batch")
    step_cases.assert_exact_under_every_split(step, plain, ref)
    # the bonus alone, over the response mask before the token mask: the exact step with zero advantages
    bonus = step_cases.exact(dict(inp, advantages=np.zeros_like(inp["advantages"])),
                             entropy_coeff=inp["entropy_coeff"])["grad_head"]
    grad = S.run_step(step, inp, 4)["grads"]["head.weight"].double().numpy()
    np.testing.assert_allclose(grad, ref["grad_head"] + bonus, rtol=1e-4, atol=1e-6)
    kept = step_cases.exact(inp, entropy_coeff=inp["entropy_coeff"], rollout_log_probs=inp["rollout_log_probs"],
                            rejection=S.TOKEN_MASK, rejection_normaliser="batch")["grad_head"]
    assert not np.allclose(grad, kept, rtol=1e-4, atol=1e-6)  # the masked tokens' share of the bonus shows


def test_skyrls_step_cut_into_mini_batches_gives_each_mini_batchs_exact_gradient():
    """``policy_mini_batch_size`` below the batch: the trainer's boundaries (``compute_prompt_mini_batch_boundaries``)
    cut the batch in order, ``_normalize_advantages`` pre-scales each mini-batch's advantages by its own token count
    (or rows), and each ``optim_step`` records the exact gradient of its own rows (no entropy bonus: its micro-batch
    weighting has its own row); the logged policy loss and clip ratio are the means over the mini-batches
    (declared: ``metrics_mean_over_mini_batches``)."""
    if importlib.util.find_spec("skyrl") is None:
        pytest.skip("SkyRL is not installed (bash install/engines.sh .venv/bin/python skyrl)")
    import step_cases

    from rlconform.harness.bindings.load import load_engine
    from rlconform.harness.families import policy_step as S

    step = load_engine("skyrl").resolve("policy_step")
    assert step.mini_batches
    for mode in ("token-mean", "seq-mean-token-mean"):
        inp = dict(step_cases.find(S.inputs(mode), lambda i: len(i["input_ids"]) == 6), entropy_coeff=0.0)
        ref = step_cases.exact(inp, mini_batches=3, mini_batch_mean_metrics=("pg_loss", "pg_clipfrac"))
        for micro in (2, 1):
            out = S.run_step(step, inp, micro, mini_batch_count=3)
            step_cases.assert_mini_batches_exact(out, ref, f"{mode}, micro {micro}")
        assert out["metrics"]["pg_loss"] == pytest.approx(ref["metrics"]["pg_loss"], rel=1e-4, abs=1e-6)


def test_skyrls_mean_over_mini_batches_cites_the_installed_line():
    """The convention's cited line: ``_execute_training_step`` reduces ``all_metrics``, one entry per mini-batch, with
    ``reduce_metrics`` (a moved or changed line fails here)."""
    if importlib.util.find_spec("skyrl") is None:
        pytest.skip("SkyRL is not installed (bash install/engines.sh .venv/bin/python skyrl)")
    from rlconform.harness.bindings.load import load_engine
    from rlconform.harness.core.declared import read_source

    d = next(d for d in load_engine("skyrl").declared if d.name == "metrics_mean_over_mini_batches")
    path, _, line = d.source.rpartition(":")
    assert "reduce_metrics(all_metrics, sum_loss_metrics=False)" in read_source(path).splitlines()[int(line) - 1]
