"""One policy-gradient step of a tiny language model, exactly: from a trainer's padded batch to the loss,
the gradient with respect to the model's parameters and the metrics the step logs.

The model is an embedding ``E`` ``[V, H]`` followed by a linear LM head ``W`` ``[V, H]`` (no bias): the
logits at a position are ``z = W·E[x] / τ`` (τ the sampling temperature), an exact function of the
parameters, so every quantity below has a float64 value and a closed-form gradient.

Layout (a trainer's batch after rollout): ``input_ids`` ``[B, P + R]`` holds each row's prompt right-aligned in
the first ``P`` columns (left padding) and its response left-aligned in the last ``R`` (right padding);
``attention_mask`` marks the real tokens; ``response_mask`` ``[B, R]`` marks the response tokens the loss
counts (0 at padding and at interior observation tokens of a multi-turn row). Response token ``j`` of row ``i``
is predicted by the logits at column ``P + j − 1``: its log-probability is ``log softmax(z)[x_{P+j}]``.

The step (one mini-batch, one optimizer step; several mini-batches below; verl's ``ppo_loss``, Schulman et al.
2017, arXiv:1707.06347):

* ℓ = log-probs at the current parameters, o = log-probs at the old parameters (``old_embed``,
  ``old_head``: the proximal policy the trainer recomputes before the update), both at temperature τ;
* loss = ``policy_loss(o, ℓ, A, m)`` − entropy_coeff · ``agg_loss(H, m)`` with H the entropy of softmax(z) at
  the current parameters, aggregated over the whole mini-batch by ``loss_agg_mode``
  (:func:`rlconform.reference.agg_loss`); the policy loss is vanilla PPO with dual clip, or GSPO
  (``policy_loss_variant="gspo"``: one ratio per row, exp of the mean log-ratio ℓ − o over the row's valid tokens,
  straight-through at each token, clipped, no dual clip; Zheng et al. 2025, arXiv:2507.18071,
  :func:`rlconform.reference.policy_loss`);
* the gradient of that loss with respect to ``E`` and ``W`` (o is a constant);
* metrics: ``pg_loss``, ``entropy_loss`` (the two terms), ``pg_clipfrac``, ``pg_clipfrac_lower`` (vanilla only: GSPO
  has no dual clip), ``ppo_kl`` (token-weighted over the mini-batch, :func:`rlconform.reference.policy_loss`) and ``entropy`` (the old
  path's entropy aggregated by ``loss_agg_mode`` over the batch's response tokens, before any rejection: what
  verl logs as ``actor/entropy`` when the batch arrives).

Rollout correction (decoupled: three policies, the rollout's ρ, the proximal o and the current ℓ; Yao et al.
2025, "Your efficient RL framework secretly brings you off-policy RL training"; verl
``trainer/ppo/rollout_corr_helper.py``), from the rollout log-probs ``log ρ`` the inference engine returned:

* rejection: the rows or tokens :func:`rlconform.reference.rollout_rejection_mask` rejects for (o, log ρ) leave the
  loss mask before anything is counted: the kept mask replaces ``m`` in the loss, its normaliser (token count,
  non-empty rows) and the loss metrics. A token mask (option ``("token", "k1", low, high)``: masked importance
  sampling's token band, verl ``rollout_rs="token_k1"``, SkyRL ``token_mask_is_threshold_low`` / ``_high``) keeps a
  valid token when low ≤ exp(o − log ρ) ≤ high, both bounds inclusive, with weight 1 (no importance weight unless
  ``rollout_is`` adds one); a row whose every token falls outside is emptied like a rejected row;
* importance weights ``w = min(exp(o − log ρ), cap)`` (:func:`rlconform.reference.importance_ratio`) at the kept
  tokens multiply each token's clipped loss; ``w`` is a constant: it does not depend on the current
  parameters and no gradient flows through it;
* sequence-level TIS (``rollout_is="sequence_product"``: verl ``rollout_is="sequence"``, SkyRL
  ``tis_ratio_type="sequence"``): one weight per row, ``w_i = min(exp(Σ_t (o − log ρ)), cap)`` over the row's
  kept tokens, the same constant at each of them;
* the weights' diagnostics, over the kept tokens: ``rollout_is_fraction_high`` (the fraction whose raw ratio
  exp(o − log ρ) exceeds the cap: counted before the truncation, which would leave none above it),
  ``rollout_is_mean``, ``rollout_is_min``, ``rollout_is_max`` (of the applied, truncated weights; a declared
  convention may take them of the raw ratios, ``is_metric_weights="raw"``). At the sequence level each is
  defined per row: ``rollout_is_fraction_high`` is the fraction of the rows with a kept token whose raw
  sequence ratio exceeds the cap (a row counts once, whatever its length: the truncation decides per row);
  ``rollout_is_mean`` is the mean over the kept tokens of the weight each one's loss is multiplied by (a row's
  weight counted once per kept token); ``rollout_is_min`` / ``_max`` the extremes over the rows with a kept token
  (the same over the kept tokens). A declared convention may summarise the raw sequence ratios
  (``is_metric_weights="raw"``), the raw *token* ratios exp(o − log ρ) whatever the level
  (``"raw_token"``), or take only the min and max of other weights than the mean (``is_extreme_weights``).

Several mini-batches (verl ``ppo_mini_batch_size``: ``RayPPOTrainer._update_actor`` → ``TrainingWorker.train_mini_batch``;
SkyRL ``policy_mini_batch_size``: ``RayPPOTrainer._execute_training_step``; one PPO epoch, no shuffle): the B rows
are cut into k contiguous mini-batches of B / k rows, and each is one optimizer step of its own loss, every
normaliser (token count, rows) counted over the mini-batch's rows. The old log-probs, the rejection and the
importance weights are decided per row or token, so a mini-batch's are the whole batch's. The parameters are the
same for every step here (the gradient is compared before any update moves them), so each mini-batch's gradient
is the gradient of its own loss at the given parameters. The metrics of the step are those of the whole
(generation) batch, pooled over its tokens and rows: what a one-mini-batch step of the same rows logs, whatever
the cut; a declared convention may take a metric as the mean over the mini-batches of each one's value.

KL loss (verl ``use_kl_loss``, SkyRL ``use_kl_loss``): r = log-probs of a frozen reference model (``ref_embed``,
``ref_head``) at the same temperature τ (the KL is between the two tempered policies: zero when the parameters
are the reference's); the loss adds ``kl_loss_coef · agg_loss(kl_estimator(ℓ, r), m)`` (:func:`rlconform.reference.
kl_estimator`, aggregated by ``loss_agg_mode`` unless a declared ``kl_agg_mode`` says otherwise) and logs it as
``kl_loss``.
"""

