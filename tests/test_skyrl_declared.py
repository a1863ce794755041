"""SkyRL's declared guards and conventions: masked_var's ValueError on ≤ 1 valid token, reached
through masked_whiten, GAE and reinforce++'s batch whitening, is a guard exactly where SkyRL's code reaches it
with ≤ 1 valid token; cross_entropy's plain masked sum is a convention (its callers pre-scale the loss mask).
Each test fails when SkyRL stops behaving as declared, or when the declaration covers more than SkyRL does."""

from __future__ import annotations

import dataclasses
import importlib.util

import numpy as np
import pytest

from rlconform.harness.catalog.binding import Binding, Variants
from rlconform.harness.core.declared import matching_guard, read_source
from rlconform.harness.core.evaluation import EngineCrash
from rlconform.properties.case import Case
from rlconform.properties.checks import run_check

pytestmark = pytest.mark.skipif(importlib.util.find_spec("skyrl") is None, reason="SkyRL not installed")

ONE = "The sum of the mask is one, which can cause a division by zero."
NONE = "At least one element in the mask has to be 1."
GUARDS = ("masked_var_le_one_token", "masked_whiten_le_one_token", "gae_whiten_le_one_token",
          "batch_whiten_le_one_token")


@pytest.fixture(scope="module")
def skyrl():
    from rlconform.harness.bindings.load import load_engine

    return load_engine("skyrl")


def _declared(skyrl, name):
    return next(d for d in skyrl.declared if d.name == name)


def _line(path_line: str) -> str:
    path, _, line = path_line.rpartition(":")
    text = read_source(path)
    assert text is not None, path
    return text.splitlines()[int(line) - 1]


# ------------------------------------------------------------------------------------------ sources
@pytest.mark.engines
@pytest.mark.parametrize("name, text", [
    ("masked_var_le_one_token", 'raise ValueError("The sum of the mask is one'),
    ("masked_whiten_le_one_token", "masked_var(values, mask)"),
    ("gae_whiten_le_one_token", "masked_whiten(advantages, response_mask)"),
    ("batch_whiten_le_one_token", "masked_whiten(returns, response_mask)"),
    ("cross_entropy_weighted_sum", "reduce_loss(elementwise_loss, loss_mask)"),
])
def test_skyrl_declared_items_cite_the_installed_line(skyrl, name, text):
    """The cited ``path:line`` of the installed SkyRL holds the declared behaviour (a moved or changed line
    fails here: the declaration must be re-read against the new source)."""
    d = _declared(skyrl, name)
    assert d.source.startswith("skyrl/backends/skyrl_train/utils/ppo_utils.py:")
    assert text in _line(d.source), (d.source, _line(d.source))


def test_skyrl_cross_entropy_callers_pre_scale_the_loss_mask():
    """The convention's evidence: cross_entropy documents a plain sum and its callers normalise the mask
    (the worker's SFT branch points at the collator, the collator divides by the batch's valid tokens). A
    SkyRL whose collator stops pre-scaling (the raw sum then no longer intended) fails here."""
    ppo = read_source("skyrl/backends/skyrl_train/utils/ppo_utils.py").splitlines()
    assert "summed over all tokens" in ppo[1071 - 1] and "simple sum" in ppo[1072 - 1]
    worker = read_source("skyrl/backends/skyrl_train/workers/worker.py").splitlines()
    assert 'resolved_loss_name == "cross_entropy"' in worker[1154 - 1]
    assert "pre-scaled to achieve the correct reduction" in worker[1155 - 1] and "DefaultCollator" in worker[1156 - 1]
    collators = read_source("skyrl/train/dataset/collators.py").splitlines()
    assert "total_nonpad = max(batch[\"loss_mask\"].sum().item(), 1)" in collators[63 - 1]
    assert 'batch["loss_mask"] = batch["loss_mask"].float() / total_nonpad' in collators[64 - 1]


# ------------------------------------------------------------------------------------- the guards
def _whiten_case(mask, prop="matches_reference"):
    mask = np.asarray(mask, bool)
    return Case("masked_whiten", prop, "float32", "padded",
                {"values": np.arange(mask.size, dtype=np.float64).reshape(mask.shape) * 0.25 + 0.5, "mask": mask,
                 "shift_mean": True, "garbage": float("nan")})


def _gae_case(mask, prop="matches_reference"):
    mask = np.asarray(mask, bool)
    return Case("gae", prop, "float32", "padded",
                {"token_level_rewards": np.where(mask, 0.5, 0.0), "values": np.full(mask.shape, -0.25),
                 "response_mask": mask, "gamma": 1.0, "lam": 1.0, "garbage": float("nan")})


