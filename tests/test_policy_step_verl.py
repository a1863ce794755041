"""verl's policy step is checked through verl's own code: a fork of the installed verl with a wiring mutant
applied as a source edit (``--engine-path``) turns quantities red that the installed verl gets right.

Two wiring mutants of the step, each a one-line edit a pull request could make:

* **temperature twice**: ``FSDPEngineWithLMHead.prepare_model_outputs`` divides the logits by the temperature
  again after ``_scale_logits_by_temperature`` (both the old and the current log-probs move);
* **micro-batch normaliser**: ``losses.ppo_loss`` takes ``batch_num_tokens`` from the micro-batch's own response
  mask instead of the mini-batch's count that ``forward_backward_batch`` all-reduced;
* **train batch as the global batch**: ``RayPPOTrainer._update_actor`` hands ``agg_loss`` the train batch's size as
  ``global_batch_size`` instead of ``ppo_mini_batch_size``: with several mini-batches each one's seq-mean loss is
  divided by every row of the batch.

The installed verl 0.9.1 passes ``policy_step.matches_reference`` (its old log-probs and parameter gradient, judged
in-process; its ``pg_clipfrac`` / ``ppo_kl`` metrics, a mean of per-micro-batch means, fail ``policy_step_metrics``).
Each fork, checked by the CLI as a user checks a fork, must fail it with a clause on the quantity the mutant moves.

Pinned: with rollout rejection (``rollout_rs``) and ``loss_agg_mode=seq-mean-token-mean``, verl 0.9.1's step divides
the loss by ``ppo_mini_batch_size`` (``_update_actor`` hands it to ``agg_loss`` as ``global_batch_size``), which
counts the rows the rejection removed: the gradient is the exact one times kept rows / rows. Its token-mean
normaliser is counted after the rejection (``forward_backward_batch`` sums the rewritten loss mask) and is right.
The GSPO loss (``policy_loss.loss_mode="gspo"``) gives the exact gradient under every cut; its seq-mean divisor counts
a row with no valid token the same way. The token mask (``rollout_rs="token_k1"``) rewrites the response mask before
the update: the gradient, entropy bonus included, is the exact one (the kept tokens counted) under every cut.
"""

from __future__ import annotations

import json

import engine_fork
import forked_cli
import pytest

pytestmark = pytest.mark.engines

TEMPERATURE_TWICE = {"workers/engine/fsdp/transformer_impl.py": [(
    "                logits_rmpad = _scale_logits_by_temperature(\n"
    "                    logits_rmpad,\n"
    "                    temperature_rmpad.unsqueeze(-1),\n"
    "                    is_unit_temperature=temperature_is_one,\n"
    "                )\n",
    "                logits_rmpad = _scale_logits_by_temperature(\n"
    "                    logits_rmpad,\n"
    "                    temperature_rmpad.unsqueeze(-1),\n"
    "                    is_unit_temperature=temperature_is_one,\n"
    "                )\n"
    "                logits_rmpad = logits_rmpad / temperature_rmpad.unsqueeze(-1)\n")]}
MICRO_NORMALISER = {"workers/utils/losses.py": [(
    '    config.global_batch_info["batch_num_tokens"] = data["batch_num_tokens"]\n',
    '    config.global_batch_info["batch_num_tokens"] = data["response_mask"].sum().item()\n')]}
TRAIN_BATCH_AS_GLOBAL = {"trainer/ppo/ray_trainer.py": [(
    "            distillation_only=distillation_only,\n"
    "            global_batch_size=ppo_mini_batch_size,\n",
    "            distillation_only=distillation_only,\n"
    "            global_batch_size=len(batch),\n")]}
#: examples per run: the draws put a temperature ≠ 1 and an uneven micro-batch split in the first few
EXAMPLES = 8


def _verl_dir() -> str:
    return engine_fork.package_dir("verl", "bash install/engines.sh .venv/bin/python verl")


def _fork(root, edits) -> str:
    return engine_fork.fork(root, "verl", _verl_dir(), edits)