from __future__ import annotations

import math

import numpy as np

from ._convert import as_float64, as_mask
from .importance import importance_ratio
from .kl import kl_estimator, kl_estimator_grad
from .loss_agg import agg_loss, agg_loss_grad
from .policy_loss import policy_loss, policy_loss_grad
from .rejection import rollout_rejection_mask
from .softmax_stats import entropy, entropy_grad, token_logprobs, token_logprobs_grad

__all__ = ["STEP_POLICY_LOSSES", "policy_step", "step_log_probs", "step_positions"]

#: the policy losses of the step (:func:`rlconform.reference.policy_loss` variants)
STEP_POLICY_LOSSES = ("vanilla", "gspo")


def step_positions(input_ids, response_length: int):
    """(context ids ``[B, R]``, label ids ``[B, R]``): the token whose logits predict each response position
    (the column before it) and the response token itself. input_ids: integer ``[B, P + R]``."""
    ids = np.asarray(input_ids, dtype=np.int64)
    p = ids.shape[1] - response_length
    if p < 1:
        raise ValueError(f"the batch has no prompt column (width {ids.shape[1]}, response length {response_length})")
    return ids[:, p - 1:-1], ids[:, p:]


def _logits(embed, head, context, temperature):
    return np.einsum("vh,brh->brv", head, embed[context]) / temperature


#: what the importance weights' diagnostics may summarise (``is_metric_weights``, ``is_extreme_weights``)
IS_METRIC_WEIGHTS = ("applied", "raw", "raw_token")


