"""The policy-step op: its float64 reference against an independent autograd computation, the float32
reference engine against it, the canonical form's contract, and the tiny model."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from step_cases import find

import rlconform.reference as R
from rlconform.harness.bindings.reference import binding as reference_binding
from rlconform.harness.core.opinfo import MASK_INVARIANT, MATCHES_REFERENCE, PARTITION_INVARIANT
from rlconform.harness.core.tiny_lm import TinyLM
from rlconform.harness.families import policy_step as S
from rlconform.properties import generic


def _smallest(mode="token-mean"):
    """The strategy's simplest input (deterministic)."""
    return find(S.inputs(mode), lambda inp: True)


def _autograd_step(inp, entropy_agg_mode=None):
    """The step in float64 torch autograd (a second, independent derivation of the reference's gradient)."""
    E = torch.tensor(inp["embed"].astype(np.float32).astype(np.float64), requires_grad=True)
    W = torch.tensor(inp["head"].astype(np.float32).astype(np.float64), requires_grad=True)
    E0 = torch.tensor(inp["old_embed"].astype(np.float32).astype(np.float64))
    W0 = torch.tensor(inp["old_head"].astype(np.float32).astype(np.float64))
    width = inp["response_mask"].shape[1]
    ids = torch.tensor(inp["input_ids"])
    ctx, lab = ids[:, -width - 1:-1], ids[:, -width:]
    T = float(np.float32(inp["temperature"]))
    z, z0 = E[ctx] @ W.T / T, E0[ctx] @ W0.T / T
    lp = torch.log_softmax(z, -1).gather(-1, lab[..., None])[..., 0]
    old = torch.log_softmax(z0, -1).gather(-1, lab[..., None])[..., 0]
    m = torch.tensor(inp["response_mask"], dtype=torch.float64)
    correction = S.variant_knobs(inp)
    rollout = torch.tensor(inp.get("rollout_log_probs", np.zeros(m.shape)), dtype=torch.float64) * m
    for level, _, lower, upper in correction.get("rejection", ()):  # k1: a token's or a row's mean log-ratio
        log_ratio = (old.detach() - rollout) * m
        stat = log_ratio if level == "token" else (log_ratio.sum(1) / m.sum(1))[:, None]
        m = m * ((stat >= np.log(lower)) & (stat <= np.log(upper))).double()
    A = torch.tensor(inp["advantages"], dtype=torch.float64) * m
    r = torch.exp(lp - old)
    if correction.get("policy_loss") == "gspo":  # the row's geometric-mean ratio, straight-through, no dual clip
        row = ((lp - old) * m).sum(1, keepdim=True) / m.sum(1, keepdim=True).clamp(min=1)
        r = torch.exp(row.detach()) * torch.exp(lp - lp.detach())
        lo, hi = correction["clip_ratio_low"], correction["clip_ratio_high"]
        pl = torch.maximum(-A * r, -A * r.clamp(1 - lo, 1 + hi))
    else:
        c1 = torch.maximum(-A * r, -A * r.clamp(0.8, 1.2))
        pl = torch.where(A < 0, torch.minimum(-A * 3.0, c1), c1)
    if correction.get("is_level") == "token":  # token TIS: a constant weight of the old and rollout log-probs
        pl = pl * torch.exp(old.detach() - rollout).clamp(max=correction["is_cap"])
    elif correction.get("is_level"):  # sequence TIS: one constant weight per row, exp of its summed log-ratio
        pl = pl * torch.exp(((old.detach() - rollout) * m).sum(1, keepdim=True)).clamp(max=correction["is_cap"])
    kl = None
    if correction.get("kl_loss_coef"):  # the estimator to the reference model at the same temperature
        R0 = torch.tensor(inp["ref_embed"].astype(np.float32).astype(np.float64))
        W0r = torch.tensor(inp["ref_head"].astype(np.float32).astype(np.float64))
        ref = torch.log_softmax(R0[ctx] @ W0r.T / T, -1).gather(-1, lab[..., None])[..., 0]
        kl = {"low_var_kl": lambda: (torch.exp(ref - lp) - (ref - lp) - 1).clamp(-10, 10),
              "k1": lambda: lp - ref, "k2": lambda: 0.5 * (lp - ref) ** 2}[correction["kl_loss_type"]]()
    H = -(torch.softmax(z, -1) * torch.log_softmax(z, -1)).sum(-1)

    def agg(x, mode=inp["mode"]):
        if mode == "token-mean":
            return (x * m).sum() / m.sum()
        rows = m.sum(1) > 0
        return ((x * m).sum(1)[rows] / m.sum(1)[rows]).mean()

    loss = agg(pl) - inp["entropy_coeff"] * agg(H, entropy_agg_mode or inp["mode"])
    if kl is not None:
        loss = loss + correction["kl_loss_coef"] * agg(kl)
    loss.backward()
    return loss.item(), E.grad.numpy(), W.grad.numpy(), old.detach().numpy()


def _every_variant():
    from hypothesis import strategies as st

    return st.one_of(*(S.inputs(v) for v in S.VARIANTS))


