"""The policy-gradient step: how a trainer wires temperature, log-probs, masks, counts and the micro-batch loop.

Canonical form: a :class:`~rlconform.harness.core.contracts.PolicyStep` (``run(batch, params, old_params, knobs)``).
Each function of the step can be right while the step that wires them is wrong: the temperature divided
twice or not on one path, the normaliser counted on another mask or scoped to a micro-batch, a metric folded
from per-micro-batch means. The binding drives the engine's own worker code; the harness hands it a tiny real
model (:class:`~rlconform.harness.core.tiny_lm.TinyLM`: embedding → LM head, logits an exact function of the
parameters) and compares the old log-probs, the gradient with respect to the model's parameters and the logged
metrics with the exact float64 step (:func:`rlconform.reference.policy_step`).

Inputs, as a trainer's batch after rollout: prompts and responses of uneven length (left / right padding),
rows cut at the maximum response length, interior observation tokens masked out of the loss (multi-turn),
advantages per token, a temperature ≠ 1 (drawn), proximal (old) parameters that differ from the current ones
(or equal them: on-policy), the entropy bonus on or off, and with a rollout correction the rollout's log-probs
(the only drawn log-probs: rows whose mean log-ratio to the proximal policy sits far inside or far outside the
rejection bounds, tokens on both sides of the TIS cap, rows whose summed log-ratio puts them on both sides of the
sequence TIS cap, tokens inside and outside the token band with a row whose every token is outside it, never within
10 % of a bound or a cap; with sequence TIS and GSPO also a row with no valid token).
Variants (:data:`VARIANTS`): ``loss_agg_mode``, alone or with a rollout correction (token-level TIS;
sequence-level TIS, one weight per row; rejection of rows by their mean ratio; a token mask, each token outside a
band of its ratio π_old/π_rollout out of the loss and its count, the others at weight 1), or with a KL loss
(estimator k3, k1 or k2) against a frozen reference model; the policy loss vanilla PPO with dual clip, or GSPO
(one ratio per row, the geometric mean of its token ratios, straight-through at each token, clipped at GSPO's 3e-4 / 4e-4; proximal
parameters drawn so that one batch holds rows inside and outside the clip band, each ≥ 10 % of the band from its
bound). Partitions: the mini-batch cut into
micro-batches of every size that divides it, and (for a binding that drives it) into micro-batches by a token
budget (dynamic batch size), and for a binding that runs the update on several DP ranks (``PolicyStep.dp_sizes``)
the mini-batch cut into contiguous equal rank chunks of one micro-batch each. Checked on CPU in float32 only (the parameters and the logits are float32; CUDA
autocast does nothing on CPU).

Several mini-batches (for a binding whose step drives them: ``PolicyStep.mini_batches``): ``matches_reference`` runs
the step a second time with the batch (the generation batch) cut in order into k equal mini-batches, one optimizer
step each, one PPO epoch (verl ``ppo_mini_batch_size``, SkyRL ``policy_mini_batch_size``), k the most of
:data:`MINI_BATCHES` that divides the drawn rows and leaves each mini-batch a kept token (:func:`mini_batches`), each
mini-batch cut into micro-batches of the drawn size (or of its rows, when fewer). Nothing more is drawn: the examples,
and every finding's one-mini-batch run, are the same as without it. The optimizer stand-ins record each step's
gradient and move no parameter, so the run yields k gradients at the same parameters, each compared with the exact
gradient of its own mini-batch, every normaliser counted over its rows (:func:`rlconform.reference.policy_step`
``mini_batches``): a normaliser scoped to the generation batch (a token count or ``global_batch_size`` of the whole
batch) fails ``matches_reference``, triggered by "more than one mini-batch" when the one-mini-batch run passes. The
metrics are the whole batch's, pooled over its tokens, unless the binding declares a mean over the mini-batches (both
engines do: one value per optimizer step). ``partition_invariant`` and ``mask_invariant`` run one mini-batch.

Two ops of one step: ``policy_step`` compares the old log-probs and the parameter gradient, ``policy_step_metrics``
the logged metrics (a binding maps both to the same :class:`~rlconform.harness.core.contracts.PolicyStep`), so that
a wrong metric never hides a wrong gradient behind the same finding.
Properties: ``matches_reference`` (against the exact step); ``partition_invariant``
(the same step under every other micro-batch size, token budget and DP size); ``mask_invariant`` (garbage in the advantages and the
rollout log-probs at masked positions and other token ids at padded positions leave the step unchanged; garbage in
the rollout log-probs alone too, so that a leak of theirs is not hidden behind one of the advantages). An
importance weight that moves with the current policy, or carries its gradient, fails ``matches_reference`` of
the TIS variants (the reference's weight is a constant of the old and rollout log-probs); a normaliser counted
before the rejection fails it in the rejection and token-mask variants, and a token mask left unapplied in the
token-mask variant.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from hypothesis import assume
from hypothesis import strategies as st

import rlconform.reference as R
from rlconform.harness.core.contracts import STEP_IS_METRICS, STEP_METRICS, VariantNotProvided
from rlconform.harness.core.declared import followed
from rlconform.harness.core.evaluation import Compared, Evaluation, call_engine
from rlconform.harness.core.failure import problem as problem_clause
from rlconform.harness.core.opinfo import (
    MASK_INVARIANT,
    MATCHES_REFERENCE,
    PARTITION_INVARIANT,
    OpInfo,
    reference_function,
    split_regime,
    variant_regime,
)
from rlconform.harness.core.profiles import ExampleCap, profile_regimes
from rlconform.harness.core.tiny_lm import TinyLM
from rlconform.harness.families import OpFamily

#: verl's rejection option of the step's rejection variants: a row is kept when 0.8 ≤ exp(mean log(π_old/π_rollout))
#: ≤ 1.25 over its tokens (``rollout_rs="seq_mean_k1"``, ``rollout_rs_threshold="0.8_1.25"``)
REJECTION = (("seq_mean", "k1", 0.8, 1.25),)
#: the token band of the token-mask variant (masked importance sampling's token band, IcePop's band without its
#: weight): a valid token is kept, with weight 1, when 0.5 ≤ π_old/π_rollout ≤ 2 (the ratio, both bounds inclusive),
#: and leaves the loss mask and its count otherwise (verl ``rollout_rs="token_k1"``, ``rollout_rs_threshold=
#: "0.5_2"``; SkyRL ``token_mask_is_threshold_low`` / ``_high``). The band is symmetric in log space (0.5 = 1/2):
#: verl compares its statistic −log r with the log bounds, SkyRL the ratio r with the bounds, and both keep the same
#: tokens (an asymmetric band is read as one of the inverse ratio by verl: op ``rollout_rejection_mask``,
#: ``token_k1_asym``); every drawn token is ≥ 10 % (in ratio) from both bounds, so inclusiveness never decides
TOKEN_MASK = (("token", "k1", 0.5, 2.0),)
#: the trigger of a failure that needs a row the rejection removes (:func:`trigger`)
REJECTED_ROW = "a row removed by rollout rejection"
#: the TIS cap of the TIS variant (verl ``rollout_is_threshold`` default)
IS_CAP = 2.0
#: the cap of the sequence-TIS variant (SkyRL's ``sequence_tis_ratio_clip_high`` default): one weight per row,
#: min(exp(Σ log(π_old/π_rollout)), cap), whose drawn rows fall on both sides of it (:data:`SEQ_ROW_LOG_RATIOS`)
SEQ_IS_CAP = 5.0
#: the KL loss of the KL variants: a coefficient large enough to move the gradient, with verl's default estimator
#: (k3, ``low_var_kl``) or k1 (log π/π_ref) or k2 (½ (log π/π_ref)², verl ``mse``)
KL = {"kl_loss_coef": 0.1, "kl_loss_type": "low_var_kl"}
#: the KL variant's estimator -> the step variant that draws it
KL_VARIANTS = {"low_var_kl": "token-mean-with-kl", "k1": "token-mean-with-kl-k1", "k2": "token-mean-with-kl-k2"}
#: the reference model of the KL variant: the current parameters plus this much noise (|log π/π_ref| stays far
#: below the k3 clamp's 2.61)
REF_NOISE = (0.1, 0.2)
#: the GSPO variant's policy loss and clip bounds (Zheng et al. 2025, arXiv:2507.18071, the clip range of its experiments: 3e-4 / 4e-4; neither
#: engine forces them: verl reads the actor's clip_ratio_low / _high, SkyRL eps_clip_low / _high); no dual clip
GSPO = {"policy_loss": "gspo", "clip_ratio_low": 3e-4, "clip_ratio_high": 4e-4}
#: catalog variant -> (loss_agg_mode, its other knobs: rollout correction ``is_level`` / ``is_cap`` and
#: ``rejection`` options; a KL loss ``kl_loss_coef`` / ``kl_loss_type``; another policy loss than vanilla
#: ``policy_loss`` and its clip ratios)
VARIANTS = {
    "token-mean": ("token-mean", {}),
    "seq-mean-token-mean": ("seq-mean-token-mean", {}),
    "token-mean-with-tis": ("token-mean", {"is_level": "token", "is_cap": IS_CAP}),
    "token-mean-with-seq-tis": ("token-mean", {"is_level": "sequence_product", "is_cap": SEQ_IS_CAP}),
    "token-mean-with-rejection": ("token-mean", {"rejection": REJECTION}),
    "seq-mean-token-mean-with-rejection": ("seq-mean-token-mean", {"rejection": REJECTION}),
    "token-mean-with-token-mask": ("token-mean", {"rejection": TOKEN_MASK}),
    **{name: ("token-mean", dict(KL, kl_loss_type=estimator)) for estimator, name in KL_VARIANTS.items()},
    # GSPO's own loss reduction: the paper's sequence mean, which verl (compute_policy_loss_gspo's docstring) and
    # SkyRL (gspo_policy_loss warns otherwise) recommend
    "seq-mean-token-mean-with-gspo": ("seq-mean-token-mean", GSPO),
}
MODES = tuple(VARIANTS)
DATA = "trainer_batches"
REGIMES = {variant_regime(mode, DATA): ("float32",) for mode in MODES}
#: per-row mean log-ratio log(π_old/π_rollout) of the rollout log-probs: kept (0, 0.1) or rejected (±0.5) by
#: :data:`REJECTION`, each ≥ 10 % inside or outside its bound; per-token spread ±0.3 around it, so that token
#: ratios fall on both sides of the TIS cap (log 2 ≈ 0.69), never within 0.1 of it
ROW_LOG_RATIOS = (0.0, 0.1, -0.5, 0.5)
TOKEN_SPREAD = 0.3
#: per-row Σ log(π_old/π_rollout) over the valid tokens, for the sequence-TIS variant: the row's ratio below the cap
#: (0, 0.5, −1: ratios 1, 1.65, 0.37) or above it (2, 3: ratios 7.39, 20.1), each ≥ 10 % from :data:`SEQ_IS_CAP`
#: (1.65 is 0.33·cap, 7.39 is 1.48·cap); spread over the row's tokens evenly, plus the zero-sum ±0.3 token spread
SEQ_ROW_LOG_RATIOS = ((0.0, 0.5, -1.0), (2.0, 3.0))
#: per-token log(π_old/π_rollout) for the token-mask variant: inside :data:`TOKEN_MASK`'s band (ratios 1, 1.35, 0.74,
#: 1.65, 0.61: kept) or outside it (2.72, 0.37, 4.48, 0.22: masked), each ≥ 10 % (in ratio) from both bounds (1.65 is
#: 2 / 1.21, 0.61 is 0.5 · 1.21; 2.72 is 2 · 1.36, 0.37 is 0.5 / 1.36)
TOKEN_BAND_LOG_RATIOS = ((0.0, 0.3, -0.3, 0.5, -0.5), (1.0, -1.0, 1.5, -1.5))
GARBAGE = (np.nan, np.inf, -np.inf, 1e30)
#: the numbers of mini-batches (optimizer steps, one PPO epoch, in order) the mini-batch run may cut the batch into: the
#: most that divides the rows and leaves every mini-batch a kept token (:func:`mini_batches`)
MINI_BATCHES = (1, 2, 3)
#: the trigger of a failure that needs the batch cut into several mini-batches (:func:`trigger`)
SEVERAL_MINI_BATCHES = "more than one mini-batch"
#: the reference keywords of a declared convention that only several mini-batches make a difference to
MINI_BATCH_CONVENTION_KEYS = frozenset({"mini_batch_mean_metrics"})
#: the sampling temperatures drawn; 1 first, so that a failure that needs a temperature ≠ 1 shrinks to one and
#: one that does not shrinks to 1
TEMPERATURES = (1.0, 0.7, 1.3, 0.6)
CLIP = {"clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "clip_ratio_c": 3.0}
#: metrics a step logs only when the entropy bonus is on
OPTIONAL_METRICS = ("entropy_loss",)
#: metrics of the dual clip, which only the vanilla loss has (verl's GSPO logs a constant 0)
DUAL_CLIP_METRICS = ("pg_clipfrac_lower",)
#: the old (proximal) parameters: the current ones plus this much noise (0: on-policy, ratio 1)
OFF_POLICY = (0.3, 0.0, 0.05)
#: the GSPO variant's proximal noise: 0.002 first (row ratios around the 3e-4 / 4e-4 clip band, rows inside and
#: outside it in one batch), on-policy (every row inside), far off-policy (every row outside)
GSPO_OFF_POLICY = (0.002, 0.0, 0.05)
#: a GSPO row's mean log-ratio is drawn at least this fraction of the clip band's width from each clip bound in log
#: space: float32 engines decide each row's clip as the exact step does (their rounding of it is ~1e-7)
GSPO_MARGIN = 0.1

#: the step's float32 computation of a tiny model with drawn, well-scaled parameters rounds to ~1e-6 relative (its
#: tolerance comes from the float32 step); an error beyond 1e-4 relative is no rounding of it (an entropy bonus that
#: counts the padding moves the gradient by ~1e-3): graded a wrong value, not ``precision``
STEP_WRONG_REL = 1e-4
#: the op that checks what trains the model (old log-probs, parameter gradient) and the one that checks what the
#: step logs: one step, two ops, so that a wrong logged metric (caught first when shrinking) never hides a wrong
#: gradient of the same step
STEP_OP, METRICS_OP = "policy_step", "policy_step_metrics"
#: a step finding's examples and shrinking steps in the ``dev`` and ``ci`` profiles: one example runs the engine's
#: whole step up to five times (each micro-batch cut, DP 2, a token budget, the mini-batch run) and one shrinking step
#: as much, so a ci finding of the step costs what a metric pipeline's does. 10 examples: every step finding of
#: verl 0.9.1 and SkyRL 0.4.0 fails by its 9th (the committed reports' ``examples_to_first_failure``); the
#: nightly profile keeps its own numbers
STEP_CAP = ExampleCap(10, 20, profiles=("dev", "ci"))
_SOURCE = ("one PPO step of a tiny embedding + LM-head model: old log-probs at the proximal parameters, the clipped "
           "loss and entropy bonus over the mini-batch, {what} (verl workers/utils/losses.py ppo_loss; Schulman et "
           "al. 2017, arXiv:1707.06347)")


#: the KL estimators in words (Δ = log π − log π_ref)
KL_WORDS = {"low_var_kl": "k3 (low_var_kl: e^(−Δ) + Δ − 1, clamped)", "k1": "k1 (Δ)", "k2": "k2 (½ Δ², verl mse)"}


def _parameters(variant: str) -> str:
    """The variant's knobs in words, as a row, replay and explain print them."""
    mode, rc = VARIANTS[variant]
    words = [f"loss_agg_mode {mode}"]
    if rc.get("policy_loss") == "gspo":
        words.append(f"GSPO loss: one ratio per row s = exp(mean over its valid tokens of log(π/π_old)), "
                     f"straight-through at each token (s·π/sg(π)), clip εl {rc['clip_ratio_low']:g}, "
                     f"εh {rc['clip_ratio_high']:g}, no dual clip")
    else:
        words.append("clip ε 0.2, dual-clip c 3")
    if rc.get("is_level") == "token":
        words.append(f"token TIS: weight min(π_old/π_rollout, {rc['is_cap']:g}), no gradient")
    elif rc.get("is_level"):
        words.append(f"sequence TIS: one weight per row, min(exp(Σ_valid tokens log(π_old/π_rollout)), "
                     f"{rc['is_cap']:g}), at each of its valid tokens, no gradient")
    for level, est, lower, upper in rc.get("rejection", ()):
        if level == "token":
            words.append(f"token mask ({level} {est}): a token kept, weight 1, for {lower:g} ≤ r ≤ {upper:g} "
                         "(r = π_old/π_rollout), out of the loss and its count otherwise, no TIS weight")
            continue
        words.append(f"rejection {level.replace('_', '-')} {est}: a row kept for {lower:g} ≤ r ≤ {upper:g} "
                     "(r = π_old/π_rollout)")
    if rc.get("kl_loss_coef"):
        words.append(f"KL loss {KL_WORDS[rc['kl_loss_type']]} × {rc['kl_loss_coef']:g} against a frozen reference "
                     "model")
    return "; ".join(words)