def _failing_labels(out, *extra, regime: str = "token-mean") -> list[str]:
    args = ["check", "--engine", "verl", "--op", "policy_step",
            "--property", "matches_reference", "--regime", f"{regime}@trainer_batches",
            "--max-examples", str(EXAMPLES), "--max-shrinks", "0", "--out", str(out), "-q", *extra]
    done = forked_cli.run(args, timeout=1200)
    assert done.returncode in (0, 1), done.stdout[-3000:] + done.stderr[-3000:]
    (finding,) = [f for f in json.loads((out / "report.json").read_text())["findings"] if f["op"] == "policy_step"]
    return [c.get("label", "") for c in (finding.get("failure") or {}).get("clauses", [])]


def test_the_installed_verls_step_matches_the_exact_step():
    """The baseline of the wiring mutants below: verl 0.9.1's old log-probs and parameter gradient match the exact
    step on the examples the mutants' runs draw (token-mean, whole mini-batch and its splits), judged in-process."""
    from hypothesis import given, settings

    from rlconform.harness.bindings.load import load_engine
    from rlconform.harness.families import policy_step as S
    from rlconform.properties import generic

    _verl_dir()
    verl = load_engine("verl")

    class Case:
        inputs, property, dtype, op, regime = None, "matches_reference", "float32", S.STEP_OP, f"token-mean@{S.DATA}"

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True)
    @given(S.inputs("token-mean"))
    def check(inp):
        case = Case()
        case.inputs = inp
        ev = S.evaluate(verl, case)
        several = S.mini_batches(inp)  # the mini-batch run: both parameters again at each of its steps
        assert not ev.problems and len(ev.gradients) == 2 + (2 * several if several > 1 else 0)
        outcome = generic.matches_reference(ev)
        assert outcome.ok, outcome

    check()


@pytest.mark.cli
def test_wiring_mutants_of_verls_step_turn_its_core_quantities_red(tmp_path):
    twice = _failing_labels(tmp_path / "twice", "--engine-path", _fork(tmp_path / "verl-twice", TEMPERATURE_TWICE))
    assert any(label.startswith("old log-probs") for label in twice), twice

    micro = _failing_labels(tmp_path / "micro", "--engine-path", _fork(tmp_path / "verl-micro", MICRO_NORMALISER))
    assert any(label.startswith("gradient of") for label in micro), micro

    whole = _failing_labels(tmp_path / "whole", "--engine-path", _fork(tmp_path / "verl-whole", TRAIN_BATCH_AS_GLOBAL),
                            regime="seq-mean-token-mean")
    assert whole and all(label.startswith("gradient of") and "(mini-batch " in label for label in whole), whole


def test_a_change_to_verls_worker_or_engine_code_selects_the_step():
    """``--changed-since`` maps a change to the step's findings through every function of the step the
    binding runs (each compiled method keeps its class's qualname, so a site names it as the diff does)."""
    _verl_dir()
    from rlconform.harness.bindings.load import load_engine
    from rlconform.harness.catalog.engine_site import op_sites

    sites = op_sites(load_engine("verl"))["policy_step"]
    named = {f"{s['file']}:{s['function']}" for prefix in sites.values() for s in prefix}
    for expected in ("verl/workers/utils/losses.py:ppo_loss",
                     "verl/trainer/ppo/ray_trainer.py:RayPPOTrainer._update_actor",
                     "verl/trainer/ppo/ray_trainer.py:RayPPOTrainer._compute_old_log_prob",
                     "verl/workers/engine_workers.py:TrainingWorker.train_mini_batch",
                     "verl/workers/engine/fsdp/transformer_impl.py:FSDPEngine.forward_backward_batch",
                     "verl/workers/engine/fsdp/transformer_impl.py:FSDPEngineWithLMHead.prepare_model_outputs",
                     "verl/trainer/ppo/rollout_corr_helper.py:compute_rollout_correction_and_add_to_batch"):
        assert expected in named, sorted(named)