def _adv_case(mask, index, variant="reinforce_plus_plus", prop="matches_reference"):
    mask = np.asarray(mask, bool)
    rewards = np.zeros(mask.shape)
    for i, row in enumerate(mask):
        if row.any():
            rewards[i, np.flatnonzero(row)[-1]] = 1.0 - 0.25 * i
    return Case("outcome_advantage", prop, "float32", f"{variant}@singleton_groups",
                {"token_level_rewards": rewards, "response_mask": mask, "index": np.asarray(index),
                 "garbage": float("nan")})


def _bare(skyrl):
    return dataclasses.replace(skyrl, declared=())


@pytest.mark.engines
@pytest.mark.parametrize("prop", ["matches_reference", "mask_invariant", "non_destructive",
                                  "finite_where_reference_finite"])
def test_skyrl_masked_whiten_guard_holds_on_le_one_token_only(skyrl, prop):
    for mask, message in (([[True, False, False]], ONE), ([[False, False, False]], NONE)):
        out = run_check(skyrl, _whiten_case(mask, prop))
        assert out.ok and out.declared == "masked_whiten_le_one_token", out.message
        with pytest.raises(EngineCrash, match=message):  # undeclared: SkyRL's raise stays a crash
            run_check(_bare(skyrl), _whiten_case(mask, prop))
    two = run_check(skyrl, _whiten_case([[True, True, False]], prop))  # two tokens: SkyRL whitens, compared
    assert two.declared is None and (two.ok or prop == "mask_invariant"), two.message  # NaN garbage leaks: a defect


@pytest.mark.engines
@pytest.mark.parametrize("prop", ["matches_reference", "mask_invariant", "non_destructive"])
def test_skyrl_gae_guard_holds_on_a_batch_of_le_one_token_only(skyrl, prop):
    """SkyRL's GAE whitens over the whole batch: one valid token in the batch (across rows) raises, one valid
    token in each of two rows does not."""
    out = run_check(skyrl, _gae_case([[False, True], [False, False]], prop))
    assert out.ok and out.declared == "gae_whiten_le_one_token", out.message
    with pytest.raises(EngineCrash, match="The sum of the mask is one"):
        run_check(_bare(skyrl), _gae_case([[False, True], [False, False]], prop))
    two = run_check(skyrl, _gae_case([[False, True], [True, False]], prop))
    # no guard: compared, in the trainer's mask layout (the declared precondition it honours)
    assert two.declared == "response_mask_right_aligned" and (two.ok or prop == "mask_invariant"), two.message


@pytest.mark.engines
def test_skyrl_reinforce_pp_guard_is_the_batch_not_the_group(skyrl):
    """reinforce++ whitens the batch, not each group: a batch of two one-sample groups with one valid token
    each (two in the batch) is whitened and compared; one valid token in the whole batch raises, also when
    that sample shares its group with another (so 'a group of one sample' is not the trigger)."""
    singletons = _adv_case([[False, True], [False, True]], [0, 1])
    out = run_check(skyrl, singletons)
    assert out.ok and out.declared == "response_mask_right_aligned", out.message  # no guard: compared
    for case in (_adv_case([[False, True]], [0]), _adv_case([[False, True], [False, False]], [0, 0])):
        out = run_check(skyrl, case)
        assert out.ok and out.declared == "batch_whiten_le_one_token", out.message
        with pytest.raises(EngineCrash, match="The sum of the mask is one"):
            run_check(_bare(skyrl), case)


@pytest.mark.engines
def test_skyrl_whitening_guards_cover_nothing_else(skyrl):
    """The same ValueError where SkyRL's code would not raise it (two or more valid tokens, an estimator that
    never whitens, the biased variance) is not covered: it stays a crash."""
    def raising(*args, **kwargs):
        raise ValueError(ONE)

    engine = Binding("e", ops={"masked_whiten": raising, "gae": raising,
                               "outcome_advantage": Variants({"grpo": raising, "reinforce_plus_plus": raising})},
                     declared=skyrl.declared)
    for case in (_whiten_case([[True, True, False]]), _gae_case([[True, True], [False, False]]),
                 _adv_case([[False, True], [False, True]], [0, 0]),
                 _adv_case([[False, True]], [0], variant="grpo")):  # grpo never whitens: not declared for it
        with pytest.raises(EngineCrash, match="The sum of the mask is one"):
            run_check(engine, case)
    var = Case("masked_var", "matches_reference", "float32", "padded",
               {"values": np.array([[0.5, 1.0]]), "mask": np.array([[True, False]]), "unbiased": True})
    assert matching_guard(skyrl.declared, var, "ValueError", ONE).name == "masked_var_le_one_token"
    assert matching_guard(skyrl.declared, dataclasses.replace(var, inputs={**var.inputs, "unbiased": False}),
                          "ValueError", ONE) is None
    two = dataclasses.replace(var, inputs={**var.inputs, "mask": np.array([[True, True]])})
    assert matching_guard(skyrl.declared, two, "ValueError", ONE) is None
    # mask_invariant clears the last bit of an all-valid mask: two valid tokens become one
    assert matching_guard(skyrl.declared, dataclasses.replace(two, property="mask_invariant"), "ValueError",
                          ONE).name == "masked_var_le_one_token"
    assert matching_guard(skyrl.declared, var, "ValueError", "some other message") is None