OPS = tuple(
    OpInfo(name, "policy_step", None, (MATCHES_REFERENCE, PARTITION_INVARIANT, MASK_INVARIANT), REGIMES,
           reference_function("policy_step"), source=_SOURCE.format(what=what), family="policy_step",
           variants=MODES, profile_regimes=profile_regimes(REGIMES),
           variant_parameters={v: _parameters(v) for v in VARIANTS}, wrong_rel=STEP_WRONG_REL,
           example_caps={regime: STEP_CAP for regime in REGIMES})
    for name, what in ((STEP_OP, "the old log-probs and the gradient with respect to the parameters"),
                       (METRICS_OP, "the metrics the step logs (pg_loss, entropy_loss, pg_clipfrac, ppo_kl, ...)")))


def _token_band_log_ratios(draw, mask: np.ndarray) -> np.ndarray:
    """Per-token log(π_old/π_rollout) float64 ``[B, R]`` for the token-mask variant (0 at masked positions): each
    valid token's drawn from :data:`TOKEN_BAND_LOG_RATIOS` (inside the band first, so that a shrunk example keeps
    only the masked tokens its failure needs), one drawn token of one row inside the band (the step keeps a token),
    and, when two rows or more have a valid token, the next such row's every token outside it (a row the mask
    empties)."""
    inside, outside = TOKEN_BAND_LOG_RATIOS
    delta = np.zeros(mask.shape)
    live = np.flatnonzero(mask.any(1))
    for i in live:
        delta[i, mask[i]] = [draw(st.sampled_from(inside + outside)) for _ in range(int(mask[i].sum()))]
    pick = draw(st.integers(0, len(live) - 1))
    at = np.flatnonzero(mask[live[pick]])
    delta[live[pick], at[draw(st.integers(0, len(at) - 1))]] = draw(st.sampled_from(inside))
    if len(live) > 1:
        emptied = live[(pick + 1) % len(live)]
        delta[emptied, mask[emptied]] = [draw(st.sampled_from(outside)) for _ in range(int(mask[emptied].sum()))]
    return delta