def _is_metrics(old, rollout, kept, level: str, cap, of: str, extremes_of: str | None = None) -> dict:
    """The importance weights' diagnostics over the kept tokens (module doc): ``of`` what the mean (and, unless
    ``extremes_of`` says otherwise, the min and max) summarise, one of :data:`IS_METRIC_WEIGHTS`."""
    weights = {"raw": importance_ratio(old, rollout, kept, level=level),
               "applied": importance_ratio(old, rollout, kept, level=level, cap=cap),
               "raw_token": importance_ratio(old, rollout, kept, level="token")}
    shown, extremes = weights[of], weights[extremes_of or of]
    n = int(kept.sum())
    if level == "token":
        high = float((weights["raw"][kept] > cap).sum() / n) if cap is not None else 0.0
    else:  # one ratio per row: the rows with a kept token, each counted once
        rows = kept.any(1)
        per_row = np.where(kept, weights["raw"], -np.inf).max(1)[rows]  # the row's one ratio
        high = float((per_row > cap).sum() / rows.sum()) if cap is not None else 0.0
    return {"rollout_is_mean": math.fsum(shown[kept]) / n, "rollout_is_min": float(extremes[kept].min()),
            "rollout_is_max": float(extremes[kept].max()), "rollout_is_fraction_high": high}


def step_log_probs(embed, head, input_ids, response_length: int, temperature: float):
    """The exact log-probs float64 ``[B, R]`` of the response tokens under the model ``(embed, head)`` at
    temperature τ (every position, masked ones included). embed, head: ``[V, H]``; input_ids: integer
    ``[B, P + R]``. Raises ValueError as :func:`step_positions`."""
    context, labels = step_positions(input_ids, response_length)
    E, W = as_float64(embed, "embed"), as_float64(head, "head")
    return token_logprobs(_logits(E, W, context, temperature), labels)


