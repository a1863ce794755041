"""The batch metrics a trainer logs of each training batch: scores, rewards, advantages, returns, values, response
and prompt lengths, the aborted fraction, the value function's explained variance.

Canonical form: ``batch_metrics(batch) -> {statistic: number}`` per variant, the statistics of
:func:`rlconform.reference.batch_metrics` (:data:`rlconform.reference.BATCH_STATISTICS`, and
:data:`~rlconform.reference.CRITIC_STATISTICS` for the ``critic`` variant), ``batch`` a trainer's padded batch of
CPU tensors: ``prompts [B, P]`` / ``responses [B, R]`` int64 token ids, ``attention_mask [B, P + R]`` and
``response_mask [B, R]`` int64 0/1, ``token_level_scores`` / ``token_level_rewards`` / ``advantages`` / ``returns``
(and ``values`` for ``critic``) float32 ``[B, R]``. Variants: ``actor`` (no critic: verl ``use_critic=False``) and
``critic``.

Data regimes: ``trainer_batches`` (rows of uneven length, left-padded prompts, right-padded responses, a row cut at
the maximum length, interior observation tokens out of the response mask, the outcome score on each row's last
response token, maybe aborted rows of response length 0); ``all_aborted`` (every row aborted: a rollout that
returned nothing); ``all_masked`` (responses present, no response-mask token: every row rejected by the rollout
correction). A statistic of an empty selection is undefined (any value is accepted, or the key left out), but the
trainer must log the batch: an engine that raises on it is a ``crash`` finding (verl PR #5899: ``torch.max`` of
an empty selection). Float32 only (a trainer's batch tensors). ``mask_invariant``: garbage (NaN, ±inf, 1e30) in
the advantages, returns and values outside the response mask leaves every statistic unchanged.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from hypothesis import strategies as st

import rlconform.reference as R
from rlconform.harness.core.evaluation import Compared, Evaluation, call_engine, logged_number
from rlconform.harness.core.failure import problem as problem_clause
from rlconform.harness.core.opinfo import MASK_INVARIANT, MATCHES_REFERENCE, OpInfo, reference_function, split_regime
from rlconform.harness.families import OpFamily

VARIANTS = ("actor", "critic")
DATA = ("trainer_batches", "all_aborted", "all_masked")
REGIMES = {f"{v}@{d}": ("float32",) for v in VARIANTS for d in DATA}
GARBAGE = (np.nan, np.inf, -np.inf, 1e30)
#: the token tensors a trainer fills only under the response mask (garbage goes there in ``mask_invariant``)
MASKED_TENSORS = ("advantages", "returns", "values")
#: the statistics of the masks' integer counts: their max / min are integers, compared exactly; their means and
#: fractions are float32 numbers (a trainer computes lengths as float32 tensors: ``response_mask.sum(-1).float()``)
LENGTH_STATISTICS = tuple(s for s in R.BATCH_STATISTICS if "length" in s or s == "aborted_ratio")

OPS = (
    OpInfo("batch_metrics", "batch_metrics", None, (MATCHES_REFERENCE, MASK_INVARIANT), REGIMES,
           reference_function("batch_metrics"),
           source="the statistics a PPO trainer logs of each training batch (verl trainer/ppo/metric_utils.py "
                  "compute_data_metrics; empty selections: verl PR #5899)", family="batch_metrics",
           variants=VARIANTS,
           property_regimes={MASK_INVARIANT: tuple(f"{v}@trainer_batches" for v in VARIANTS)},
           variant_parameters={"actor": "use_critic False", "critic": "use_critic True: values and explained "
                                                                       "variance (Var unbiased, stabiliser 1e-5)"}),
)


@st.composite
def inputs(draw, variant: str, data: str):
    """A trainer's batch after the advantage step (module doc) as NumPy arrays."""
    rows = draw(st.integers(1, 5))
    prompt_width = draw(st.integers(1, 3))
    width = draw(st.integers(2, 6))
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    prompt_len = [draw(st.integers(1, prompt_width)) for _ in range(rows)]
    if data == "all_aborted":
        response_len = [0] * rows
    else:
        response_len = [draw(st.integers(0 if data == "trainer_batches" else 1, width)) for _ in range(rows)]
        keep = draw(st.integers(0, rows - 1))
        response_len[keep] = max(response_len[keep], 1)  # one row with a response
        if draw(st.booleans()):
            response_len[draw(st.integers(0, rows - 1))] = width  # a row cut at the maximum length
        if min(response_len) == width:  # one padded position at least (mask_invariant's garbage)
            response_len[draw(st.integers(0, rows - 1))] = width - 1
    attention = np.zeros((rows, prompt_width + width), np.int64)
    response_mask = np.zeros((rows, width), np.int64)
    for i in range(rows):
        attention[i, prompt_width - prompt_len[i]: prompt_width + response_len[i]] = 1
        response_mask[i, :response_len[i]] = 1
        if response_len[i] >= 3 and draw(st.booleans()):  # observation tokens (multi-turn): not trained on
            a = draw(st.integers(1, response_len[i] - 2))
            response_mask[i, a: draw(st.integers(a + 1, response_len[i] - 1))] = 0
    if data == "all_masked":
        response_mask[:] = 0
    ids = rng.integers(1, 50, size=attention.shape) * attention
    scores = np.zeros((rows, width))
    for i in range(rows):
        if response_len[i]:
            scores[i, response_len[i] - 1] = draw(st.sampled_from((1.0, 0.0, -1.0, 0.37, 2.5)))
    on = response_mask.astype(bool)
    rewards = scores - np.where(on, 0.01 * np.abs(rng.normal(size=scores.shape)), 0.0)  # a KL penalty in reward
    scale = draw(st.sampled_from((1.0, 30.0, 1e-3)))
    out = {"variant": variant, "prompt_width": prompt_width, "input_ids": ids, "attention_mask": attention,
           "response_mask": response_mask, "token_level_scores": scores.astype(np.float32),
           "token_level_rewards": rewards.astype(np.float32), "garbage": draw(st.sampled_from(GARBAGE))}
    for name in MASKED_TENSORS if variant == "critic" else MASKED_TENSORS[:2]:
        out[name] = np.where(on, scale * rng.normal(size=scores.shape), 0.0).astype(np.float32)
    return out