def test_verls_seq_mean_normaliser_counts_the_rejected_rows():
    import numpy as np
    from step_cases import find

    import rlconform.reference as R
    from rlconform.harness.bindings.load import load_engine
    from rlconform.harness.families import policy_step as S

    _verl_dir()
    step = load_engine("verl").resolve("policy_step")
    for variant in ("seq-mean-token-mean-with-rejection", "token-mean-with-rejection"):
        inp = find(S.inputs(variant), lambda i: len(i["input_ids"]) == 4)
        rc = S.variant_knobs(inp)
        ref = R.policy_step(*(inp[k].astype(np.float32) for k in ("embed", "head", "old_embed", "old_head")),
                            inp["input_ids"], inp["response_mask"], inp["advantages"],
                            temperature=float(np.float32(inp["temperature"])), loss_agg_mode=inp["mode"],
                            entropy_coeff=inp["entropy_coeff"], **S.CLIP, rollout_log_probs=inp["rollout_log_probs"],
                            rejection=rc["rejection"])
        kept_rows = int(ref["kept_mask"].any(1).sum())
        assert 0 < kept_rows < 4
        grad = S.run_step(step, inp, 4)["grads"]["head.weight"].double().numpy()
        scale = kept_rows / 4 if variant.startswith("seq-mean") else 1.0
        np.testing.assert_allclose(grad, ref["grad_head"] * scale, rtol=1e-4, atol=1e-6)


def test_verls_kl_loss_tempers_the_reference_path_too():
    """verl's reference log-probs go through the same engine path as the old ones, with the batch's temperature:
    with the reference model equal to the policy the KL loss is 0 at any temperature, and the step's gradient with
    a KL loss is the exact one."""
    import numpy as np
    from step_cases import find

    import rlconform.reference as R
    from rlconform.harness.bindings.load import load_engine
    from rlconform.harness.families import policy_step as S

    _verl_dir()
    step = load_engine("verl").resolve("policy_step")
    inp = dict(find(S.inputs("token-mean-with-kl"), lambda i: True), temperature=0.7)
    rows = len(inp["input_ids"])
    same = dict(inp, ref_embed=inp["embed"], ref_head=inp["head"])
    assert abs(S.run_step(step, same, rows)["metrics"]["kl_loss"]) < 1e-6
    ref = R.policy_step(*(inp[k].astype(np.float32) for k in ("embed", "head", "old_embed", "old_head")),
                        inp["input_ids"], inp["response_mask"], inp["advantages"], temperature=0.7, **S.CLIP,
                        ref_embed=inp["ref_embed"].astype(np.float32), ref_head=inp["ref_head"].astype(np.float32),
                        **S.KL)
    grad = S.run_step(step, inp, rows)["grads"]["head.weight"].double().numpy()
    np.testing.assert_allclose(grad, ref["grad_head"], rtol=1e-4, atol=1e-6)


def test_verls_dynamic_batch_size_gives_the_exact_gradient():
    """``use_dynamic_bsz`` (micro-batches by token budget, rows rearranged by ``rearrange_micro_batches``) gives the
    same parameter gradient as the exact step: the normaliser is the mini-batch's whatever the packing."""
    import numpy as np
    from step_cases import find

    import rlconform.reference as R
    from rlconform.harness.bindings.load import load_engine
    from rlconform.harness.families import policy_step as S

    _verl_dir()
    step = load_engine("verl").resolve("policy_step")
    inp = dict(find(S.inputs("token-mean"), lambda i: len(i["input_ids"]) == 4), temperature=0.7)
    ref = R.policy_step(*(inp[k].astype(np.float32) for k in ("embed", "head", "old_embed", "old_head")),
                        inp["input_ids"], inp["response_mask"], inp["advantages"], temperature=0.7, **S.CLIP)
    for budget in inp["token_budgets"]:
        out = S.run_step(step, inp, 4, token_budget=budget)
        np.testing.assert_allclose(out["grads"]["head.weight"].double().numpy(), ref["grad_head"], rtol=1e-4,
                                   atol=1e-6)
        np.testing.assert_allclose(out["old_log_probs"].double().numpy()[inp["response_mask"].astype(bool)],
                                   ref["old_log_probs"][inp["response_mask"].astype(bool)], rtol=1e-4, atol=1e-6)