def policy_step(embed, head, old_embed, old_head, input_ids, response_mask, advantages, *, temperature: float,
                loss_agg_mode: str = "token-mean", entropy_coeff: float = 0.0, clip_ratio_low: float = 0.2,
                clip_ratio_high: float = 0.2, clip_ratio_c: float = 3.0, entropy_agg_mode: str | None = None,
                rollout_log_probs=None, rollout_is: str | None = None, rollout_is_cap: float | None = 2.0,
                rejection=(), ref_embed=None, ref_head=None, kl_loss_coef: float = 0.0,
                kl_loss_type: str = "low_var_kl", kl_agg_mode: str | None = None,
                rejection_normaliser: str = "kept", is_metric_weights: str = "applied",
                is_extreme_weights: str | None = None, policy_loss_variant: str = "vanilla",
                mini_batches: int = 1, mini_batch_mean_metrics=()) -> dict:
    """The exact step (module doc). With ``mini_batches`` = k > 1 the B rows are cut into k contiguous mini-batches
    of B / k rows, one optimizer step each (module doc, "Several mini-batches"). Returns a dict:

    ``log_probs``, ``old_log_probs``, ``entropy``, ``old_entropy``: float64 ``[B, R]`` (every position; the
    masked ones are what the model gives there); ``loss``: float; ``grad_embed``, ``grad_head``: float64
    ``[V, H]``; ``metrics``: name -> float (module doc).

    embed, head, old_embed, old_head: ``[V, H]`` real arrays; input_ids: integer ``[B, P + R]`` in ``[0, V)``;
    response_mask: ``[B, R]`` bool / 0-1; advantages: ``[B, R]`` real (only unmasked positions are read);
    temperature: τ > 0. policy_loss_variant: one of :data:`STEP_POLICY_LOSSES` (``"vanilla"``: PPO with dual clip;
    ``"gspo"``: the row's geometric-mean ratio, clip_ratio_c ignored). loss_agg_mode, clip ratios: as
    :func:`rlconform.reference.policy_loss`. entropy_agg_mode: how the entropy term (and the ``entropy_loss`` metric) is aggregated
    (None: by ``loss_agg_mode``; an engine's declared convention may aggregate it otherwise, SkyRL: token-mean).
    rollout_log_probs: ``[B, R]`` the rollout's log-probs (read at unmasked positions only), needed by the
    rollout correction (module doc): rollout_is: None or an importance level of
    :func:`rlconform.reference.importance_ratio` (``"token"``: verl ``rollout_is="token"``;
    ``"sequence_product"``: verl ``rollout_is="sequence"``, SkyRL ``tis_ratio_type="sequence"``) with TIS cap
    ``rollout_is_cap``; rejection: options of :func:`rlconform.reference.rollout_rejection_mask` (ANDed; empty:
    none). With a correction the result also holds ``kept_mask`` (bool ``[B, R]``) and ``is_weights``
    (float64 ``[B, R]`` or None). ref_embed, ref_head: ``[V, H]`` the reference model, needed when
    kl_loss_coef ≠ 0; kl_loss_type: a mode of :func:`rlconform.reference.kl_estimator`; kl_agg_mode: how the
    KL term is aggregated (None: by ``loss_agg_mode``; SkyRL declares ``seq-mean-token-mean``). With a KL loss
    the result also holds ``ref_log_probs`` (float64 ``[B, R]``) and the metric ``kl_loss``.
    rejection_normaliser: ``"kept"`` (the normalisers count the kept tokens and rows: the module doc) or
    ``"batch"`` (a declared convention, SkyRL's: the rejection multiplies every per-token term by the kept mask,
    and the normalisers count the batch's tokens and rows before the rejection). is_metric_weights: ``"applied"``
    (the truncated weights, verl's ``rollout_is_mean``), ``"raw"`` (the level's ratios before truncation) or
    ``"raw_token"`` (the token ratios exp(o − log ρ) before truncation whatever the level, SkyRL's
    ``is_ratio_mean``): what the ``rollout_is_mean`` / ``_min`` / ``_max`` metrics summarise;
    is_extreme_weights: None (as is_metric_weights) or one of its values, what ``_min`` / ``_max`` alone summarise
    (verl's sequence level: the raw sequence ratios beside the truncated weights' mean).

    mini_batches: k ≥ 1 dividing B. With k > 1 the result holds ``steps``, a list of k dicts, one per mini-batch in
    order: ``rows`` (first, end) of its rows, ``loss``, ``grad_embed``, ``grad_head`` (float64 ``[V, H]``: the exact
    gradient of the mini-batch's own loss, every normaliser counted over its rows, at the given parameters) and
    ``metrics`` (the mini-batch's own, as for one mini-batch); it holds no top-level ``loss`` / ``grad_embed`` /
    ``grad_head`` (there is no one gradient of the step), and its ``metrics`` are those of the whole batch (the
    generation batch pooled: token-weighted, and for the losses the batch's ``loss_agg_mode``), except the names in
    ``mini_batch_mean_metrics``, the mean over the k mini-batches of each one's value (a declared convention: one
    value per optimizer step, averaged over the steps).

    Raises ValueError: shapes that do not match, τ ≤ 0, no unmasked (or no kept) token, a policy_loss_variant not in
    :data:`STEP_POLICY_LOSSES`, GSPO with a rejection (which tokens its row mean reads is not defined here), a
    correction without
    rollout log-probs, an is_metric_weights / is_extreme_weights not in :data:`IS_METRIC_WEIGHTS`, a KL loss
    without a reference model, and what :func:`rlconform.reference.policy_loss` and
    :func:`rlconform.reference.kl_estimator` raise; a ``mini_batches`` < 1 or not dividing B, and a mini-batch with
    no unmasked (or no kept) token.
    """
    kwargs = dict(temperature=temperature, loss_agg_mode=loss_agg_mode, entropy_coeff=entropy_coeff,
                  clip_ratio_low=clip_ratio_low, clip_ratio_high=clip_ratio_high, clip_ratio_c=clip_ratio_c,
                  entropy_agg_mode=entropy_agg_mode, rollout_is=rollout_is, rollout_is_cap=rollout_is_cap,
                  rejection=rejection, ref_embed=ref_embed, ref_head=ref_head, kl_loss_coef=kl_loss_coef,
                  kl_loss_type=kl_loss_type, kl_agg_mode=kl_agg_mode, rejection_normaliser=rejection_normaliser,
                  is_metric_weights=is_metric_weights, is_extreme_weights=is_extreme_weights,
                  policy_loss_variant=policy_loss_variant)
    rows = np.shape(response_mask)[0]
    if isinstance(mini_batches, bool) or not isinstance(mini_batches, (int, np.integer)) or mini_batches < 1 \
            or rows % mini_batches:
        raise ValueError(f"mini_batches must be an integer >= 1 that divides the {rows} rows, got {mini_batches!r}")
    whole = _step(embed, head, old_embed, old_head, input_ids, response_mask, advantages,
                  rollout_log_probs=rollout_log_probs, **kwargs)
    if mini_batches == 1:
        return whole
    size, steps = rows // int(mini_batches), []
    for a in range(0, rows, size):
        cut = slice(a, a + size)
        try:
            one = _step(embed, head, old_embed, old_head, np.asarray(input_ids)[cut], np.asarray(response_mask)[cut],
                        np.asarray(advantages)[cut], **kwargs,
                        rollout_log_probs=None if rollout_log_probs is None else np.asarray(rollout_log_probs)[cut])
        except ValueError as e:
            raise ValueError(f"mini-batch of rows [{a}, {a + size}): {e}") from None
        steps.append({"rows": (a, a + size), "loss": one["loss"], "grad_embed": one["grad_embed"],
                      "grad_head": one["grad_head"], "metrics": one["metrics"]})
    out = {k: v for k, v in whole.items() if k not in ("loss", "grad_embed", "grad_head")}
    out["metrics"] = dict(whole["metrics"])
    for name in mini_batch_mean_metrics:
        if name in out["metrics"]:
            out["metrics"][name] = math.fsum(s["metrics"][name] for s in steps) / len(steps)
    out["steps"] = steps
    return out