@settings(max_examples=40, deadline=None, derandomize=True)
@given(_every_variant())
def test_the_reference_step_equals_float64_autograd(inp):
    ref = _exact(inp)
    loss, g_embed, g_head, old = _autograd_step(inp)
    mask = inp["response_mask"].astype(bool)
    assert ref["loss"] == pytest.approx(loss, rel=1e-12, abs=1e-12)
    np.testing.assert_allclose(ref["grad_embed"], g_embed, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(ref["grad_head"], g_head, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(ref["old_log_probs"][mask], old[mask], rtol=1e-12, atol=1e-12)


@settings(max_examples=10, deadline=None, derandomize=True)
@given(S.inputs("seq-mean-token-mean"))
def test_an_entropy_term_aggregated_by_a_declared_convention(inp):
    """SkyRL's entropy bonus is a token mean whatever the loss reduction: the reference follows a declared
    ``entropy_agg_mode``."""
    inp = dict(inp, entropy_coeff=0.05)
    ref = R.policy_step(inp["embed"].astype(np.float32), inp["head"].astype(np.float32),
                        inp["old_embed"].astype(np.float32), inp["old_head"].astype(np.float32), inp["input_ids"],
                        inp["response_mask"], inp["advantages"], temperature=float(np.float32(inp["temperature"])),
                        loss_agg_mode=inp["mode"], entropy_coeff=0.05, entropy_agg_mode="token-mean", **S.CLIP)
    loss, g_embed, g_head, _ = _autograd_step(inp, "token-mean")
    assert ref["loss"] == pytest.approx(loss, rel=1e-12, abs=1e-12)
    np.testing.assert_allclose(ref["grad_head"], g_head, rtol=1e-9, atol=1e-12)


@settings(max_examples=30, deadline=None, derandomize=True)
@given(S.inputs("token-mean-with-rejection") | S.inputs("token-mean-with-tis"))
def test_drawn_rollout_log_probs_keep_every_decision_away_from_its_bound(inp):
    """Each row's mean ratio π_old/π_rollout is ≥ 10 % inside or outside the rejection bounds, one row is kept and
    (with two rows or more) one rejected, and no token's ratio is within 10 % of the TIS cap: a float32 engine's
    decision is the exact one, and a shown example reads as what it is."""
    mask = inp["response_mask"].astype(bool)
    old = R.step_log_probs(inp["old_embed"].astype(np.float32), inp["old_head"].astype(np.float32),
                           inp["input_ids"], mask.shape[1], float(np.float32(inp["temperature"])))
    delta = np.where(mask, old - inp["rollout_log_probs"], 0.0)
    row_ratio = np.exp(delta.sum(1) / mask.sum(1))
    for bound in (0.8, 1.25):
        assert (np.abs(row_ratio / bound - 1) >= 0.1).all(), (row_ratio, bound)
    kept = (row_ratio >= 0.8) & (row_ratio <= 1.25)
    assert kept.any() and (len(kept) == 1 or not kept.all())
    token_ratio = np.exp(delta[mask])
    assert (np.abs(token_ratio / S.IS_CAP - 1) >= 0.1).all()
    assert (inp["rollout_log_probs"][~mask] == 0).all()


@settings(max_examples=40, deadline=None, derandomize=True)
@given(S.inputs("token-mean-with-seq-tis"))
def test_drawn_rollout_log_probs_keep_every_row_away_from_the_sequence_cap(inp):
    """Each row's sequence ratio exp(Σ log(π_old/π_rollout)) over its valid tokens is ≥ 10 % from the sequence TIS
    cap, one row is below it and (with two rows that have a valid token) one above: the float32 engine truncates
    the rows the exact step truncates, on every machine."""
    mask = inp["response_mask"].astype(bool)
    old = R.step_log_probs(inp["old_embed"].astype(np.float32), inp["old_head"].astype(np.float32),
                           inp["input_ids"], mask.shape[1], float(np.float32(inp["temperature"])))
    live = mask.any(1)
    seq_ratio = np.exp(np.where(mask, old - inp["rollout_log_probs"], 0.0).sum(1))[live]
    assert (np.abs(seq_ratio / S.SEQ_IS_CAP - 1) >= 0.1).all(), seq_ratio
    assert (seq_ratio < S.SEQ_IS_CAP).any()
    assert live.sum() == 1 or (seq_ratio > S.SEQ_IS_CAP).any(), seq_ratio
    assert (inp["rollout_log_probs"][~mask] == 0).all()
    assert live.all() or len(live) >= 3  # a row with no valid token only beside two that have one


def test_the_sequence_tis_draw_holds_a_row_with_no_valid_token_and_the_trigger_names_it():
    inp = find(S.inputs("token-mean-with-seq-tis"),
               lambda i: not i["response_mask"].any(1).all() and i["micro_batch_sizes"][0] == len(i["input_ids"]))
    assert S.trigger(_Case(inp, MATCHES_REFERENCE), "", "wrong value") == "a row with no valid token"
    assert S.trigger(_Case(_smallest("token-mean-with-seq-tis"), MATCHES_REFERENCE), "", "wrong value") is None


@settings(max_examples=40, deadline=None, derandomize=True)
@given(S.inputs("token-mean-with-token-mask"))
def test_drawn_rollout_log_probs_keep_every_token_away_from_the_token_band(inp):
    """Each valid token's ratio π_old/π_rollout is ≥ 10 % (in ratio) from both bounds of the token band, one token is
    kept, and with two rows or more one row has every token outside the band: a float32 engine masks the tokens the
    exact step masks, on every machine, whichever side of a bound it counts as inside."""
    mask = inp["response_mask"].astype(bool)
    old = R.step_log_probs(inp["old_embed"].astype(np.float32), inp["old_head"].astype(np.float32),
                           inp["input_ids"], mask.shape[1], float(np.float32(inp["temperature"])))
    ratio = np.exp(np.where(mask, old - inp["rollout_log_probs"], 0.0))[mask]
    ((_, _, low, high),) = S.TOKEN_MASK
    for bound in (low, high):
        assert (np.abs(np.log(ratio / bound)) >= np.log(1.1)).all(), (ratio, bound)
    kept = S.kept_mask(inp)
    assert (kept == (mask & (np.exp(np.where(mask, old - inp["rollout_log_probs"], 0.0)) >= low)
                     & (np.exp(np.where(mask, old - inp["rollout_log_probs"], 0.0)) <= high))).all()
    assert kept.any()
    assert len(S.rejected_rows(inp)) >= 1 or mask.any(1).sum() == 1
    assert (inp["rollout_log_probs"][~mask] == 0).all()


def test_the_reference_step_raises_on_bad_input():
    inp = _smallest()
    args = (inp["embed"], inp["head"], inp["old_embed"], inp["old_head"], inp["input_ids"])
    with pytest.raises(ValueError, match="temperature"):
        R.policy_step(*args, inp["response_mask"], inp["advantages"], temperature=0.0)
    with pytest.raises(ValueError, match="no unmasked"):
        R.policy_step(*args, np.zeros_like(inp["response_mask"]), inp["advantages"], temperature=1.0)
    with pytest.raises(ValueError, match="rollout_log_probs"):
        R.policy_step(*args, inp["response_mask"], inp["advantages"], temperature=1.0, rollout_is="token")
    with pytest.raises(ValueError, match="keeps no token"):  # every row's ratio e^5 is far outside [0.8, 1.25]
        R.policy_step(*args, inp["response_mask"], inp["advantages"], temperature=1.0, rejection=S.REJECTION,
                      rollout_log_probs=np.full(inp["response_mask"].shape, -50.0))
    with pytest.raises(ValueError, match=r"\[V, H\]"):
        R.policy_step(inp["embed"], inp["head"][:, :1], inp["old_embed"], inp["old_head"], inp["input_ids"],
                      inp["response_mask"], inp["advantages"], temperature=1.0)


class _Case:
    def __init__(self, inputs, prop, op=S.STEP_OP):
        self.inputs, self.property, self.dtype, self.op = inputs, prop, "float32", op
        self.regime = f"{inputs.get('variant', inputs['mode'])}@{S.DATA}"


def _passes_every_property(inp) -> None:
    """The in-harness float32 step on ``inp`` passes every property of both ops (no problem, each judge ok)."""
    for prop, judge in ((MATCHES_REFERENCE, generic.matches_reference),
                        (PARTITION_INVARIANT, generic.partition_invariant), (MASK_INVARIANT, generic.mask_invariant)):
        for op in (S.STEP_OP, S.METRICS_OP):
            ev = S.evaluate(reference_binding, _Case(inp, prop, op))
            assert not ev.problems, ev.problems
            outcome = judge(ev)
            assert outcome.ok, (prop, op, outcome)


@settings(max_examples=15, deadline=None, derandomize=True)
@given(_every_variant())
def test_the_float32_reference_engine_passes_every_property(inp):
    for prop, judge in ((MATCHES_REFERENCE, generic.matches_reference),
                        (PARTITION_INVARIANT, generic.partition_invariant), (MASK_INVARIANT, generic.mask_invariant)):
        step = S.evaluate(reference_binding, _Case(inp, prop))
        assert not step.problems
        # old log-probs and both parameters; matches_reference: again, and both at each step of the mini-batch run
        several = S.mini_batches(inp) if prop == MATCHES_REFERENCE else 1
        assert several >= 1 and len(step.values) == 1 + (several > 1)
        assert len(step.gradients) == 2 + (2 * several if several > 1 else 0)
        metrics = S.evaluate(reference_binding, _Case(inp, prop, S.METRICS_OP))
        assert not metrics.problems and not metrics.gradients and len(metrics.values) >= 5
        for ev in (step, metrics):
            outcome = judge(ev)
            assert outcome.ok, (prop, outcome)


def test_a_step_that_loses_a_gradient_or_a_metric_is_a_problem():
    from rlconform.harness.catalog.binding import PolicyStep

    def forgetful(batch, params, old_params, knobs):
        out = S.fp32_step(batch, params, old_params, knobs)
        del out["grads"]["head.weight"], out["metrics"]["ppo_kl"]
        return out

    class Forgetful:
        name = "forgetful"

        @staticmethod
        def resolve(op):
            return PolicyStep(run=forgetful)

    step = S.evaluate(Forgetful, _Case(_smallest(), MATCHES_REFERENCE))
    assert [p.what for p in step.problems] == ["missing gradient"], step.problems
    metrics = S.evaluate(Forgetful, _Case(_smallest(), MATCHES_REFERENCE, S.METRICS_OP))
    assert [p.what for p in metrics.problems] == ["lost metric"], metrics.problems


def test_the_tiny_model_is_its_parameters():
    embed, head = torch.randn(5, 3), torch.randn(5, 3)
    model = TinyLM({"embed.weight": embed, "head.weight": head})
    ids = torch.tensor([[0, 4, 2]])
    torch.testing.assert_close(model(input_ids=ids, attention_mask=None, use_cache=False).logits, embed[ids] @ head.T)
    with pytest.raises(ValueError):
        TinyLM({"embed.weight": embed, "head.weight": head[:, :2]})
    with pytest.raises(KeyError):
        TinyLM({"embed.weight": embed})


def test_the_trigger_names_the_feature_a_failure_kept():
    """A split into micro-batches, then a rejected row, then a temperature ≠ 1: what survived shrinking (the whole
    mini-batch and the temperature 1 are drawn first)."""
    def first(variant, **want):
        return find(S.inputs(variant), lambda i: len(i["input_ids"]) == 4 and all(
            (i["micro_batch_sizes"][0] < 4 if k == "split" else float(i["temperature"]) != 1.0) == v
            for k, v in want.items()))

    rejected = first("token-mean-with-rejection", split=False)
    assert len(S.rejected_rows(rejected)) >= 1
    for op in (S.STEP_OP, S.METRICS_OP):
        assert S.trigger(_Case(rejected, MATCHES_REFERENCE, op), "", "wrong value") == S.REJECTED_ROW
    assert S.trigger(_Case(rejected, MASK_INVARIANT), "", "NaN") is None
    split = first("token-mean-with-rejection", split=True)
    assert S.trigger(_Case(split, MATCHES_REFERENCE), "", "wrong value") == "more than one micro-batch"
    tempered = first("token-mean-with-kl", split=False, tempered=True)
    assert len(S.rejected_rows(tempered)) == 0
    assert S.trigger(_Case(tempered, MATCHES_REFERENCE), "", "wrong value") == "a sampling temperature ≠ 1"
    assert S.trigger(_Case(tempered, PARTITION_INVARIANT), "", "wrong value") is None
    assert S.trigger(_Case(first("token-mean", split=False, tempered=False), MATCHES_REFERENCE), "", "x") is None


def test_partition_invariance_includes_dynamic_micro_batches_for_a_binding_that_drives_them():
    from rlconform.harness.catalog.binding import PolicyStep

    inp = find(S.inputs("token-mean"), lambda i: len(i["input_ids"]) == 4)
    assert inp["token_budgets"] and min(inp["token_budgets"]) >= inp["attention_mask"].sum(1).max()
    ev = S.evaluate(reference_binding, _Case(inp, PARTITION_INVARIANT))
    labels = [label for label, _ in ev.alternatives]
    dynamic = [label for label in labels if "dynamic micro-batches packed by the engine to ≤" in label]
    assert len(dynamic) == len(inp["token_budgets"]), labels

    class RowsOnly:  # a binding without token budgets is never handed one
        name = "rows-only"

        @staticmethod
        def resolve(op):
            return PolicyStep(run=S.fp32_step, modes=S.MODES)

    labels = [label for label, _ in S.evaluate(RowsOnly, _Case(inp, PARTITION_INVARIANT)).alternatives]
    assert not any("dynamic" in label for label in labels), labels


def test_a_kl_step_that_does_not_log_its_kl_loss_is_a_problem():
    from rlconform.harness.catalog.binding import PolicyStep

    def silent(batch, params, old_params, knobs):
        out = S.fp32_step(batch, params, old_params, knobs)
        del out["metrics"]["kl_loss"]
        return out

    class Silent:
        name = "silent"

        @staticmethod
        def resolve(op):
            return PolicyStep(run=silent, modes=S.MODES)

    inp = find(S.inputs("token-mean-with-kl"), lambda i: True)
    metrics = S.evaluate(Silent, _Case(inp, MATCHES_REFERENCE, S.METRICS_OP))
    assert [p.what for p in metrics.problems] == ["lost metric"], metrics.problems


@settings(max_examples=20, deadline=None, derandomize=True)
@given(S.inputs("token-mean-with-tis"))
def test_the_importance_weights_diagnostics_are_those_of_the_kept_tokens(inp):
    """``rollout_is_fraction_high`` counts raw ratios above the cap (before the truncation, which leaves none above
    it); the mean / min / max summarise the applied weights, or the raw ratios under a declared convention; the
    float32 step logs the same numbers."""
    mask = inp["response_mask"].astype(bool)
    old = R.step_log_probs(inp["old_embed"].astype(np.float32), inp["old_head"].astype(np.float32),
                           inp["input_ids"], mask.shape[1], float(np.float32(inp["temperature"])))
    raw = np.exp(old - inp["rollout_log_probs"])[mask]
    applied = np.minimum(raw, S.IS_CAP)
    for of, shown in (("applied", applied), ("raw", raw)):
        ref = R.policy_step(inp["embed"].astype(np.float32), inp["head"].astype(np.float32),
                            inp["old_embed"].astype(np.float32), inp["old_head"].astype(np.float32),
                            inp["input_ids"], inp["response_mask"], inp["advantages"],
                            temperature=float(np.float32(inp["temperature"])), **S.CLIP,
                            rollout_log_probs=inp["rollout_log_probs"], rollout_is="token", rollout_is_cap=S.IS_CAP,
                            is_metric_weights=of)["metrics"]
        expected = {"rollout_is_mean": shown.mean(), "rollout_is_min": shown.min(), "rollout_is_max": shown.max(),
                    "rollout_is_fraction_high": (raw > S.IS_CAP).mean()}
        for name, value in expected.items():
            assert ref[name] == pytest.approx(value, rel=1e-6), (of, name)
        fp32 = S.faithful(inp, {"is_metric_weights": of})["metrics"]
        for name, value in expected.items():
            assert fp32[name] == pytest.approx(value, rel=1e-5, abs=1e-7), (of, name)
    with pytest.raises(ValueError, match="is_metric_weights"):
        R.policy_step(inp["embed"], inp["head"], inp["old_embed"], inp["old_head"], inp["input_ids"],
                      inp["response_mask"], inp["advantages"], temperature=1.0,
                      rollout_log_probs=inp["rollout_log_probs"], rollout_is="token", is_metric_weights="capped")


def test_a_tis_step_that_does_not_log_an_importance_weight_diagnostic_is_a_problem():
    """A step that drops rollout_is_fraction_high (or any weight diagnostic its binding says it logs) is a lost
    metric, not a pass: silence is not conformance."""
    from rlconform.harness.catalog.binding import PolicyStep

    def silent(batch, params, old_params, knobs):
        out = S.fp32_step(batch, params, old_params, knobs)
        del out["metrics"]["rollout_is_fraction_high"]
        return out

    class Silent:
        name = "silent"

        @staticmethod
        def resolve(op):
            return PolicyStep(run=silent, modes=S.MODES)

    inp = find(S.inputs("token-mean-with-tis"), lambda i: True)
    metrics = S.evaluate(Silent, _Case(inp, MATCHES_REFERENCE, S.METRICS_OP))
    assert [p.what for p in metrics.problems] == ["lost metric"], metrics.problems
    assert "rollout_is_fraction_high" in metrics.problems[0].text


@settings(max_examples=20, deadline=None, derandomize=True)
@given(S.inputs("token-mean-with-seq-tis"))
def test_the_sequence_weights_diagnostics_are_those_of_the_rows_with_a_kept_token(inp):
    """Sequence TIS: ``rollout_is_fraction_high`` is the fraction of the rows with a valid token whose raw sequence
    ratio exceeds the cap (a row counts once, a row with no valid token not at all); the mean is over the valid
    tokens of the weight each gets; the min / max over those rows. Each summarises the applied weights, the raw
    sequence ratios or the raw token ratios as the conventions say, and the float32 step logs the same numbers."""
    mask = inp["response_mask"].astype(bool)
    old = R.step_log_probs(inp["old_embed"].astype(np.float32), inp["old_head"].astype(np.float32),
                           inp["input_ids"], mask.shape[1], float(np.float32(inp["temperature"])))
    log_ratio = np.where(mask, old - inp["rollout_log_probs"], 0.0)
    live = mask.any(1)
    seq = np.exp(log_ratio.sum(1))
    per_token = {"raw": np.broadcast_to(seq[:, None], mask.shape)[mask], "raw_token": np.exp(log_ratio)[mask]}
    per_token["applied"] = np.minimum(per_token["raw"], S.SEQ_IS_CAP)
    per_row = {"raw": seq[live], "applied": np.minimum(seq[live], S.SEQ_IS_CAP), "raw_token": per_token["raw_token"]}
    for of, extremes in (("applied", None), ("raw", None), ("raw_token", None), ("applied", "raw")):
        expected = {"rollout_is_mean": per_token[of].mean(), "rollout_is_min": per_row[extremes or of].min(),
                    "rollout_is_max": per_row[extremes or of].max(),
                    "rollout_is_fraction_high": (seq[live] > S.SEQ_IS_CAP).mean()}
        ref = R.policy_step(inp["embed"].astype(np.float32), inp["head"].astype(np.float32),
                            inp["old_embed"].astype(np.float32), inp["old_head"].astype(np.float32),
                            inp["input_ids"], inp["response_mask"], inp["advantages"],
                            temperature=float(np.float32(inp["temperature"])), **S.CLIP,
                            rollout_log_probs=inp["rollout_log_probs"], rollout_is="sequence_product",
                            rollout_is_cap=S.SEQ_IS_CAP, is_metric_weights=of, is_extreme_weights=extremes)["metrics"]
        fp32 = S.faithful(inp, {"is_metric_weights": of, "is_extreme_weights": extremes})["metrics"]
        for name, value in expected.items():
            assert ref[name] == pytest.approx(value, rel=1e-6), (of, extremes, name)
            assert fp32[name] == pytest.approx(value, rel=1e-5, abs=1e-7), (of, extremes, name)
    with pytest.raises(ValueError, match="is_extreme_weights"):
        R.policy_step(inp["embed"], inp["head"], inp["old_embed"], inp["old_head"], inp["input_ids"],
                      inp["response_mask"], inp["advantages"], temperature=1.0,
                      rollout_log_probs=inp["rollout_log_probs"], rollout_is="sequence_product",
                      is_extreme_weights="capped")


@pytest.mark.parametrize("empty_row", [False, True])
def test_the_float32_reference_engine_passes_the_sequence_tis_variant(empty_row):
    """The in-harness float32 step on the sequence-TIS variant, on a batch of three rows or more with and without a row that
    has no valid token: every property, both ops."""
    inp = find(S.inputs("token-mean-with-seq-tis"), lambda i: len(i["input_ids"]) >= 3 and i["temperature"] != 1.0
               and (not i["response_mask"].any(1).all()) == empty_row)
    _passes_every_property(inp)


@pytest.mark.parametrize("split", [False, True])
def test_the_float32_reference_engine_passes_the_token_mask_variant(split):
    """The in-harness float32 step on the token-mask variant, with a row that keeps some tokens and loses others, a
    row the mask empties, a temperature ≠ 1, whole and split into micro-batches: every property, both ops. The
    emptied row is a rejected row (the trigger's words), and the label counts the tokens the mask removed."""
    def wanted(i):
        if not (len(i["input_ids"]) >= 3 and i["temperature"] != 1.0
                and (i["micro_batch_sizes"][0] < len(i["input_ids"])) == split):
            return False
        kept, mask = S.kept_mask(i), i["response_mask"].astype(bool)
        return len(S.rejected_rows(i)) >= 1 and ((mask & ~kept).any(1) & kept.any(1)).any()

    inp = find(S.inputs("token-mean-with-token-mask"), wanted)
    mask, kept = inp["response_mask"].astype(bool), S.kept_mask(inp)
    rows = ", ".join(str(int(r)) for r in S.rejected_rows(inp))
    assert S._rejection_words(inp).startswith(f", {int((mask & ~kept).sum())} of {int(mask.sum())} valid tokens "
                                              f"masked, every one of row")
    assert S._rejection_words(inp).endswith(f" {rows}")
    assert "token mask (token k1): a token kept, weight 1, for 0.5 ≤ r ≤ 2" in S._parameters(inp["variant"])
    if not split:
        assert S.trigger(_Case(inp, MATCHES_REFERENCE), "", "wrong value") == S.REJECTED_ROW
    _passes_every_property(inp)


def test_a_step_that_ignores_the_token_mask_or_counts_before_it_is_wrong():
    """The token mask changes the exact step (a masked token's loss and count leave it): the float32 step with the
    mask dropped, or with the normaliser counted before it, gives another gradient."""
    inp = find(S.inputs("token-mean-with-token-mask"), lambda i: len(i["input_ids"]) == 4)
    exact = S.faithful(inp)["grads"]["head.weight"]
    batch, kn = S.trainer_batch(inp), S.knobs(inp, 4)
    for flaw in ({"token_mask_ignored": True}, {"count_before_rejection": True}):
        grad = S.fp32_step(batch, S.params(inp), S.params(inp, old=True), kn, **flaw)["grads"]["head.weight"]
        assert (grad - exact).abs().max() > 1e-3 * exact.abs().max(), flaw


@settings(max_examples=20, deadline=None, derandomize=True)
@given(S.inputs("seq-mean-token-mean-with-gspo"))
def test_the_reference_gspo_step_equals_float64_autograd(inp):
    """GSPO's step: the row's geometric-mean ratio, straight-through at each token, GSPO's clip bounds, no dual clip
    (the float64 step calls the function-level ``policy_loss`` reference)."""
    ref = R.policy_step(inp["embed"].astype(np.float32), inp["head"].astype(np.float32),
                        inp["old_embed"].astype(np.float32), inp["old_head"].astype(np.float32), inp["input_ids"],
                        inp["response_mask"], inp["advantages"], temperature=float(np.float32(inp["temperature"])),
                        loss_agg_mode=inp["mode"], entropy_coeff=inp["entropy_coeff"], **S.clip(inp),
                        policy_loss_variant="gspo")
    loss, g_embed, g_head, _ = _autograd_step(inp)
    assert ref["loss"] == pytest.approx(loss, rel=1e-12, abs=1e-12)
    np.testing.assert_allclose(ref["grad_embed"], g_embed, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(ref["grad_head"], g_head, rtol=1e-9, atol=1e-12)
    assert "pg_clipfrac_lower" not in ref["metrics"]


def test_the_gspo_draw_puts_rows_inside_and_outside_the_clip_band_and_clear_of_its_bounds():
    """One batch holds a row whose GSPO ratio is inside the clip band and one whose clip binds; every row's
    log-ratio is clear of both bounds."""
    low, high = np.log1p(-S.GSPO["clip_ratio_low"]), np.log1p(S.GSPO["clip_ratio_high"])

    def clip_fraction(inp):
        return R.policy_step(inp["embed"].astype(np.float32), inp["head"].astype(np.float32),
                             inp["old_embed"].astype(np.float32), inp["old_head"].astype(np.float32),
                             inp["input_ids"], inp["response_mask"], inp["advantages"],
                             temperature=float(np.float32(inp["temperature"])), loss_agg_mode=inp["mode"],
                             **S.clip(inp), policy_loss_variant="gspo")["metrics"]["pg_clipfrac"]

    def mixed(inp):
        mean = S.gspo_row_log_ratios(inp)[np.asarray(inp["response_mask"], bool).any(1)]
        inside = (mean > low) & (mean < high)
        return inside.any() and not inside.all() and 0 < clip_fraction(inp) < 1

    inp = find(S.inputs("seq-mean-token-mean-with-gspo"), mixed)
    mean = S.gspo_row_log_ratios(inp)
    assert (np.minimum(np.abs(mean - low), np.abs(mean - high)) >= S.GSPO_MARGIN * (high - low)).all()


@pytest.mark.parametrize("split", [False, True])
def test_the_float32_reference_engine_passes_the_gspo_variant(split):
    inp = find(S.inputs("seq-mean-token-mean-with-gspo"),
               lambda i: len(i["input_ids"]) >= 3 and (i["micro_batch_sizes"][0] < len(i["input_ids"])) == split
               and not np.asarray(i["response_mask"], bool).all())
    _passes_every_property(inp)
    metrics = S.evaluate(reference_binding, _Case(inp, MATCHES_REFERENCE, S.METRICS_OP))
    assert not any("pg_clipfrac_lower" in c.label for c in metrics.values)


def _exact(inp, **extra):
    """The float64 step of a drawn input (its variant's knobs), ``extra`` keywords beside."""
    correction = S.variant_knobs(inp)
    return R.policy_step(inp["embed"].astype(np.float32), inp["head"].astype(np.float32),
                         inp["old_embed"].astype(np.float32), inp["old_head"].astype(np.float32), inp["input_ids"],
                         inp["response_mask"], inp["advantages"], temperature=float(np.float32(inp["temperature"])),
                         loss_agg_mode=inp["mode"], entropy_coeff=inp["entropy_coeff"], **S.clip(inp),
                         policy_loss_variant=S.policy_loss_variant(inp),
                         rollout_log_probs=inp.get("rollout_log_probs"), rollout_is=correction.get("is_level"),
                         rollout_is_cap=correction.get("is_cap"), rejection=correction.get("rejection", ()),
                         **{k: inp[k].astype(np.float32) for k in ("ref_embed", "ref_head") if k in inp},
                         kl_loss_coef=correction.get("kl_loss_coef", 0.0),
                         kl_loss_type=correction.get("kl_loss_type", "k3"), **extra)


def _rows(inp, a, b):
    """``inp`` with only its rows ``[a, b)``."""
    rows = ("input_ids", "attention_mask", "response_mask", "advantages", "rollout_log_probs")
    return {k: (v[a:b] if k in rows else v) for k, v in inp.items()}


@settings(max_examples=30, deadline=None, derandomize=True)
@given(_every_variant().filter(lambda i: S.mini_batches(i) > 1))
def test_each_mini_batch_is_an_exact_step_of_its_own_rows(inp):
    """With several mini-batches each optimizer step is the float64 autograd step of its own rows (every normaliser
    counted over them); the step's metrics are the whole batch's, pooled, unless a declared convention averages
    one over the mini-batches."""
    k, rows = S.mini_batches(inp), len(inp["input_ids"])
    size = rows // k
    ref = _exact(inp, mini_batches=k)
    assert len(ref["steps"]) == k and "grad_embed" not in ref and "loss" not in ref
    for j, step in enumerate(ref["steps"]):
        assert step["rows"] == (j * size, (j + 1) * size)
        loss, g_embed, g_head, _ = _autograd_step(_rows(inp, j * size, (j + 1) * size))
        assert step["loss"] == pytest.approx(loss, rel=1e-12, abs=1e-12)
        np.testing.assert_allclose(step["grad_embed"], g_embed, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(step["grad_head"], g_head, rtol=1e-9, atol=1e-12)
    whole = _exact(inp)
    assert ref["metrics"] == whole["metrics"]
    np.testing.assert_array_equal(ref["old_log_probs"], whole["old_log_probs"])
    names = ("pg_loss", "pg_clipfrac")
    mean = _exact(inp, mini_batches=k, mini_batch_mean_metrics=names)
    for name in names:
        assert mean["metrics"][name] == pytest.approx(sum(s["metrics"][name] for s in ref["steps"]) / k, rel=1e-12)
    assert mean["metrics"]["ppo_kl"] == whole["metrics"]["ppo_kl"]


def test_the_reference_step_raises_on_a_mini_batch_count_that_does_not_cut_the_rows():
    inp = find(S.inputs("token-mean"), lambda i: len(i["input_ids"]) == 4)
    for bad in (0, 3, 2.0, True):
        with pytest.raises(ValueError, match="mini_batches"):
            _exact(inp, mini_batches=bad)
    empty = dict(inp, response_mask=np.where(np.arange(4)[:, None] < 2, 0, inp["response_mask"]))
    with pytest.raises(ValueError, match=r"mini-batch of rows \[0, 2\)"):
        _exact(empty, mini_batches=2)


def test_the_mini_batch_run_cuts_the_rows_into_the_most_mini_batches_that_each_keep_a_token():
    from hypothesis import strategies as st

    counts = set()

    @settings(max_examples=60, deadline=None, derandomize=True)
    @given(st.one_of(S.inputs("token-mean-with-rejection"), S.inputs("token-mean-with-seq-tis")))
    def check(inp):
        k, rows = S.mini_batches(inp), len(inp["input_ids"])
        assert "mini_batches" not in inp  # nothing is drawn for it
        kept = inp["response_mask"].astype(bool).any(1)
        kept[S.rejected_rows(inp)] = False

        def keeps(n):
            return rows % n == 0 and all(kept[a:a + rows // n].any() for a in range(0, rows, rows // n))

        assert k in S.MINI_BATCHES and keeps(k) and not any(keeps(n) for n in S.MINI_BATCHES if n > k)
        counts.add(k)

    check()
    assert {2, 3} <= counts


def test_a_normaliser_counted_over_the_whole_batch_fails_only_with_several_mini_batches():
    from rlconform.harness.mutants.step_batch_normaliser import binding as batch_normaliser

    inp = find(S.inputs("token-mean"), lambda i: S.mini_batches(i) == 2
               and len({int(i["response_mask"][:len(i["input_ids"]) // 2].sum()),
                        int(i["response_mask"][len(i["input_ids"]) // 2:].sum())}) == 2)
    several = generic.matches_reference(S.evaluate(batch_normaliser, _Case(inp, MATCHES_REFERENCE)))
    # the one-mini-batch run passes; each step of the mini-batch run fails
    assert not several.ok and all("(mini-batch " in c.label for c in several.clauses), several
    assert S.trigger(_Case(inp, MATCHES_REFERENCE), several.clauses, "wrong value") == S.SEVERAL_MINI_BATCHES
    one = dict(inp, mini_batches=1)
    assert generic.matches_reference(S.evaluate(batch_normaliser, _Case(one, MATCHES_REFERENCE))).ok
    assert S.trigger(_Case(one, MATCHES_REFERENCE), "", "wrong value") is None


def test_a_binding_that_drives_one_mini_batch_is_handed_one_and_a_lost_step_is_a_problem():
    from rlconform.harness.catalog.binding import PolicyStep

    inp = find(S.inputs("token-mean"), lambda i: S.mini_batches(i) == 2)
    seen = []

    def one_step(batch, params, old_params, knobs):
        seen.append(knobs["mini_batch_size"])
        return S.fp32_step(batch, params, old_params, knobs)

    def last_step_only(batch, params, old_params, knobs):
        out = S.fp32_step(batch, params, old_params, knobs)
        return dict(out, grads=out["grads"][-1] if isinstance(out["grads"], list) else out["grads"])

    def binding(run, mini_batches):
        class B:
            name = "b"

            @staticmethod
            def resolve(op):
                return PolicyStep(run=run, modes=S.MODES, mini_batches=mini_batches)
        return B

    ev = S.evaluate(binding(one_step, False), _Case(inp, MATCHES_REFERENCE))  # no mini-batch run
    assert seen == [len(inp["input_ids"])] and len(ev.gradients) == 2 and generic.matches_reference(ev).ok
    # a failure of that run is not one of several mini-batches: its clauses' layout says one
    assert "mini_batches" not in ev.gradients[0].layout
    assert S.trigger(_Case(inp, MATCHES_REFERENCE), [type("C", (), {"layout": ev.gradients[0].layout})()], "x") \
        != S.SEVERAL_MINI_BATCHES
    lost = S.evaluate(binding(last_step_only, True), _Case(inp, MATCHES_REFERENCE))
    assert [p.what for p in lost.problems] == ["missing output"], lost.problems


def test_a_step_finding_is_capped_in_the_ci_and_dev_profiles_and_not_in_the_nightly():
    """One step example runs the engine's step up to five times: ci and dev take at most STEP_CAP's examples and
    shrinking steps, the nightly profile its own 500; a cap naming no profile holds in all; an unknown profile is
    refused."""
    import pytest

    from rlconform.harness.catalog.ops import get_op
    from rlconform.harness.core.profiles import ExampleCap
    from rlconform.harness.families import policy_step as S

    for name in (S.STEP_OP, S.METRICS_OP):
        op = get_op(name)
        for regime in op.regimes:
            assert op.example_cap(regime, "ci") is S.STEP_CAP and op.example_cap(regime, "dev") is S.STEP_CAP
            assert op.example_cap(regime, "nightly") is None
            assert op.example_cap(regime) is S.STEP_CAP  # a run naming no profile: the cap holds
    assert S.STEP_CAP.max_examples < 20 and S.STEP_CAP.max_shrinks < 50
    assert ExampleCap(3).holds_in("nightly")
    with pytest.raises(ValueError, match="not among"):
        ExampleCap(3, profiles=("weekly",))