@pytest.mark.engines
def test_skyrl_masked_var_raises_exactly_where_declared(skyrl):
    """The guard's trigger is SkyRL's: its masked_var raises the declared errors on 0 and 1 valid tokens of an
    unbiased variance, and nowhere else."""
    import torch

    fn = skyrl.resolve("masked_var")
    v = torch.tensor([[0.5, 1.0, 2.0]])
    guard = _declared(skyrl, "masked_var_le_one_token")
    for bits, message in (([0, 0, 0], NONE), ([0, 1, 0], ONE)):
        with pytest.raises(ValueError, match=guard.match):
            fn(v, torch.tensor([bits], dtype=torch.bool), True)
    fn(v, torch.tensor([[1, 1, 0]], dtype=torch.bool), True)  # two tokens: a variance
    fn(v, torch.tensor([[0, 1, 0]], dtype=torch.bool), False)  # biased: defined on one token


# -------------------------------------------------------------------------- the cross_entropy sum
def _ce_case(prop="matches_reference", dtype="float64"):
    """Rows of 1 and 3 valid tokens: the masked sum (4 tokens) and the token mean differ by 4×."""
    rng = np.random.default_rng(7)
    mask = np.array([[True, False, False], [True, True, True]])
    old = rng.uniform(-2.0, -0.5, mask.shape)
    lp = old + rng.uniform(-0.3, 0.3, mask.shape)
    return Case("policy_loss", prop, dtype, "cross_entropy@moderate",
                {"old_log_prob": old, "log_prob": np.minimum(lp, -1e-3), "advantages": rng.standard_normal(mask.shape),
                 "mask": mask, "partitions": [[[0, 2]], [[0, 1], [1, 2]]], "garbage": float("nan"),
                 "variant": "cross_entropy"})


@pytest.mark.engines
def test_skyrl_cross_entropy_is_compared_with_the_declared_sum(skyrl):
    """Declared: cross_entropy sums −log π over the mask (the reference aggregates token-sum) and passes;
    compared with the catalog's token-mean, as before the declaration, it fails by the token count."""
    conv = _declared(skyrl, "cross_entropy_weighted_sum")
    assert conv.kind == "convention" and conv.variants == ("cross_entropy",)
    losses = skyrl.resolve("policy_loss")
    assert losses.agg_modes == {"cross_entropy": "token-sum"}
    for prop in ("matches_reference", "partition_invariant"):
        out = run_check(skyrl, _ce_case(prop))
        assert out.ok, out.message
    undeclared = Binding("skyrl", ops={"policy_loss": dataclasses.replace(losses, agg_modes={})})
    out = run_check(undeclared, _ce_case())
    assert not out.ok and "loss" in out.message


@pytest.mark.engines
def test_a_cross_entropy_that_stops_summing_fails_under_the_declaration(skyrl):
    """An engine that normalised cross_entropy itself (a token mean over its call) no longer follows the
    declared convention: it fails."""
    import torch

    losses = skyrl.resolve("policy_loss")
    real = losses.impls["cross_entropy"]

    def token_mean(old_log_prob, log_prob, advantages, response_mask, info):
        loss, metrics = real(old_log_prob, log_prob, advantages, response_mask, info)
        return loss / torch.clamp(response_mask.sum(), min=1), metrics

    stopped = Binding("e", ops={"policy_loss": dataclasses.replace(losses, impls={"cross_entropy": token_mean})},
                      declared=skyrl.declared)
    out = run_check(stopped, _ce_case())
    assert not out.ok and "loss" in out.message


@pytest.mark.engines
def test_skyrl_cross_entropy_nan_at_masked_positions_stays_a_failure(skyrl):
    """The convention is about the aggregation only: NaN at a masked position still leaks through NaN·0
    (reduce_loss multiplies by the mask; “NaN·0 at masked positions”), and mask_invariant still fails."""
    out = run_check(skyrl, _ce_case("mask_invariant"))
    assert not out.ok and "nan" in out.message.lower()