def _step(embed, head, old_embed, old_head, input_ids, response_mask, advantages, *, temperature, loss_agg_mode,
          entropy_coeff, clip_ratio_low, clip_ratio_high, clip_ratio_c, entropy_agg_mode, rollout_log_probs,
          rollout_is, rollout_is_cap, rejection, ref_embed, ref_head, kl_loss_coef, kl_loss_type, kl_agg_mode,
          rejection_normaliser, is_metric_weights, is_extreme_weights, policy_loss_variant) -> dict:
    """The step on one mini-batch (:func:`policy_step` with ``mini_batches=1``)."""
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature!r}")
    if policy_loss_variant not in STEP_POLICY_LOSSES:
        raise ValueError(f"policy_loss_variant must be one of {', '.join(STEP_POLICY_LOSSES)}, "
                         f"got {policy_loss_variant!r}")
    if policy_loss_variant == "gspo" and rejection:
        raise ValueError("GSPO with a rollout rejection is not defined here: its row mean would read rejected tokens")
    E, W, E0, W0 = (as_float64(x, n) for x, n in ((embed, "embed"), (head, "head"), (old_embed, "old_embed"),
                                                    (old_head, "old_head")))
    if not (E.shape == W.shape == E0.shape == W0.shape) or E.ndim != 2:
        raise ValueError(f"embed / head / old_embed / old_head must share one [V, H] shape: "
                         f"{E.shape}, {W.shape}, {E0.shape}, {W0.shape}")
    m = as_mask(response_mask, None, "response_mask")
    A = np.where(m, as_float64(advantages, "advantages"), 0.0)
    context, labels = step_positions(input_ids, m.shape[1])
    if not m.any():
        raise ValueError("the mini-batch has no unmasked response token: the step is undefined")
    z = _logits(E, W, context, temperature)
    z0 = _logits(E0, W0, context, temperature)
    lp, old = token_logprobs(z, labels), token_logprobs(z0, labels)
    H, H0 = entropy(z), entropy(z0)
    kept, weights = m, None
    if rollout_is or rejection:
        if rollout_log_probs is None:
            raise ValueError("a rollout correction needs rollout_log_probs")
        rollout = np.where(m, as_float64(rollout_log_probs, "rollout_log_probs"), 0.0)
        if rejection:
            kept = rollout_rejection_mask(old, rollout, m, rejection).astype(bool)
            if not kept.any():
                raise ValueError("the rejection keeps no token: the step is undefined")
        if rollout_is:
            weights = importance_ratio(old, rollout, kept, level=rollout_is, cap=rollout_is_cap)
    for name, value in (("is_metric_weights", is_metric_weights), ("is_extreme_weights", is_extreme_weights)):
        if value not in IS_METRIC_WEIGHTS and not (name == "is_extreme_weights" and value is None):
            raise ValueError(f"{name} must be one of {', '.join(IS_METRIC_WEIGHTS)}, got {value!r}")
    if rejection_normaliser not in ("kept", "batch"):
        raise ValueError(f"rejection_normaliser must be 'kept' or 'batch', got {rejection_normaliser!r}")
    # the mask the normalisers count; a rejected token's terms are 0 either way (its advantage 0 and its ratio 1 in
    # the policy loss, its entropy and KL zeroed)
    counted = m if rejection_normaliser == "batch" else kept
    A_kept, lp_kept = np.where(kept, A, 0.0), np.where(kept, lp, old)
    if weights is not None:
        weights = np.where(kept, weights, 0.0)
    params = dict(variant=policy_loss_variant, loss_agg_mode=loss_agg_mode, clip_ratio_low=clip_ratio_low,
                  clip_ratio_high=clip_ratio_high, clip_ratio_c=clip_ratio_c, rollout_is_weights=weights)
    pg_loss, pg_metrics = policy_loss(old, lp_kept, A_kept, counted, **params)
    entropy_mode = entropy_agg_mode or loss_agg_mode
    H_kept = np.where(kept, H, 0.0)
    entropy_loss = agg_loss(H_kept, counted, entropy_mode)
    loss = pg_loss - entropy_coeff * entropy_loss
    d_lp = np.where(kept, policy_loss_grad(old, lp_kept, A_kept, counted, **params), 0.0)
    ref = kl_loss = None
    if kl_loss_coef:
        if ref_embed is None or ref_head is None:
            raise ValueError("a KL loss needs the reference model (ref_embed, ref_head)")
        R0, W0r = as_float64(ref_embed, "ref_embed"), as_float64(ref_head, "ref_head")
        if R0.shape != E.shape or W0r.shape != E.shape:
            raise ValueError(f"ref_embed / ref_head must be [V, H] = {E.shape}: {R0.shape}, {W0r.shape}")
        ref = token_logprobs(_logits(R0, W0r, context, temperature), labels)
        kl_mode = kl_agg_mode or loss_agg_mode
        kld = kl_estimator(lp, ref, kl_loss_type, mask=kept)
        kl_loss = agg_loss(kld, counted, kl_mode)
        loss = loss + kl_loss_coef * kl_loss
        d_lp = d_lp + kl_estimator_grad(lp, ref, kl_loss_type, kl_loss_coef * agg_loss_grad(kld, counted, kl_mode),
                                        mask=kept)
    d_H = -entropy_coeff * np.where(kept, agg_loss_grad(H_kept, counted, entropy_mode), 0.0)
    d_z = token_logprobs_grad(z, labels, d_lp) + entropy_grad(z, d_H)  # [B, R, V]
    d_z = d_z / temperature
    hidden = E[context]  # [B, R, H]
    grad_head = np.einsum("brv,brh->vh", d_z, hidden)
    d_hidden = np.einsum("brv,vh->brh", d_z, W)
    grad_embed = np.zeros_like(E)
    np.add.at(grad_embed, context.reshape(-1), d_hidden.reshape(-1, E.shape[1]))
    metrics = {"pg_loss": pg_loss, "entropy_loss": entropy_loss, "entropy": agg_loss(H0, m, loss_agg_mode)}
    metrics.update({k: v.mean for k, v in pg_metrics.items()})
    out = {"log_probs": lp, "old_log_probs": old, "entropy": H, "old_entropy": H0, "loss": float(loss),
           "grad_embed": grad_embed, "grad_head": grad_head, "metrics": metrics}
    if rollout_is or rejection:
        out.update(kept_mask=kept, is_weights=weights)
    if rollout_is:
        metrics.update(_is_metrics(old, rollout, kept, rollout_is, rollout_is_cap, is_metric_weights,
                                   is_extreme_weights))
    if ref is not None:
        out["ref_log_probs"] = ref
        metrics["kl_loss"] = kl_loss
    return out