def _rollout_log_probs(draw, inp: dict, sequence: bool = False, token_band: bool = False) -> np.ndarray:
    """The rollout's log-probs float32 ``[B, R]`` (module doc): the exact proximal log-probs minus a per-row log-ratio
    of :data:`ROW_LOG_RATIOS` (one row kept, one rejected when there are two) plus a zero-sum per-token spread;
    0 at masked positions, as a trainer pads them. ``sequence``: each row's log-ratios sum to one of
    :data:`SEQ_ROW_LOG_RATIOS` instead (one row below the sequence cap, one above it when two rows have a valid
    token); ``token_band``: each token's log-ratio is drawn on its own, inside or outside :data:`TOKEN_MASK`'s band
    (:func:`_token_band_log_ratios`)."""
    mask = np.asarray(inp["response_mask"], bool)
    rows = len(mask)
    old = R.step_log_probs(inp["old_embed"], inp["old_head"], inp["input_ids"], mask.shape[1],
                           float(np.float32(inp["temperature"])))
    if token_band:
        return np.where(mask, old - _token_band_log_ratios(draw, mask), 0.0).astype(np.float32)
    if sequence:
        live = np.flatnonzero(mask.any(1))
        below, above = SEQ_ROW_LOG_RATIOS
        sums = {int(i): draw(st.sampled_from(below + above)) for i in live}
        pick = draw(st.integers(0, len(live) - 1))
        sums[int(live[pick])] = draw(st.sampled_from(below))
        if len(live) > 1:
            sums[int(live[(pick + 1) % len(live)])] = draw(st.sampled_from(above))
        shifts = [sums.get(i, 0.0) / max(int(mask[i].sum()), 1) for i in range(rows)]
    else:
        shifts = [draw(st.sampled_from(ROW_LOG_RATIOS)) for _ in range(rows)]
        kept_row = draw(st.integers(0, rows - 1))
        shifts[kept_row] = draw(st.sampled_from(ROW_LOG_RATIOS[:2]))
        if rows > 1:
            shifts[(kept_row + 1) % rows] = draw(st.sampled_from(ROW_LOG_RATIOS[2:]))
    delta = np.zeros(mask.shape)
    for i in range(rows):
        at = np.flatnonzero(mask[i])
        spread = np.zeros(len(at))
        half = len(at) // 2
        spread[:half], spread[half:2 * half] = TOKEN_SPREAD, -TOKEN_SPREAD  # sums to 0 over the row
        delta[i, at] = shifts[i] + np.asarray(draw(st.permutations(list(spread))))
    return np.where(mask, old - delta, 0.0).astype(np.float32)