# ------------------------------------------------------------------------------ the mask layout
def test_skyrl_right_aligns_the_response_mask_it_passes_gae():
    """The precondition's evidence, read from the installed trainer: the response mask is built right-aligned
    and is the mask compute_advantages_and_returns receives. A SkyRL that pads responses on the right fails
    here (the declaration must go)."""
    pre = read_source("skyrl/train/dataset/preprocess.py").splitlines()
    assert "Response tokens occupy the trailing response_len positions" in pre[363 - 1]
    assert "response_mask_np = (col_resp[None, :] >= resp_pad[:, None])" in pre[366 - 1]
    trainer = read_source("skyrl/train/trainer.py")
    assert 'response_mask=data["response_mask"],' in trainer


@pytest.mark.engines
def test_a_mask_hole_skyrl_never_passes_is_drawn_right_aligned_and_gae_is_exact_there(skyrl):
    """A mask with a masked position between valid ones ([T, T, F, T]) is a layout SkyRL's trainer never gives
    GAE (its recursion runs through the hole); drawn right-aligned, as the trainer gives it, SkyRL's GAE is
    exact. Without the declaration the same case fails: the layout, not a tolerance, is what passes it."""
    from rlconform.harness.core.mask_layout import right_aligned

    mask = [[True, True, False, True], [False, True, True, True]]
    case = _gae_case(mask)
    case.inputs["values"] = np.array([[0.13, 0.095, -0.07, -0.127], [0.2, -0.1, 0.05, 0.3]])
    case.inputs["token_level_rewards"] = np.array([[0.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, -1.0]])
    case.inputs["gamma"], case.inputs["lam"] = 0.99, 0.95
    out = run_check(skyrl, case)
    assert out.ok and out.declared == "response_mask_right_aligned", out.message
    bare = run_check(_bare(skyrl), case)
    assert not bare.ok and bare.verdict == "discrepancy", bare.message
    # the layout keeps each value at its token: valid positions in order, last; the outcome reward stays valid
    moved = right_aligned(case.inputs, "response_mask", ("token_level_rewards", "values"))
    assert moved["response_mask"].tolist() == [[False, True, True, True], [False, True, True, True]]
    assert moved["values"][0].tolist() == [-0.07, 0.13, 0.095, -0.127]
    assert moved["token_level_rewards"][0].tolist() == [0.0, 0.0, 0.0, 1.0]


# ------------------------------------------------------------------------------ the rewards precondition
def test_skyrl_writes_rewards_only_over_the_response_tokens():
    """The precondition's evidence, read from the installed trainer: rewards start as a zero tensor and each
    response's per-token rewards fill only its own (right-aligned) tokens, a response-level reward its last
    one. A SkyRL that writes anything at padded positions fails here (the declaration must go)."""
    pre = read_source("skyrl/train/dataset/preprocess.py").splitlines()
    assert "ret_rewards_np = np.zeros((num_samples, max_response), dtype=np.float32)" in pre[378 - 1]
    assert "ret_rewards_np[i, max_response - reward_arr.shape[0] :] = reward_arr" in pre[381 - 1]
    trainer = read_source("skyrl/train/trainer.py")
    assert "per_token_reward = [0.0] * len(response)" in trainer and "per_token_reward[-1] = float(reward)" in trainer


@pytest.mark.engines
@pytest.mark.parametrize("variant", ["grpo", "rloo", "maxrl"])
def test_the_rewards_precondition_keeps_garbage_out_of_the_rewards_and_only_there(skyrl, variant):
    """Declared: SkyRL's trainer keeps rewards zero outside the response mask, so mask_invariant writes no
    garbage there. Without the declaration the same check fails: SkyRL sums the whole row."""
    d = _declared(skyrl, "rewards_zero_outside_mask")
    assert d.kind == "precondition" and d.inputs == ("token_level_rewards",) and "reward_arr" in _line(d.source)
    case = Case("outcome_advantage", "mask_invariant", "float64", f"{variant}@uneven_groups",
                {"token_level_rewards": np.array([[0.0, 0.0, 1.0], [0.0, 0.0, 0.5], [0.0, 0.0, -1.0]]),
                 "response_mask": np.array([[False, True, True]] * 3), "index": np.array([0, 0, 0]),
                 "garbage": float("nan")})
    out = run_check(skyrl, case)
    assert out.ok and out.declared == "rewards_zero_outside_mask", out.message
    without = dataclasses.replace(skyrl, declared=tuple(x for x in skyrl.declared if x.name != d.name))
    assert not run_check(without, case).ok