def test_verls_importance_weight_diagnostics_are_exact_under_any_split():
    """fit logs ``rollout_corr/rollout_is_*`` from ``compute_rollout_correction_and_add_to_batch``, once over the
    whole batch: the mean / min / max of the capped weights and the fraction of raw ratios above the cap are the
    exact ones whatever the micro-batch size."""
    import numpy as np
    from step_cases import find

    import rlconform.reference as R
    from rlconform.harness.bindings.load import load_engine
    from rlconform.harness.families import policy_step as S

    _verl_dir()
    step = load_engine("verl").resolve("policy_step")
    inp = find(S.inputs("token-mean-with-tis"), lambda i: len(i["input_ids"]) == 4)
    ref = R.policy_step(*(inp[k].astype(np.float32) for k in ("embed", "head", "old_embed", "old_head")),
                        inp["input_ids"], inp["response_mask"], inp["advantages"],
                        temperature=float(np.float32(inp["temperature"])), **S.CLIP,
                        rollout_log_probs=inp["rollout_log_probs"], rollout_is="token", rollout_is_cap=S.IS_CAP)
    for micro in (4, 1):
        got = S.run_step(step, inp, micro)["metrics"]
        for name in ("rollout_is_mean", "rollout_is_min", "rollout_is_max", "rollout_is_fraction_high"):
            assert got[name] == pytest.approx(ref["metrics"][name], rel=1e-5, abs=1e-7), (micro, name)


RANK_LOCAL_COUNT = ("        torch.distributed.all_reduce(\n"
                    "            batch_num_tokens, op=torch.distributed.ReduceOp.SUM, group=self.get_data_parallel_group()\n"
                    "        )\n")


def _step_from(monkeypatch, edited_impl=None):
    """verl's step built from the installed source, or with ``transformer_impl.py`` replaced by ``edited_impl``."""
    from rlconform.harness.bindings import source, verl_step
    from rlconform.harness.bindings import verl as vb

    monkeypatch.setattr(source, "_CACHE", {})
    if edited_impl is not None:
        real = source.module_file
        monkeypatch.setattr(source, "module_file",
                            lambda m: edited_impl if m == verl_step.FSDP_IMPL else real(m))
    return verl_step.policy_step(vb._one_rank_group, vb.ACTOR_CONFIG, vb.POLICY_LOSS_CONFIG)


def test_verls_step_on_two_dp_ranks_gives_the_one_rank_gradient_and_a_rank_local_count_does_not(monkeypatch,
                                                                                              tmp_path):
    """DP 2 as threads of one process: verl's own update on each half, its token count all-reduced over the DP
    group, the ranks' gradients averaged, equals the one-rank step; the same code with the all-reduce removed (each
    rank normalises by its own tokens) moves the gradient when the ranks hold different token counts."""
    import numpy as np
    from step_cases import find

    from rlconform.harness.bindings import source, verl_step
    from rlconform.harness.families import policy_step as S

    _verl_dir()
    inp = find(S.inputs("token-mean"), lambda i: len(i["input_ids"]) == 4 and
               np.asarray(i["response_mask"])[:2].sum() != np.asarray(i["response_mask"])[2:].sum())

    def grads(step, **kw):
        return S.run_step(step, inp, **kw)["grads"]["head.weight"].double().numpy()

    step = _step_from(monkeypatch)
    assert step.dp_sizes == (1, 2)
    np.testing.assert_allclose(grads(step, micro_batch_size=2, dp_size=2), grads(step, micro_batch_size=4),
                               rtol=1e-5, atol=1e-7)
    text = source.module_file(verl_step.FSDP_IMPL).read_text()
    assert text.count(RANK_LOCAL_COUNT) == 1, "verl's forward_backward_batch changed: re-read this test"
    edited = tmp_path / "transformer_impl.py"
    edited.write_text(text.replace(RANK_LOCAL_COUNT, ""))
    local = _step_from(monkeypatch, edited)
    one, two = grads(local, micro_batch_size=4), grads(local, micro_batch_size=2, dp_size=2)
    assert np.abs(one - two).max() > 1e-3 * np.abs(one).max()