def strategy(op: OpInfo, dtype: str, regime: str):
    variant, data = split_regime(regime)
    return inputs(variant, data)


def trainer_batch(inp: dict, garbage: float | None = None) -> dict:
    """The case's batch as CPU tensors (module doc); ``garbage``: written into :data:`MASKED_TENSORS` outside the
    response mask."""
    ids = torch.from_numpy(np.asarray(inp["input_ids"], np.int64))
    p = int(inp["prompt_width"])
    on = np.asarray(inp["response_mask"], bool)
    batch = {"prompts": ids[:, :p].clone(), "responses": ids[:, p:].clone(),
             "attention_mask": torch.from_numpy(np.asarray(inp["attention_mask"], np.int64)),
             "response_mask": torch.from_numpy(np.asarray(inp["response_mask"], np.int64))}
    for name in ("token_level_scores", "token_level_rewards") + MASKED_TENSORS:
        if name in inp:
            x = np.asarray(inp[name], np.float32)
            if garbage is not None and name in MASKED_TENSORS:
                x = np.where(on, x, np.float32(garbage)).astype(np.float32)
            batch[name] = torch.from_numpy(x.copy())
    return batch


def _stats(prefix: str, x: torch.Tensor, guarded: bool = True) -> dict:
    if x.numel() == 0 and guarded:
        return {f"{prefix}_mean": math.nan, f"{prefix}_max": math.nan, f"{prefix}_min": math.nan}
    return {f"{prefix}_mean": x.mean().item(), f"{prefix}_max": x.max().item(), f"{prefix}_min": x.min().item()}