@st.composite
def inputs(draw, variant: str):
    """A trainer's batch (module doc) as NumPy arrays, the model's parameters and the step's knobs."""
    rows = draw(st.sampled_from((2, 4, 3, 6)))
    prompt_width = draw(st.integers(1, 3))
    response_width = draw(st.integers(2, 5))
    vocab = draw(st.integers(4, 9))
    hidden = draw(st.integers(2, 4))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    prompt_len = [draw(st.integers(1, prompt_width)) for _ in range(rows)]
    response_len = [draw(st.integers(1, response_width)) for _ in range(rows)]
    response_len[draw(st.integers(0, rows - 1))] = response_width  # a row cut at the maximum length
    width = prompt_width + response_width
    attention = np.zeros((rows, width), np.int64)
    for i in range(rows):
        attention[i, prompt_width - prompt_len[i]: prompt_width + response_len[i]] = 1
    input_ids = rng.integers(0, vocab, size=(rows, width)) * attention
    response_mask = attention[:, prompt_width:].copy()
    for i in range(rows):  # interior observation tokens (multi-turn): masked, still the model's input
        if response_len[i] >= 3 and draw(st.booleans()):
            a = draw(st.integers(1, response_len[i] - 2))
            b = draw(st.integers(a + 1, response_len[i] - 1))
            response_mask[i, a:b] = 0
    per_row_level = (VARIANTS[variant][1].get("is_level") == "sequence_product"
                     or VARIANTS[variant][1].get("policy_loss") == "gspo")
    if per_row_level and rows >= 3 and draw(st.booleans()):
        # a row with no valid token (overlong filtering zeroes a truncated response's loss mask, SkyRL's
        # apply_overlong_filtering): the sequence level's per-row statistics must not count it, and GSPO's row mean
        # of nothing must not reach the loss
        response_mask[draw(st.integers(0, rows - 1))] = 0
    per_row = draw(st.booleans())
    adv = (rng.normal(size=(rows, 1)) * np.ones((1, response_width)) if per_row
           else rng.normal(size=(rows, response_width)))
    embed = rng.normal(size=(vocab, hidden))
    head = rng.normal(size=(vocab, hidden))
    gspo = VARIANTS[variant][1].get("policy_loss") == "gspo"
    noise = draw(st.sampled_from(GSPO_OFF_POLICY if gspo else OFF_POLICY))
    divisors = [d for d in range(1, rows + 1) if rows % d == 0]
    micro = draw(st.sampled_from(divisors[::-1]))  # the whole mini-batch first: a split shrinks away unless needed
    mode, correction = VARIANTS[variant]
    lengths = attention.sum(1)
    inp = {
        "input_ids": input_ids, "attention_mask": attention, "response_mask": response_mask,
        "advantages": (adv * response_mask).astype(np.float32),
        "embed": embed, "head": head,
        "old_embed": embed + noise * rng.normal(size=embed.shape),
        "old_head": head + noise * rng.normal(size=head.shape),
        "temperature": draw(st.sampled_from(TEMPERATURES)), "entropy_coeff": draw(st.sampled_from((0.0, 0.01))),
        "mode": mode, "variant": variant, "micro_batch_sizes": [micro] + [d for d in divisors if d != micro],
        # dynamic batch size: micro-batches of at most this many tokens (prompt + response; ≥ the longest row)
        "token_budgets": sorted({int(lengths.max()), max(int(lengths.max()), int(lengths.sum()) // 2)}),
        "garbage": draw(st.sampled_from(GARBAGE)), "seed": seed,
    }
    if gspo:
        assume(_gspo_rows_clear_of_the_clip_bounds(inp))
    if "is_level" in correction or "rejection" in correction:
        inp["rollout_log_probs"] = _rollout_log_probs(draw, inp, correction.get("is_level") == "sequence_product",
                                                      token_band=token_level(correction))
    if correction.get("kl_loss_coef"):
        scale = draw(st.sampled_from(REF_NOISE))
        inp["ref_embed"] = embed + scale * rng.normal(size=embed.shape)
        inp["ref_head"] = head + scale * rng.normal(size=head.shape)
    return inp


def token_level(correction: dict) -> bool:
    """Whether a variant's rejection decides per token (:data:`TOKEN_MASK`) rather than per row."""
    return any(level == "token" for level, *_ in correction.get("rejection", ()))


def gspo_row_log_ratios(inp: dict) -> np.ndarray:
    """The exact mean log-ratio log(π/π_old) of each row over its valid tokens, float64 ``[B]`` (0 for a row with
    none): the log of the row's GSPO ratio."""
    mask = np.asarray(inp["response_mask"], bool)
    temperature = float(np.float32(inp["temperature"]))
    lp, old = (R.step_log_probs(np.asarray(inp[p + "embed"], np.float32), np.asarray(inp[p + "head"], np.float32),
                                inp["input_ids"], mask.shape[1], temperature) for p in ("", "old_"))
    return np.where(mask, lp - old, 0.0).sum(1) / np.maximum(mask.sum(1), 1)


def _gspo_rows_clear_of_the_clip_bounds(inp: dict) -> bool:
    """Whether every row's GSPO log-ratio is ≥ :data:`GSPO_MARGIN` of the clip band's width (in log space) from
    both clip bounds."""
    low, high = math.log1p(-GSPO["clip_ratio_low"]), math.log1p(GSPO["clip_ratio_high"])
    mean = gspo_row_log_ratios(inp)
    return bool((np.minimum(np.abs(mean - low), np.abs(mean - high)) >= GSPO_MARGIN * (high - low)).all())


def strategy(op: OpInfo, dtype: str, regime: str):
    variant, _ = split_regime(regime)
    return inputs(variant)


def variant_knobs(inp: dict) -> dict:
    """The knobs of the case's variant beyond its loss_agg_mode (:data:`VARIANTS`; a case saved before the
    variants had any: none)."""
    return VARIANTS.get(inp.get("variant", inp["mode"]), (None, {}))[1]


def trainer_batch(inp: dict, advantages: np.ndarray | None = None, input_ids: np.ndarray | None = None,
                  rollout_log_probs: np.ndarray | None = None) -> dict:
    """The trainer's padded batch (:class:`~rlconform.harness.core.contracts.PolicyStep`) as CPU tensors."""
    ids = torch.from_numpy(np.asarray(inp["input_ids"] if input_ids is None else input_ids, np.int64))
    attention = torch.from_numpy(np.asarray(inp["attention_mask"], np.int64))
    response_mask = torch.from_numpy(np.asarray(inp["response_mask"], np.int64))
    width = response_mask.shape[1]
    adv = inp["advantages"] if advantages is None else advantages
    batch = {"prompts": ids[:, :-width].clone(), "responses": ids[:, -width:].clone(), "input_ids": ids,
             "attention_mask": attention, "position_ids": (attention.cumsum(1) - 1).clamp(min=0),
             "response_mask": response_mask, "advantages": torch.from_numpy(np.asarray(adv, np.float32))}
    rollout = inp.get("rollout_log_probs") if rollout_log_probs is None else rollout_log_probs
    if rollout is not None:
        batch["rollout_log_probs"] = torch.from_numpy(np.asarray(rollout, np.float32))
    return batch


def clip(inp: dict) -> dict:
    """The clip ratios of ``inp``'s variant: :data:`CLIP`, or the variant's own (GSPO's)."""
    rc = variant_knobs(inp)
    return {k: rc.get(k, v) for k, v in CLIP.items()}


def policy_loss_variant(inp: dict) -> str:
    """The policy loss of ``inp``'s variant: ``"vanilla"`` (PPO with dual clip) or ``"gspo"``."""
    return variant_knobs(inp).get("policy_loss", "vanilla")


def mini_batches(inp: dict, step=None) -> int:
    """The mini-batches of ``inp``'s mini-batch run (1: none): its ``mini_batches`` if it names a count (a test's
    case), else the most of :data:`MINI_BATCHES` that divides its rows and leaves every mini-batch a kept token (a
    valid token its rejection keeps); 1 for a ``step`` whose binding does not drive several
    (:attr:`~rlconform.harness.core.contracts.PolicyStep.mini_batches`)."""
    if step is not None and not getattr(step, "mini_batches", False):
        return 1
    if "mini_batches" in inp:
        return int(inp["mini_batches"])
    rows = len(inp["input_ids"])
    kept = np.asarray(inp["response_mask"], bool).any(1)
    kept[rejected_rows(inp)] = False
    return max(k for k in MINI_BATCHES
               if rows % k == 0 and all(kept[a:a + rows // k].any() for a in range(0, rows, rows // k)))


def knobs(inp: dict, micro_batch_size: int, token_budget: int | None = None, dp_size: int = 1,
          mini_batch_size: int | None = None) -> dict:
    """The step's knobs (:class:`~rlconform.harness.core.contracts.PolicyStep`) for ``inp``'s variant;
    ``mini_batch_size``: rows per mini-batch (None: every row, one mini-batch)."""
    rc = variant_knobs(inp)
    out = {"temperature": float(inp["temperature"]), "loss_agg_mode": inp["mode"],
           "entropy_coeff": float(inp["entropy_coeff"]), "micro_batch_size": int(micro_batch_size),
           "mini_batch_size": int(mini_batch_size or len(inp["input_ids"])), **clip(inp),
           "policy_loss": policy_loss_variant(inp), "dp_size": int(dp_size),
           "max_token_len": None if token_budget is None else int(token_budget),
           "rollout_is": rc.get("is_level"), "rollout_is_cap": rc.get("is_cap"),
           "rollout_rejection": tuple(rc.get("rejection", ())), "kl_loss_coef": float(rc.get("kl_loss_coef", 0.0))}
    if out["kl_loss_coef"]:
        out.update(kl_loss_type=rc["kl_loss_type"], ref_params=params(inp, "ref_"))
    return out


def params(inp: dict, old: bool | str = False) -> dict:
    """The model's float32 parameters (:data:`~rlconform.harness.core.tiny_lm.PARAMETERS`) as fresh tensors: the
    current ones, the proximal ones (``old=True``) or the reference model's (``old="ref_"``)."""
    prefix = old if isinstance(old, str) else "old_" if old else ""
    return {"embed.weight": torch.tensor(np.asarray(inp[prefix + "embed"], np.float32)),
            "head.weight": torch.tensor(np.asarray(inp[prefix + "head"], np.float32))}


def run_step(step, inp: dict, micro_batch_size: int, token_budget: int | None = None, dp_size: int = 1,
             mini_batch_count: int = 1, **batch_changes) -> dict:
    """One call of the engine's step with fresh parameters (its gradient starts from nothing); ``token_budget``:
    micro-batches by token count (dynamic batch size) instead of ``micro_batch_size`` rows; ``dp_size``: the update
    on that many DP ranks; ``mini_batch_count``: the rows cut into that many mini-batches (one optimizer step
    each)."""
    mini = len(inp["input_ids"]) // mini_batch_count
    return call_engine("policy_step.run", step.run, trainer_batch(inp, **batch_changes), params(inp),
                       params(inp, old=True), knobs(inp, micro_batch_size, token_budget, dp_size, mini))


def faithful(inp: dict, conventions: dict | None = None, mini_batch_count: int = 1) -> dict:
    """The step in float32 torch on each mini-batch at once (no micro-batches): the dtype-faithful values
    whose distance from the float64 step sets the tolerance; ``conventions``: the declared aggregation modes
    (``entropy_agg_mode``, ``kl_agg_mode``) the reference follows; ``mini_batch_count``: the mini-batches."""
    mini = len(inp["input_ids"]) // mini_batch_count
    kn = dict(knobs(inp, mini, mini_batch_size=mini), **(conventions or {}))
    return fp32_step(trainer_batch(inp), params(inp), params(inp, old=True), kn)


# -- the float32 step the reference binding runs (and its mutants bend) ---------------------------------------

def _log_probs(model, batch, temperature, times=1):
    width = batch["responses"].shape[1]
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                   position_ids=batch["position_ids"], use_cache=False).logits[:, -width - 1:-1, :]
    for _ in range(times):
        logits = logits / temperature
    logp = torch.log_softmax(logits.float(), dim=-1)
    lp = logp.gather(-1, batch["responses"].unsqueeze(-1)).squeeze(-1)
    return lp, -(logp.exp() * logp).sum(-1)


def _agg(x, m, mode, nnz, rows, multiply=False):
    kept = x * m if multiply else torch.where(m, x, 0.0)
    if mode == "token-mean":
        return kept.sum() / nnz
    return (kept.sum(1) / m.sum(1).clamp(min=1)).sum() / rows


def _rejected(old_lp, batch, mask, options) -> torch.Tensor:
    """The kept mask of the rejection ``options`` for the proximal log-probs against the rollout's (a decision of
    the exact statistic: the drawn rollout log-probs keep every row far from a bound)."""
    kept = R.rollout_rejection_mask(old_lp.double().numpy(), batch["rollout_log_probs"].double().numpy(),
                                    mask.numpy(), options)
    return torch.from_numpy(kept > 0)


#: the policy losses of the float32 step (:func:`rlconform.reference.policy_loss`'s names)
STEP_POLICY_LOSSES = ("vanilla", "gspo")
#: the TIS levels of the float32 step (:func:`rlconform.reference.importance_ratio`'s names)
IS_LEVELS = ("token", "sequence_product")


def _ratio(lp, rollout, m, level: str) -> torch.Tensor:
    """π/π_rollout at the valid tokens of ``m`` (0 elsewhere): per token, or (``sequence_product``) each row's
    exp(Σ log-ratio over its valid tokens) at every valid token of the row."""
    log_ratio = torch.where(m, lp - rollout, 0.0)
    if level == "sequence_product":
        log_ratio = log_ratio.sum(1, keepdim=True).expand_as(log_ratio)
    return torch.where(m, torch.exp(log_ratio), 0.0)


def _k3(lp, ref):
    d = ref - lp  # e^d − d − 1, clamped as verl and SkyRL clamp it
    return (torch.exp(d.clamp(-20, 20)) - d - 1).clamp(-10, 10)


#: the float32 step's KL estimators (log-probs, reference log-probs) -> per-token KL, by verl's and SkyRL's names
FP32_KL = {"low_var_kl": _k3, "k3": _k3, "k1": lambda lp, ref: lp - ref, "kl": lambda lp, ref: lp - ref,
           "k2": lambda lp, ref: 0.5 * (lp - ref).square(), "mse": lambda lp, ref: 0.5 * (lp - ref).square()}


def fp32_step(batch, params, old_params, kn, *, temperature_times: int = 1, old_temperature: bool = True,
              micro_normaliser: bool = False, zero_masked_advantages: bool = True,
              metric_micro_means: bool = False, weight_from_current: bool = False,
              count_before_rejection: bool = False, ref_temperature: bool = True,
              fraction_after_truncation: bool = False, rank_normaliser: bool = False,
              kl_type_ignored: bool = False, token_mask_ignored: bool = False,
              batch_normaliser: bool = False) -> dict:
    """A plain float32 step of :class:`~rlconform.harness.core.tiny_lm.TinyLM`: old log-probs with ``old_params``
    (no gradient), then for each mini-batch (``kn["mini_batch_size"]`` rows, default every row; one optimizer step
    each, the gradient recorded and cleared, the parameters not moved) the micro-batch loop (rows
    ``[a, a + micro_batch_size)``) with the mini-batch's normaliser, one backward per micro-batch, gradients
    accumulated; metrics token-weighted over the whole batch (a name in ``kn["mini_batch_mean_metrics"]``: the mean
    over the mini-batches of each one's value). With a rollout correction in ``kn`` the rejected
    tokens leave the mask before anything is counted and the TIS weight min(exp(old − rollout), cap) (per token, or
    with ``rollout_is="sequence_product"`` one per row, exp of the row's summed log-ratio), a constant, multiplies
    each token's loss. The keyword flaws are the mutants' (the reference binding passes none): the
    current logits divided ``temperature_times`` times, the old path without temperature, each micro-batch
    normalised by its own count, masked advantages kept (NaN · 0), the token fractions logged as the mean of
    per-micro-batch means, the TIS weight from the current log-probs (it moves with the policy and carries a
    gradient), the normaliser counted before the rejection, the reference model's log-probs without temperature,
    the fraction of weights above the cap counted after the truncation (so none is above it), each DP rank's loss
    normalised by its own token count (or rows) and the ranks' gradients averaged (a rank-scoped normaliser), the
    configured KL estimator ignored (k3 whatever ``kl_loss_type`` says), the token-level rejection options (a token
    mask) dropped while the row-level ones still apply, each mini-batch normalised by the whole batch's token count
    (or rows) instead of its own (a normaliser scoped to the generation batch).
    With ``kn["policy_loss"] == "gspo"`` each row's ratio is exp of its mean log-ratio over the valid tokens,
    straight-through at each token (GSPO-token), clipped, without the dual clip, and ``pg_clipfrac_lower`` is not
    logged.
    With ``kn["dp_size"]`` = D > 1 each mini-batch's rows are D contiguous rank chunks, each cut into micro-batches
    of its own; the mini-batch's normaliser makes the result the one-rank step's.
    With ``kl_loss_coef`` the KL estimate ``kn["kl_loss_type"]`` (:data:`FP32_KL`) to the reference model
    ``kn["ref_params"]`` at the same temperature is added, aggregated by ``kl_agg_mode`` (default: the loss's
    mode).
    Returns ``{"old_log_probs": [B, R], "grads": {name: tensor}, "metrics": {name: float}}``; with several
    mini-batches ``grads`` is a list, one dict per mini-batch in order."""
    model, old_model = TinyLM(params), TinyLM(old_params)
    T, mode, c_ent = kn["temperature"], kn["loss_agg_mode"], kn["entropy_coeff"]
    h_mode = kn.get("entropy_agg_mode") or mode
    lo, hi, cc = kn["clip_ratio_low"], kn["clip_ratio_high"], kn["clip_ratio_c"]
    m_batch = batch["response_mask"].bool()
    if kn.get("policy_loss", "vanilla") not in STEP_POLICY_LOSSES:
        raise ValueError(f"the float32 step has the policy losses {', '.join(STEP_POLICY_LOSSES)}, not "
                         f"{kn.get('policy_loss')!r}")
    gspo = kn.get("policy_loss") == "gspo"
    with torch.no_grad():
        old_lp, old_H = _log_probs(old_model, batch, T if old_temperature else 1.0)
    m_all = counted = m_batch
    options = tuple(kn.get("rollout_rejection") or ())
    if token_mask_ignored:
        options = tuple(o for o in options if o[0] != "token")
    if options:
        m_all = _rejected(old_lp, batch, m_batch, options)
        counted = m_batch if count_before_rejection or kn.get("rejection_normaliser") == "batch" else m_all
    weights, level, rollout = None, kn.get("rollout_is"), None
    if level:
        if level not in IS_LEVELS:
            raise ValueError(f"the float32 step has the TIS levels {', '.join(IS_LEVELS)}, not {level!r}")
        rollout = torch.where(m_all, batch["rollout_log_probs"], 0.0)
        weights = torch.where(m_all, torch.clamp(_ratio(old_lp, rollout, m_all, level), max=kn["rollout_is_cap"]),
                              0.0)

    def is_metrics(a: int, b: int) -> dict:  # the weights' diagnostics over the kept tokens of rows [a, b)
        if not level:
            return {}
        m, cap = m_all[a:b], kn["rollout_is_cap"]
        raw = _ratio(old_lp[a:b], rollout[a:b], m, level)
        of = {"applied": weights[a:b], "raw": raw, "raw_token": _ratio(old_lp[a:b], rollout[a:b], m, "token")}
        shown = of[kn.get("is_metric_weights") or "applied"][m]
        extremes = of[kn.get("is_extreme_weights") or kn.get("is_metric_weights") or "applied"][m]
        above = m & ((weights[a:b] if fraction_after_truncation else raw) > cap)
        # token level: a fraction of the kept tokens; sequence level: of the rows with a kept token
        high = above[m] if level == "token" else above.any(1)[m.any(1)]
        return {"rollout_is_mean": float(shown.mean()), "rollout_is_min": float(extremes.min()),
                "rollout_is_max": float(extremes.max()), "rollout_is_fraction_high": float(high.float().mean())}

    B = m_batch.shape[0]
    rows, nnz = int((counted.sum(1) > 0).sum()), counted.sum()
    ref_lp, kl_coef = None, float(kn.get("kl_loss_coef") or 0.0)
    if kl_coef:
        if kn.get("kl_loss_type") not in FP32_KL:
            raise ValueError(f"the float32 step has the KL estimators {', '.join(FP32_KL)}, not "
                             f"{kn.get('kl_loss_type')!r}")
        with torch.no_grad():
            ref_lp, _ = _log_probs(TinyLM(kn["ref_params"]), batch, T if ref_temperature else 1.0)
    kl_mode = kn.get("kl_agg_mode") or mode
    step = int(kn["micro_batch_size"])
    mini = int(kn.get("mini_batch_size") or B)
    dp = int(kn.get("dp_size") or 1)
    if B % mini:
        raise ValueError(f"{B} rows do not split into mini-batches of {mini} rows")
    rank_rows = mini // dp
    if dp > 1 and (mini % dp or rank_rows % step):
        raise ValueError(f"a mini-batch of {mini} rows does not split into {dp} ranks of {step}-row micro-batches")
    micro_means: list[tuple[float, float, float]] = []
    steps = []  # per mini-batch: (gradients, totals, token count, rows, mean of its micro-batch means)
    for a0 in range(0, B, mini):
        b0 = a0 + mini
        nnz_j, rows_j = counted[a0:b0].sum(), int((counted[a0:b0].sum(1) > 0).sum())
        if kn.get("max_token_len") and dp == 1:  # dynamic batch size: rows packed in order into ≤ the budget
            bounds, start, used = [], a0, 0
            for i, n in enumerate(batch["attention_mask"][a0:b0].sum(1).tolist(), start=a0):
                if used + n > kn["max_token_len"] and i > start:
                    bounds.append((start, i))
                    start, used = i, 0
                used += n
            bounds.append((start, b0))
        else:
            bounds = [(a, min(a + step, b0)) for a in range(a0, b0, step)]
        totals = {"pg_loss": 0.0, "entropy_loss": 0.0, "clipped": 0.0, "clipped_lower": 0.0, "neg_log_ratio": 0.0,
                  "kl_loss": 0.0}
        first_micro = len(micro_means)
        model.zero_grad(set_to_none=True)
        for a, b in bounds:
            micro = {k: v[a:b] for k, v in batch.items()}
            m = m_all[a:b]
            adv = micro["advantages"]
            if zero_masked_advantages:
                adv = torch.where(m, adv, 0.0)
            lp, H = _log_probs(model, micro, T, temperature_times)
            log_ratio = lp - old_lp[a:b]
            ratio = torch.exp(log_ratio)
            if gspo:  # one ratio per row (the mean log-ratio over its valid tokens), straight-through at each token
                row = torch.where(m, log_ratio, 0.0).sum(1, keepdim=True) / m.sum(1, keepdim=True).clamp(min=1)
                ratio = torch.exp(lp - lp.detach() + row.detach())
            l1, l2 = -adv * ratio, -adv * torch.clamp(ratio, 1 - lo, 1 + hi)
            c1 = torch.maximum(l1, l2)
            pg = c1 if gspo else torch.where(adv < 0, torch.minimum(-adv * cc, c1), c1)
            if weights is not None:
                w = weights[a:b]
                if weight_from_current:
                    roll = torch.where(m, micro["rollout_log_probs"], 0.0)
                    w = torch.where(m, torch.clamp(_ratio(lp, roll, m, level), max=kn["rollout_is_cap"]), 0.0)
                pg = pg * w
            n, r = (nnz, rows) if batch_normaliser else (nnz_j, rows_j)
            if micro_normaliser:
                n, r = m.sum(), int((m.sum(1) > 0).sum())
            if rank_normaliser and dp > 1:  # the rank's own count, its gradient averaged over the ranks
                lo_row = a0 + ((a - a0) // rank_rows) * rank_rows
                rank_mask = counted[lo_row:lo_row + rank_rows]
                n, r = rank_mask.sum() * dp, int((rank_mask.sum(1) > 0).sum()) * dp
            pg_part = _agg(pg, m, mode, n, r, multiply=not zero_masked_advantages)
            h_part = _agg(H, m, h_mode, n, r)
            loss = pg_part - c_ent * h_part
            if ref_lp is not None:
                estimator = FP32_KL["low_var_kl" if kl_type_ignored else kn["kl_loss_type"]]
                kl_part = _agg(estimator(lp, ref_lp[a:b]), m, kl_mode, n, r)
                loss = loss + kl_coef * kl_part
                totals["kl_loss"] += float(kl_part.detach())
            loss.backward()
            with torch.no_grad():
                totals["pg_loss"] += float(pg_part)
                totals["entropy_loss"] += float(h_part)
                totals["clipped"] += float(torch.where(m, (l2 > l1).float(), 0.0).sum())
                totals["clipped_lower"] += float(torch.where(m & (adv < 0), (c1 > -adv * cc).float(), 0.0).sum())
                totals["neg_log_ratio"] += float(torch.where(m, -log_ratio, 0.0).sum())
                k = max(float(m.sum()), 1.0)
                micro_means.append((float(torch.where(m, (l2 > l1).float(), 0.0).sum()) / k,
                                    float(torch.where(m & (adv < 0), (c1 > -adv * cc).float(), 0.0).sum()) / k,
                                    float(torch.where(m, -log_ratio, 0.0).sum()) / k))
        grads = {name: p.grad.detach().clone() for name, p in model.named_parameters()}
        steps.append((grads, totals, float(nnz_j), rows_j, micro_means[first_micro:], (a0, b0)))

    def share(agg_mode: str, count: float, nonempty: int) -> float:  # a mini-batch's weight in the batch's mean
        return count / float(nnz) if agg_mode == "token-mean" else nonempty / rows

    def logged(totals, count, means, loss_weight=lambda agg_mode: 1.0) -> dict:
        out = {"pg_loss": totals["pg_loss"] * loss_weight(mode),
               "entropy_loss": totals["entropy_loss"] * loss_weight(h_mode),
               "pg_clipfrac": totals["clipped"] / count, "pg_clipfrac_lower": totals["clipped_lower"] / count,
               "ppo_kl": totals["neg_log_ratio"] / count}
        if ref_lp is not None:
            out["kl_loss"] = totals["kl_loss"] * loss_weight(kl_mode)
        if metric_micro_means:
            for i, name in enumerate(("pg_clipfrac", "pg_clipfrac_lower", "ppo_kl")):
                out[name] = sum(v[i] for v in means) / len(means)
        return out

    # the whole batch, pooled: the losses weighted by each mini-batch's share of the batch's normaliser, the token
    # fractions over every token
    metrics = {name: 0.0 for name in ("pg_loss", "entropy_loss", "kl_loss")}
    for _, totals, count, nonempty, _, _ in steps:
        for name, agg_mode in (("pg_loss", mode), ("entropy_loss", h_mode), ("kl_loss", kl_mode)):
            metrics[name] += totals[name] * share(agg_mode, count, nonempty)
    pooled = {k: sum(s[1][k] for s in steps) for k in ("clipped", "clipped_lower", "neg_log_ratio")}
    metrics.update(logged(dict(pooled, **metrics), float(nnz), micro_means))
    metrics["entropy"] = float(_agg(old_H, m_batch, mode, m_batch.sum(), m_batch.shape[0]))
    if ref_lp is None:
        metrics.pop("kl_loss", None)
    metrics.update(is_metrics(0, B))
    per_mini = [dict(logged(totals, count, means), **is_metrics(*rows_of))
                for _, totals, count, _, means, rows_of in steps]
    for name in kn.get("mini_batch_mean_metrics") or ():
        if name in metrics and len(steps) > 1:
            metrics[name] = sum(s[name] for s in per_mini) / len(per_mini)
    if gspo:  # no dual clip: nothing it clips
        del metrics["pg_clipfrac_lower"]
    grads = [s[0] for s in steps]
    return {"old_log_probs": old_lp, "grads": grads[0] if len(grads) == 1 else grads, "metrics": metrics}


# -- evaluation -------------------------------------------------------------------------------------------

def _outputs(out, ref: dict, fa: dict, inp: dict, label: str, layout: dict, ev: Evaluation,
             logged=STEP_METRICS, op: str = STEP_OP, mini_batch_count: int = 1) -> tuple[list, list]:
    """(values, gradients) of one run of the step: old log-probs and parameter gradients (one of each parameter per
    mini-batch) for :data:`STEP_OP`, the logged metrics for :data:`METRICS_OP`; what is missing is a problem of
    ``ev``."""
    values, grads = [], []
    if not isinstance(out, dict):
        ev.problems.append(problem_clause("missing output", f"the step returned {type(out).__name__}, not a dict "
                                                            f"({label})"))
        return values, grads
    if op == METRICS_OP:
        return _metrics(out, ref, fa, inp, label, layout, ev, logged), []
    mask = np.asarray(inp["response_mask"], bool)
    old = out.get("old_log_probs")
    if old is None or tuple(np.shape(old)) != mask.shape:
        got = None if old is None else tuple(np.shape(old))
        ev.problems.append(problem_clause("missing output", f"old_log_probs: got shape {got}, expected {mask.shape} "
                                                            f"({label})"))
    else:
        values.append(Compared(f"old log-probs, {label}", _np(old), ref["old_log_probs"],
                               _np(fa["old_log_probs"]), "float32", "token_stat", only_where=mask, layout=layout))
    got = out.get("grads") or {}
    if mini_batch_count == 1:
        steps = [(got, ref, fa["grads"], "")]
    elif not isinstance(got, (list, tuple)) or len(got) != mini_batch_count:
        what = f"{len(got)} gradients" if isinstance(got, (list, tuple)) else f"a {type(got).__name__}"
        ev.problems.append(problem_clause("missing output", f"gradients: {what}, expected a list of "
                                                            f"{mini_batch_count}, one per mini-batch ({label})"))
        return values, grads
    else:  # one gradient per optimizer step; the rows in the label without a comma (sites read up to the first)
        n = mini_batch_count
        steps = [(g or {}, r, f, f" (mini-batch {j + 1} of {n}: rows {r['rows'][0]}–{r['rows'][1] - 1})")
                 for j, (g, r, f) in enumerate(zip(got, ref["steps"], fa["grads"]))]
    for got_j, ref_j, fa_j, which in steps:
        for name, key in (("embed.weight", "grad_embed"), ("head.weight", "grad_head")):
            g = got_j.get(name) if isinstance(got_j, dict) else None
            if g is None:
                ev.problems.append(problem_clause("missing gradient", f"no gradient for {name}{which} ({label})"))
                continue
            if tuple(np.shape(g)) != ref_j[key].shape:
                ev.problems.append(problem_clause("missing output", f"gradient of {name}{which}: shape "
                                                                    f"{tuple(np.shape(g))}, expected "
                                                                    f"{ref_j[key].shape} ({label})"))
                continue
            grads.append(Compared(f"gradient of {name}{which}, {label}", _np(g), ref_j[key], _np(fa_j[name]),
                                  "float32", "pipeline", quantity="gradient", layout=layout))
    return values, grads


def _metrics(out: dict, ref: dict, fa: dict, inp: dict, label: str, layout: dict, ev: Evaluation, logged) -> list:
    values = []
    metrics, keys = out.get("metrics") or {}, out.get("metric_keys") or {}
    for name in logged:
        # the catalog's name, and the key the engine logs it under (what its maintainer searches for)
        shown = f"metric {name}" + (f" ({keys[name]})" if keys.get(name) and keys[name] != name else "")
        if name not in metrics and name in OPTIONAL_METRICS and not inp["entropy_coeff"]:
            continue  # no entropy bonus: a trainer need not compute (or log) the entropy term
        if name == "kl_loss" and not variant_knobs(inp).get("kl_loss_coef"):
            continue  # no KL loss: nothing to log
        if name in STEP_IS_METRICS and not variant_knobs(inp).get("is_level"):
            continue  # no importance weights: no diagnostics of them
        if name in DUAL_CLIP_METRICS and policy_loss_variant(inp) != "vanilla":
            continue  # no dual clip (GSPO): nothing it clips
        if name not in metrics:
            ev.problems.append(problem_clause("lost metric", f"{shown} missing from the step's metrics "
                                                             f"{sorted(metrics)} ({label})"))
            continue
        values.append(Compared(f"{shown}, {label}", np.float64(float(metrics[name])),
                               np.float64(ref["metrics"][name]), np.float64(fa["metrics"][name]), "float32",
                               "pipeline", quantity="metric", layout=layout))
    return values


def _np(t) -> np.ndarray:
    return t.detach().double().numpy() if isinstance(t, torch.Tensor) else np.asarray(t, np.float64)


def _layout(inp: dict, micro: int, mini_batch_count: int = 1) -> dict:
    """The run's micro-batches (their response nnz, in order over the batch) and, when several, its mini-batches."""
    mask = np.asarray(inp["response_mask"], bool)
    out = {"parts": "micro-batches", "nnz": [int(mask[a:a + micro].sum()) for a in range(0, len(mask), micro)]}
    if mini_batch_count > 1:
        out["mini_batches"] = int(mini_batch_count)
    return out


def _rejection_words(inp: dict) -> str:
    """What the variant's rejection removes from the loss mask, as the label's tail: the rows it empties (", row 1
    rejected") and, for a token mask, the tokens (", 3 of 8 valid tokens masked, every one of row 1"); empty without a
    rejection."""
    kept = kept_mask(inp)
    if kept is None:
        return ""
    mask = np.asarray(inp["response_mask"], bool)
    rows = np.flatnonzero(mask.any(1) & ~kept.any(1))
    listed = ", ".join(str(int(i)) for i in rows)
    if not token_level(variant_knobs(inp)):
        return f", row{'s' if len(rows) > 1 else ''} {listed} rejected" if len(rows) else ""
    masked = int((mask & ~kept).sum())
    every = f", every one of row{'s' if len(rows) > 1 else ''} {listed}" if len(rows) else ""
    return f", {masked} of {int(mask.sum())} valid tokens masked{every}"


def _label(inp: dict, micro: int, rejected: str = "", token_budget: int | None = None,
           mini_batch_count: int = 1) -> str:
    """The run's label: variant, temperature, entropy coefficient, how the batch was cut into mini-batches (when
    several) and each mini-batch into micro-batches (with ``token_budget``, one mini-batch, by the engine's own
    packing into micro-batches of at most that many tokens: only the mini-batch's nnz is known here) and
    ``rejected`` (:func:`_rejection_words`)."""
    mask = np.asarray(inp["response_mask"], bool)
    mini = len(mask) // mini_batch_count
    if token_budget is None:
        cut = f"{micro}-row micro-batches, nnz {_layout(inp, micro)['nnz']}"
    else:  # the engine packs the rows (verl balances them): only the budget and the rows' lengths are known here
        lengths = [int(n) for n in np.asarray(inp["attention_mask"]).sum(1)]
        cut = (f"dynamic micro-batches packed by the engine to ≤ {token_budget} prompt + response tokens each "
               f"(rows of {lengths} tokens), response nnz {int(mask.sum())} in all")
    if mini_batch_count > 1:
        cut = f"{mini_batch_count} mini-batches of {mini} rows (one optimizer step each), {cut}"
    return (f"{inp.get('variant', inp['mode'])}, T {inp['temperature']}, entropy_coeff {inp['entropy_coeff']}, "
            f"{cut}{rejected}")


def _exact(inp: dict, conventions: dict, mini_batch_count: int = 1) -> dict:
    """The exact step of ``inp`` (:func:`rlconform.reference.policy_step`) with the declared ``conventions``, its rows
    cut into ``mini_batch_count`` mini-batches."""
    rc = variant_knobs(inp)
    return R.policy_step(inp["embed"].astype(np.float32), inp["head"].astype(np.float32),
                         inp["old_embed"].astype(np.float32), inp["old_head"].astype(np.float32),
                         inp["input_ids"], inp["response_mask"], inp["advantages"],
                         temperature=float(np.float32(inp["temperature"])), loss_agg_mode=inp["mode"],
                         entropy_coeff=float(inp["entropy_coeff"]), **clip(inp), **conventions,
                         policy_loss_variant=policy_loss_variant(inp),
                         **{k: inp[k].astype(np.float32) for k in ("ref_embed", "ref_head") if k in inp},
                         kl_loss_coef=float(rc.get("kl_loss_coef", 0.0)), kl_loss_type=rc.get("kl_loss_type", "k3"),
                         rollout_log_probs=inp.get("rollout_log_probs"), rollout_is=rc.get("is_level"),
                         rollout_is_cap=rc.get("is_cap"), rejection=tuple(rc.get("rejection", ())),
                         mini_batches=mini_batch_count)


def evaluate(binding, case) -> Evaluation:
    step = binding.resolve(case.op)
    inp = case.inputs
    variant = inp.get("variant", inp["mode"])
    if variant not in step.modes:
        raise VariantNotProvided(case.op, variant, binding.name)
    declared = getattr(binding, "declared", ())
    conventions = followed(declared, case.op, case.regime)  # SkyRL's token-mean entropy bonus
    ref = _exact(inp, conventions)
    fa = faithful(inp, conventions)
    mask = np.asarray(inp["response_mask"], bool)
    rejected = _rejection_words(inp)
    micro_sizes = inp["micro_batch_sizes"]
    # the mini-batch run (matches_reference only: the invariances compare runs of one mini-batch)
    count = mini_batches(inp, step) if case.property == MATCHES_REFERENCE else 1
    ev = Evaluation()
    if conventions:  # the first declared convention the reference follows (one of several mini-batches: count > 1)
        ev.declared = next((d.name for d in declared if d.kind == "convention" and d.reference
                            and d.concerns(case.op, variant)
                            and (count > 1 or not {key for key, _ in d.reference} <= MINI_BATCH_CONVENTION_KEYS)),
                           None)
    base = micro_sizes[0]
    out = run_step(step, inp, base)
    logged = tuple(step.metrics)
    ev.values, ev.gradients = _outputs(out, ref, fa, inp, _label(inp, base, rejected), _layout(inp, base), ev,
                                       logged, case.op)
    ev.base_label = _label(inp, base, rejected)
    if count > 1:  # the same rows cut into that many mini-batches, each one optimizer step of its own loss
        ref_k = _exact(inp, conventions, count)
        micro = math.gcd(int(base), len(mask) // count)  # the drawn micro-batches, or one per mini-batch
        out = run_step(step, inp, micro, mini_batch_count=count)
        v, g = _outputs(out, ref_k, faithful(inp, conventions, count), inp,
                        _label(inp, micro, rejected, mini_batch_count=count), _layout(inp, micro, count), ev, logged,
                        case.op, count)
        ev.values, ev.gradients = ev.values + v, ev.gradients + g
    if case.property == PARTITION_INVARIANT:
        for micro in micro_sizes[1:]:
            out = run_step(step, inp, micro)
            label = _label(inp, micro, rejected)
            v, g = _outputs(out, ref, fa, inp, label, _layout(inp, micro), ev, logged, case.op)
            ev.alternatives.append((label, v + g))
        rows = len(inp["input_ids"])
        for dp in (d for d in getattr(step, "dp_sizes", (1,)) if d > 1 and rows % d == 0):
            out = run_step(step, inp, rows // dp, dp_size=dp)
            nnz = [int(mask[a:a + rows // dp].sum()) for a in range(0, rows, rows // dp)]
            per = rows // dp
            label = (f"{variant}, T {inp['temperature']}, entropy_coeff {inp['entropy_coeff']}, DP {dp} ranks "
                     f"(simulated in one process) of {per} row{'s' if per > 1 else ''} each, tokens per DP rank {nnz}")
            v, g = _outputs(out, ref, fa, inp, label, {"parts": "DP ranks", "nnz": nnz}, ev, logged, case.op)
            ev.alternatives.append((label, v + g))
        for budget in (inp.get("token_budgets") or ()) if step.token_budgets else ():
            out = run_step(step, inp, len(inp["input_ids"]), token_budget=budget)
            label = _label(inp, len(inp["input_ids"]), rejected, token_budget=budget)
            layout = {"parts": "micro-batches", "max_token_len": int(budget)}
            v, g = _outputs(out, ref, fa, inp, label, layout, ev, logged, case.op)
            ev.alternatives.append((label, v + g))
    elif case.property == MASK_INVARIANT:
        garbage = float(inp["garbage"])
        attention = np.asarray(inp["attention_mask"], bool)
        vocab = inp["embed"].shape[0]
        ids = np.where(attention, inp["input_ids"], (np.asarray(inp["input_ids"]) + 1) % vocab)
        dirty = np.where(mask, inp["advantages"], np.float32(garbage)).astype(np.float32)
        changes = {"advantages": dirty, "input_ids": ids}
        what = f"masked advantages = {garbage!r}, padding ids changed"
        if inp.get("rollout_log_probs") is not None:
            changes["rollout_log_probs"] = np.where(mask, inp["rollout_log_probs"], np.float32(garbage))
            what = f"masked advantages and rollout log-probs = {garbage!r}, padding ids changed"
        out = run_step(step, inp, base, **changes)
        v, g = _outputs(out, ref, fa, inp, what, _layout(inp, base), ev, logged, case.op)
        ev.alternatives.append((what, v + g))
        if "rollout_log_probs" in changes:  # alone too: a leak of theirs is not hidden behind the advantages'
            what = f"masked rollout log-probs = {garbage!r}, advantages clean ({variant})"
            out = run_step(step, inp, base, rollout_log_probs=changes["rollout_log_probs"])
            v, g = _outputs(out, ref, fa, inp, what, _layout(inp, base), ev, logged, case.op)
            ev.alternatives.append((what, v + g))
    return ev


def kept_mask(inp: dict) -> np.ndarray | None:
    """The loss mask bool ``[B, R]`` that ``inp``'s variant's rejection leaves (exactly: the proximal log-probs of the
    float64 step against the rollout's); None without a rejection."""
    options = tuple(variant_knobs(inp).get("rejection", ()))
    if not options or inp.get("rollout_log_probs") is None:
        return None
    mask = np.asarray(inp["response_mask"], bool)
    old = R.step_log_probs(np.asarray(inp["old_embed"], np.float32), np.asarray(inp["old_head"], np.float32),
                           inp["input_ids"], mask.shape[1], float(np.float32(inp["temperature"])))
    return R.rollout_rejection_mask(old, np.where(mask, inp["rollout_log_probs"], 0.0), mask, options) > 0


def rejected_rows(inp: dict) -> np.ndarray:
    """The rows of ``inp`` that had a valid token and that its variant's rejection empties (a row rejected by its
    mean ratio, or a row whose every token the token mask removes); empty without a rejection."""
    kept = kept_mask(inp)
    if kept is None:
        return np.zeros(0, np.int64)
    return np.flatnonzero(np.asarray(inp["response_mask"], bool).any(1) & ~kept.any(1))


def trigger(case, clauses, kind) -> str | None:
    """The feature of the shrunk input a ``matches_reference`` failure of the step needs, in the generic triggers'
    words. The strategy draws the whole mini-batch and the temperature 1 first, so a split or a temperature ≠ 1
    survives shrinking only when the failure needs it; a rejection variant always rejects a row, and the token-mask
    variant empties one (every token outside the band) whenever two rows have a valid token.

    * a failure of the mini-batch run alone (every clause's layout has several mini-batches: the one-mini-batch run
      passed): "more than one mini-batch" (a normaliser scoped to the generation batch where each optimizer step
      needs its mini-batch's);
    * a run cut into more than one micro-batch: "more than one micro-batch" (the generic partition trigger), so
      that its wrong value joins the partition dependence of the same place (a mean of micro-batch means);
    * one micro-batch with a row the rejection (or the token mask) emptied: "a row removed by rollout rejection" (a
      binding may word it as its aggregation's edge trigger, verl's "a row with no valid token, as sequence-level
      rollout rejection …", so that a normaliser counting the row joins the aggregation's defect);
    * one micro-batch with a row that has no valid token (the sequence-TIS and GSPO variants draw one): "a row with
      no valid token";
    * one micro-batch at a temperature ≠ 1: "a sampling temperature ≠ 1";
    * a mask_invariant or partition_invariant failure, or anything else: the generic trigger."""
    inp = case.inputs
    if case.property == MASK_INVARIANT:
        return None
    layouts = [c.layout for c in clauses or () if isinstance(getattr(c, "layout", None), dict)]
    if case.property == MATCHES_REFERENCE and layouts and all(int(lay.get("mini_batches", 1)) > 1 for lay in layouts):
        return SEVERAL_MINI_BATCHES
    sizes = inp.get("micro_batch_sizes") or []
    if sizes and int(sizes[0]) < len(inp.get("input_ids", ())):
        return "more than one micro-batch"
    if case.property != MATCHES_REFERENCE:
        return None
    if len(rejected_rows(inp)):
        return REJECTED_ROW
    if not np.asarray(inp.get("response_mask", [[1]]), bool).any(1).all():
        return "a row with no valid token"
    if float(inp.get("temperature", 1.0)) != 1.0:
        return "a sampling temperature ≠ 1"
    return None


FAMILY = OpFamily("policy_step", OPS, strategy, evaluate, order=95, trigger=trigger,
                  doc="a trainer's policy-gradient step: old log-probs, loss, parameter gradient and metrics")