def test_verls_sequence_tis_is_exact_and_its_row_statistics_count_a_row_with_no_valid_token():
    """``rollout_is="sequence"``: the gradient is the exact step's (one capped weight per row), ``rollout_is_mean``
    is the capped weights' token mean and the min / max are the raw sequence ratios' (declared:
    ``sequence_is_extremes_of_raw_ratios``). But ``compute_is_metrics`` takes the fraction above the cap as
    ``exceeds_upper.float().mean()`` over every row's log-ratio sum: a row with no valid token (sum 0, ratio 1)
    counts in the denominator."""
    import numpy as np
    from step_cases import find

    import rlconform.reference as R
    from rlconform.harness.bindings.load import load_engine
    from rlconform.harness.families import policy_step as S

    _verl_dir()
    step = load_engine("verl").resolve("policy_step")
    inp = find(S.inputs("token-mean-with-seq-tis"),
               lambda i: len(i["input_ids"]) == 3 and not i["response_mask"].any(1).all())
    ref = R.policy_step(*(inp[k].astype(np.float32) for k in ("embed", "head", "old_embed", "old_head")),
                        inp["input_ids"], inp["response_mask"], inp["advantages"],
                        temperature=float(np.float32(inp["temperature"])), entropy_coeff=inp["entropy_coeff"],
                        **S.CLIP, rollout_log_probs=inp["rollout_log_probs"], rollout_is="sequence_product",
                        rollout_is_cap=S.SEQ_IS_CAP, is_extreme_weights="raw")
    out = S.run_step(step, inp, 3)
    np.testing.assert_allclose(out["grads"]["head.weight"].double().numpy(), ref["grad_head"], rtol=1e-4, atol=1e-6)
    got = out["metrics"]
    for name in ("rollout_is_mean", "rollout_is_max"):
        assert got[name] == pytest.approx(ref["metrics"][name], rel=1e-5), name
    live, rows = int(inp["response_mask"].any(1).sum()), len(inp["input_ids"])
    high = ref["metrics"]["rollout_is_fraction_high"]
    assert 0 < high < 1 and got["rollout_is_fraction_high"] == pytest.approx(high * live / rows, rel=1e-6)


def test_verls_gspo_step_is_exact_under_any_split_and_its_seq_mean_counts_a_row_with_no_valid_token():
    """``policy_loss.loss_mode="gspo"`` with ``loss_agg_mode=seq-mean-token-mean``: each row's ratio (the mean
    log-ratio over its valid tokens) is computed inside the micro-batch loop, and the gradient is the exact step's
    whatever the cut (rows, DP ranks). A row with no valid token (an aborted request's empty response) still counts
    in ``global_batch_size = ppo_mini_batch_size``, agg_loss's seq-mean divisor: the gradient is the exact one times
    rows with a valid token / rows (agg_loss's known row)."""
    import numpy as np
    import step_cases

    from rlconform.harness.bindings.load import load_engine
    from rlconform.harness.families import policy_step as S

    _verl_dir()
    step = load_engine("verl").resolve("policy_step")
    full, empty = step_cases.gspo_cases()
    step_cases.assert_exact_under_every_split(step, full, step_cases.exact(full, policy_loss_variant="gspo"))
    live, rows = int(empty["response_mask"].any(1).sum()), len(empty["input_ids"])
    grad = S.run_step(step, empty, 3)["grads"]["head.weight"].double().numpy()
    np.testing.assert_allclose(grad, step_cases.exact(empty, policy_loss_variant="gspo")["grad_head"] * live / rows,
                               rtol=1e-4, atol=1e-6)


def test_verls_token_mask_is_exact_under_any_split():
    """``rollout_rs="token_k1"``, ``rollout_rs_threshold="0.5_2"``, no IS weight: ``compute_rollout_rejection_mask``
    zeroes each token whose ratio π_old/π_rollout is outside the band in ``response_mask`` before the update, so the
    token count, the policy loss and the entropy bonus all read the kept tokens: the gradient is the exact step's
    whatever the cut (rows, DP ranks), with a row the mask empties and one it only thins."""
    import step_cases

    from rlconform.harness.bindings.load import load_engine
    from rlconform.harness.families import policy_step as S

    _verl_dir()
    step = load_engine("verl").resolve("policy_step")
    inp = step_cases.token_mask_case()
    ref = step_cases.exact(inp, entropy_coeff=inp["entropy_coeff"], rollout_log_probs=inp["rollout_log_probs"],
                           rejection=S.TOKEN_MASK)
    step_cases.assert_exact_under_every_split(step, inp, ref)