def faithful(batch: dict, critic: bool, *, guarded: bool = True, token_mask: str = "response_mask") -> dict:
    """The statistics in float32 torch from the batch's tensors (an empty selection: nan): the dtype-faithful
    values that set the tolerance, and the reference engine's implementation. The keyword flaws are the mutants'
    (the reference passes none): ``guarded=False`` takes ``max`` / ``min`` of an empty selection (torch raises),
    ``token_mask="attention"`` selects the token statistics' tokens by the response's attention mask (observation
    tokens and whatever sits at masked positions counted)."""
    width = batch["responses"].shape[-1]
    m = batch["response_mask"].bool() if token_mask == "response_mask" else batch["attention_mask"][:, -width:].bool()
    response_length = batch["attention_mask"][:, -width:].sum(-1).float()
    prompt_length = batch["attention_mask"][:, :-width].sum(-1).float()
    kept = response_length > 0
    out = {}
    out.update(_stats("score", batch["token_level_scores"].sum(-1)[kept], guarded))
    out.update(_stats("reward", batch["token_level_rewards"].sum(-1)[kept], guarded))
    out.update(_stats("advantages", batch["advantages"][m], guarded))
    out.update(_stats("returns", batch["returns"][m], guarded))
    for prefix, lengths, full in (("response_length", response_length, width),
                                  ("non_aborted_length", response_length[kept], width),
                                  ("prompt_length", prompt_length, batch["prompts"].shape[-1])):
        out.update(_stats(prefix, lengths, guarded))
        out[f"{prefix}_clip_ratio"] = (lengths == full).float().mean().item() if lengths.numel() else math.nan
    out["aborted_ratio"] = (~kept).float().mean().item()
    if critic:
        out.update(_stats("values", batch["values"][m], guarded))
        ret, val = batch["returns"][m], batch["values"][m]
        out["vf_explained_var"] = (1.0 - torch.var(ret - val) / (torch.var(ret) + 1e-5)).item() \
            if ret.numel() >= 2 or not guarded else math.nan
    return out


def _compare(got, ref: dict, fa: dict, label: str, ev: Evaluation) -> list[Compared]:
    if not isinstance(got, dict):
        ev.problems.append(problem_clause("missing output", f"expected a dict of statistics, got {type(got).__name__}"
                                          f" ({label})"))
        return []
    out = []
    for stat, r in ref.items():
        if math.isnan(r):
            continue  # an empty selection: undefined, any value (or none) is accepted
        value = logged_number(got, stat, stat, "the engine's metrics", label, ev.problems)
        if value is None:
            continue
        exact = stat in LENGTH_STATISTICS and stat.endswith(("_max", "_min"))
        out.append(Compared(f"{stat}, {label}", value, np.float64(r),
                            None if exact else np.float64(fa[stat]), "float64" if exact else "float32", "pipeline",
                            quantity="metric"))
    return out


def evaluate(binding, case) -> Evaluation:
    inp = case.inputs
    variant = inp["variant"]
    critic = variant == "critic"
    fn = binding.resolve("batch_metrics").get("batch_metrics", variant, binding.name)
    ref = R.batch_metrics(inp["token_level_scores"], inp["token_level_rewards"], inp["advantages"],
                          inp["returns"], inp["response_mask"], inp["attention_mask"],
                          values=inp["values"] if critic else None)
    fa = faithful(trainer_batch(inp), critic)
    ev = Evaluation()
    got = call_engine("batch_metrics", fn, trainer_batch(inp))
    ev.values = _compare(got, ref, fa, "batch", ev)
    if case.property == MASK_INVARIANT and not np.asarray(inp["response_mask"], bool).all():
        garbage = float(inp.get("garbage", np.nan))
        dirty = call_engine("batch_metrics", fn, trainer_batch(inp, garbage))
        ev.alternatives.append((f"masked positions set to {garbage!r}",
                                _compare(dirty, ref, fa, f"masked = {garbage!r}", ev)))
    if not ev.values and not ev.problems:
        ev.undefined = "no statistic to compare"
    return ev


FAMILY = OpFamily("batch_metrics", OPS, strategy, evaluate, order=42,
                  doc="the statistics a trainer logs of each training batch (scores, advantages, lengths, values)")