def test_verls_step_cut_into_mini_batches_gives_each_mini_batchs_exact_gradient(monkeypatch, tmp_path):
    """``ppo_mini_batch_size`` below the batch: ``train_mini_batch`` cuts the batch in order, and each optimizer step
    records the exact gradient of its own rows (its token count from ``forward_backward_batch``, its
    ``global_batch_size`` from ``_update_actor``), whatever the micro-batch size; the actor's metrics are the mean
    over the mini-batches (declared: ``actor_metrics_mean_over_mini_batches``). The same code with the train
    batch's size as ``global_batch_size`` divides each mini-batch's seq-mean loss by every row of the batch."""
    import numpy as np
    import step_cases

    from rlconform.harness.bindings import source, verl_step
    from rlconform.harness.families import policy_step as S

    _verl_dir()
    step = _step_from(monkeypatch)
    assert step.mini_batches
    for mode in ("token-mean", "seq-mean-token-mean"):
        inp = dict(step_cases.find(S.inputs(mode), lambda i: len(i["input_ids"]) == 4), entropy_coeff=0.01)
        ref = step_cases.exact(inp, entropy_coeff=0.01, mini_batches=2,
                               mini_batch_mean_metrics=("pg_loss", "entropy_loss"))
        for micro in (2, 1):
            out = S.run_step(step, inp, micro, mini_batch_count=2)
            step_cases.assert_mini_batches_exact(out, ref, f"{mode}, micro {micro}")
            for name in ("pg_loss", "entropy_loss"):
                assert out["metrics"][name] == pytest.approx(ref["metrics"][name], rel=1e-4, abs=1e-6), name
    trainer = source.module_file(verl_step.TRAINER)
    (old, new), = TRAIN_BATCH_AS_GLOBAL["trainer/ppo/ray_trainer.py"]
    edited = tmp_path / "ray_trainer.py"
    edited.write_text(trainer.read_text().replace(old, new))
    real = source.module_file
    monkeypatch.setattr(source, "_CACHE", {})
    monkeypatch.setattr(source, "module_file", lambda m: edited if m == verl_step.TRAINER else real(m))
    from rlconform.harness.bindings import verl as vb

    whole = verl_step.policy_step(vb._one_rank_group, vb.ACTOR_CONFIG, vb.POLICY_LOSS_CONFIG)
    inp = dict(step_cases.find(S.inputs("seq-mean-token-mean"), lambda i: len(i["input_ids"]) == 4),
               entropy_coeff=0.0)
    ref = step_cases.exact(inp, mini_batches=2)
    for got, exact in zip(S.run_step(whole, inp, 2, mini_batch_count=2)["grads"], ref["steps"]):  # each halved
        np.testing.assert_allclose(got["head.weight"].double().numpy(), exact["grad_head"] / 2, rtol=1e-4, atol=1e-6)


def test_verls_mean_over_mini_batches_cites_the_installed_lines():
    """The convention's cited lines: ``train_mini_batch`` appends each mini-batch's metrics and ``fit`` averages the
    list (a moved or changed line fails here: re-read the declaration against the new source)."""
    from rlconform.harness.bindings.load import load_engine
    from rlconform.harness.core.declared import read_source

    _verl_dir()
    d = next(d for d in load_engine("verl").declared if d.name == "actor_metrics_mean_over_mini_batches")
    path, _, line = d.source.rpartition(":")
    assert "append_to_dict(metrics, output)" in read_source(path).splitlines()[int(line) - 1]
    trainer = read_source("verl/trainer/ppo/ray_trainer.py").splitlines()
    assert 'reduce_metrics(actor_output.meta_info["metrics"])' in trainer[1718 - 1]
