"""The contracts an engine implements for the composite ops, and the errors of binding one.

:class:`BatchInfo`, :class:`AggLoss` (op ``agg_loss``) and :class:`MetricPipeline` (op
``metric_pipeline``) describe how the harness drives an engine's loss aggregation and metric reduction;
:class:`BindingError`, :class:`OpUnavailable` and :class:`VariantNotProvided` are what resolving a
binding can raise. Imported by the op families and by :mod:`rlconform.harness.catalog.binding` (which
re-exports them for bindings); imports only :mod:`rlconform.harness.core.opinfo` (regime names).
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable, Mapping, Sequence

from rlconform.harness.core.opinfo import implemented_variant, split_variant

__all__ = ["AggLoss", "BatchInfo", "BindingError", "Implementation", "LossVariants", "MetricPipeline",
           "OpUnavailable", "PolicyStep", "STEP_IS_METRICS", "STEP_METRICS", "VariantNotProvided", "Variants", "signature_arity"]


class BindingError(Exception):
    """A binding is malformed (wrong type, wrong signature, unknown op): a usage error, exit code 2."""


class OpUnavailable(Exception):
    """An op of a binding could not be resolved (its import or lookup failed).

    Attributes: ``op`` (catalog name), ``detail`` (the error, with traceback text).
    """

    def __init__(self, op: str, detail: str):
        super().__init__(f"op {op!r} unavailable: {detail.strip().splitlines()[-1] if detail.strip() else detail}")
        self.op = op
        self.detail = detail


class VariantNotProvided(Exception):
    """The engine does not provide this variant of an op (a loss_agg_mode, an estimator): the finding does
    not apply to it. The runner lists such variants in the report instead of checking them."""

    def __init__(self, op: str, variant: str, engine: str):
        self.op, self.variant = op, variant
        super().__init__(f"engine {engine!r} does not provide variant {variant!r} of {op!r}")


#: the metrics a policy step logs, by the catalog's names (:func:`rlconform.reference.policy_step`)
#: a step variant with a rollout correction is ``<loss_agg_mode>-with-<correction>``
STEP_CORRECTION_SEP = "-with-"
STEP_METRICS = ("pg_loss", "entropy_loss", "pg_clipfrac", "pg_clipfrac_lower", "ppo_kl", "entropy", "kl_loss",
                "rollout_is_mean", "rollout_is_min", "rollout_is_max", "rollout_is_fraction_high")
#: the step metrics logged only with an importance-weight correction (the weights' diagnostics)
STEP_IS_METRICS = STEP_METRICS[-4:]


@dataclasses.dataclass(frozen=True)
class PolicyStep:
    """Binding of a trainer's policy-gradient step (op ``policy_step``): the engine's own worker code from the
    trainer's batch to the gradient.

    ``run(batch, params, old_params, knobs) -> dict`` is called once per step:

    * ``batch``: the trainer's padded batch after rollout, CPU tensors: ``prompts`` ``[B, P]`` (left padded),
      ``responses`` ``[B, R]`` (right padded), ``input_ids`` ``[B, P + R]``, ``attention_mask`` ``[B, P + R]``
      (int64), ``position_ids`` ``[B, P + R]``, ``response_mask`` ``[B, R]`` (int64; 0 at padding and at interior
      observation tokens), ``advantages`` ``[B, R]`` float32; with a rollout correction also
      ``rollout_log_probs`` ``[B, R]`` float32 (the inference engine's log-probs; 0 at padding);
    * ``params`` / ``old_params``: the current and the proximal policy's parameters (``{name: float32 tensor}``)
      of :class:`rlconform.harness.core.tiny_lm.TinyLM`, which the binding builds (``TinyLM(params)``) and hands
      to the engine as its model; the engine computes the old log-probs with the proximal model on its own
      forward-only path and the update with the current one;
    * ``knobs``: ``temperature`` (float), ``loss_agg_mode``, ``entropy_coeff``, ``micro_batch_size`` (rows per
      micro-batch; it divides B), ``clip_ratio_low`` / ``clip_ratio_high`` / ``clip_ratio_c``; the rollout
      correction the trainer applies between the old log-probs and the update: ``rollout_is`` (None or
      ``"token"``: truncated importance weights min(π_old/π_rollout, ``rollout_is_cap``)) and
      ``rollout_rejection`` (``(level, estimator, lower, upper)`` options of
      :func:`rlconform.reference.rollout_rejection_mask`, ANDed; empty: none); ``mini_batch_size``: rows per
      mini-batch (one optimizer step each, one epoch, in order: mini-batch j is rows ``[j·size, (j + 1)·size)``;
      it divides B and ``micro_batch_size`` divides it), the whole batch (one optimizer step) unless the binding's
      ``mini_batches`` is True; ``max_token_len``: None, or micro-batches by token count (dynamic batch
      size: at most that many prompt + response tokens each) instead of ``micro_batch_size`` rows, for a binding
      whose ``token_budgets`` is True (the others are never handed one); ``dp_size``: the DP ranks the update runs
      on (default 1), for a binding whose ``dp_sizes`` lists it: rank k takes the k-th of ``dp_size`` equal
      contiguous row chunks, ``micro_batch_size`` divides a rank's rows, and the gradient returned is the mean of
      the ranks' gradients (what FSDP's gradient reduction gives).

    It returns ``{"old_log_probs": [B, R] tensor, "grads": {parameter name: tensor} (the gradient the optimizer
    step would read, accumulated over the micro-batches; with several mini-batches a list of such dicts, one per
    optimizer step in order), "metrics": {name: float}}`` with the metrics under
    the catalog's names (:data:`STEP_METRICS`), and optionally ``"metric_keys": {name: the engine's key}`` (the
    key the engine logs each under, ``actor/pg_clipfrac``: a finding's label shows it beside the name). ``modes``: the catalog variants of the step the binding drives
    (a loss_agg_mode, alone or ``<mode>-with-<correction>``); ``unchecked``: variant -> why the binding does
    not drive it (listed on the report).
    ``metrics``: the catalog's metrics the engine logs (each must be there and right; the others it does not
    log are listed on the finding as unchecked).
    ``transcribed``: the stand-ins (device, FSDP, collectives, optimizer) the binding puts around the engine's
    code, shown on every finding of the op. ``mini_batches``: whether the binding drives several mini-batches per
    step (``knobs["mini_batch_size"]`` < B); the others are handed one mini-batch only.
    """

    run: Callable[..., dict]
    modes: Sequence[str] = ("token-mean", "seq-mean-token-mean")
    transcribed: str | None = None
    metrics: Sequence[str] = STEP_METRICS
    unchecked: Mapping[str, str] = dataclasses.field(default_factory=dict)
    token_budgets: bool = False
    #: the DP sizes the binding runs the update on (``knobs["dp_size"]``); ``(1,)``: one rank only
    dp_sizes: Sequence[int] = (1,)
    #: whether the binding drives several mini-batches per step (``knobs["mini_batch_size"]`` < B)
    mini_batches: bool = False

    @property
    def variants(self) -> tuple[str, ...]:
        return tuple(self.modes)

    @property
    def agg_modes(self) -> dict[str, str]:
        """Each variant is the loss_agg_mode the step hands the engine's aggregation (read as
        :attr:`LossVariants.agg_modes` is: a step failing the way its aggregation fails joins the
        aggregation's defect only when the aggregation fails in that mode)."""
        return {mode: mode.split(STEP_CORRECTION_SEP)[0] for mode in self.modes}

    @property
    def calls_agg_mode(self) -> str | None:
        return self.modes[0] if self.modes else None


@dataclasses.dataclass(frozen=True)
class BatchInfo:
    """Global information an engine's loss aggregation receives for one mini-batch (optimizer step).

    ``dp_size``: number of DP ranks; ``global_nnz``: unmasked tokens in the whole mini-batch;
    ``global_batch_size``: sequences in the mini-batch; ``global_nonempty_seqs``: sequences with at
    least one unmasked token; ``num_micro_batches``: micro-batches on this DP rank;
    ``loss_scale_factor``: constant normaliser of seq-mean-token-sum-norm (``None``: engine default).
    """

    dp_size: int
    global_nnz: int
    global_batch_size: int
    global_nonempty_seqs: int
    num_micro_batches: int
    loss_scale_factor: float | None = None


@dataclasses.dataclass
class AggLoss:
    """Binding of a loss aggregation (op ``agg_loss``).

    ``loss(loss_mat [b, T], mask [b, T], mode: str, info: BatchInfo) -> 0-d tensor`` is the engine's
    per-micro-batch contribution. Contributions combine by ``micro_combine`` over one DP rank's
    micro-batches ("sum" as gradient accumulation does, "mean", or a callable ``list[float] -> float``)
    and by ``dp_combine`` over DP ranks ("mean" as gradient averaging does, "sum", or a callable). The combined value must equal the reference
    :func:`rlconform.reference.agg_loss` over the whole mini-batch for every partition.
    ``modes``: the loss_agg_modes the engine supports. ``equal_micro_batches_per_rank``: as for
    :class:`MetricPipeline`.
    """

    loss: Callable[..., Any]
    modes: Sequence[str] = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean",
                            "seq-mean-token-sum-norm")
    micro_combine: str | Callable[[list], float] = "sum"
    dp_combine: str | Callable[[list], float] = "mean"
    equal_micro_batches_per_rank: bool = False

    @property
    def variants(self) -> tuple[str, ...]:
        """The catalog variants (loss_agg_modes) this binding provides."""
        return tuple(self.modes)

    def __post_init__(self):
        for rule in (self.micro_combine, self.dp_combine):
            if not callable(rule) and rule not in ("sum", "mean"):
                raise BindingError("AggLoss.micro_combine / dp_combine must be 'sum', 'mean' or a callable")

    @staticmethod
    def combine(rule, values: list) -> float:
        """Apply a combination rule to per-shard contributions (Python floats)."""
        from rlconform.reference.exact_sum import exact_sum

        if callable(rule):
            return float(rule(values))
        total = exact_sum(values)
        return total if rule == "sum" else total / len(values)


@dataclasses.dataclass
class MetricPipeline:
    """Binding of a metric pipeline (op ``metric_pipeline``).

    The harness drives, for shards nested as mini-batches -> DP ranks -> micro-batches:

    * ``emit(values [b, T] tensor, mask [b, T] tensor) -> dict`` once per micro-batch (what a worker
      logs; values may be Python numbers, 0-d tensors, NumPy scalars: whatever the engine emits);
    * ``reduce_micro(list[dict]) -> dict`` over one DP rank's micro-batches of one mini-batch;
    * ``reduce_dp(list[dict]) -> dict`` over DP ranks (what the all-reduce computes);
    * ``reduce_mini(list[dict]) -> dict`` over mini-batches (default: ``reduce_micro``);
    * ``finalize(dict) -> dict`` once (the trainer's last step before logging).

    ``stats`` maps a reference statistic (``"mean"``, ``"std"``, ``"min"``, ``"max"``) to the final
    key that must carry it. ``emitted_to_final`` maps every emitted key to the final key that must
    carry it (default: each emitted key must itself reach the final dict); a callable ``key -> final key``
    serves an engine whose emitted keys are known only once it ran (SkyRL's worker logs ``policy/<key>``).
    ``transcribed``: a sentence naming the part of the pipeline that is a transcription of the
    engine's code rather than a call of it (None: every stage calls the engine); it is shown on every finding
    of the op (field ``transcribed``, a line of its card) and in the coverage table.
    ``equal_micro_batches_per_rank``: the engine requires every DP rank of a mini-batch to hold the same
    number of micro-batches (verl's ``same_micro_num_in_dp``); partitions are regularised to that.
    ``emit`` may take a third argument ``info`` (dict: mini_batch, dp_rank, dp_size, micro_batch,
    num_micro_batches).
    ``wrap`` (optional): ``(key, value) -> object`` how a worker hands one logged number to the reducer
    (verl: ``Metric(aggregation of key, value)``); when given, ``emit`` returns plain numbers, the
    ``metric_statistics`` op turns each into the value type of the case (Python number, 0-d tensor,
    NumPy scalar) and then calls ``wrap``; without it the values reach the reducer as emitted.
    """

    emit: Callable[..., dict]
    reduce_micro: Callable[[list], dict]
    reduce_dp: Callable[[list], dict]
    finalize: Callable[[dict], dict]
    stats: Mapping[str, str]
    reduce_mini: Callable[[list], dict] | None = None
    emitted_to_final: Mapping[str, str] | Callable[[str], str] | None = None
    equal_micro_batches_per_rank: bool = False
    wrap: Callable[[str, Any], Any] | None = None
    transcribed: str | None = None


@dataclasses.dataclass
class Variants:
    """An engine's registry bound to a catalog op with variants (advantage estimators, policy losses, KL
    estimators): ``impls`` maps a catalog variant name to a callable with the op's canonical signature;
    ``unchecked`` maps every name the engine registers that the catalog cannot check to the reason (the
    report lists them: a registered variant is bound or reported, never silently skipped).

    ``implementations``: second implementations the engine registers of some variants,
    catalog implementation name (:attr:`~rlconform.harness.core.opinfo.OpInfo.variant_implementations`) ->
    {variant -> callable with the same signature}, e.g. verl's ``grpo_vectorized`` as
    ``{"vectorized": {"grpo": ..., "drgrpo": ..., "rloo": ...}}``. Each is checked as its variant under the
    regimes ``variant+impl@data``, with every property of the op, and against the default implementation
    (``implementations_agree``). A variant given a second implementation must have a default one in ``impls``.
    """

    impls: Mapping[str, Callable[..., Any]]
    unchecked: Mapping[str, str] = dataclasses.field(default_factory=dict)
    implementations: Mapping[str, Mapping[str, Callable[..., Any]]] = dataclasses.field(default_factory=dict)

    @property
    def variants(self) -> tuple[str, ...]:
        """The catalog variants provided: every key of ``impls``, then ``variant+impl`` for each second
        implementation."""
        return tuple(self.impls) + tuple(implemented_variant(v, name) for name, fns in self.implementations.items()
                                         for v in fns)

    def get(self, op: str, variant: str, engine: str = "engine") -> Callable[..., Any]:
        """The callable of ``variant`` (``grpo``, or ``grpo+vectorized`` for a second implementation); raises
        :class:`VariantNotProvided`."""
        plain, impl = split_variant(variant)
        try:
            return self.impls[plain] if impl is None else self.implementations[impl][plain]
        except KeyError:
            raise VariantNotProvided(op, variant, engine) from None

    def implementation(self, impl: str) -> "Variants":
        """The registry as implementation ``impl`` sees it: its callables as ``impls`` (every other field,
        e.g. :class:`LossVariants`' ``combine_metrics``, kept); empty when the engine has none."""
        return dataclasses.replace(self, impls=dict(self.implementations.get(impl, {})), implementations={})


@dataclasses.dataclass
class LossVariants(Variants):
    """A registry of losses that also log metrics per micro-batch (op ``policy_loss``).

    ``impls`` / ``unchecked`` as :class:`Variants`; each callable is one micro-batch's call,
    ``(old_log_prob, log_prob, advantages, response_mask, info: BatchInfo) -> (loss: 0-d tensor,
    metrics: dict[str, float])`` with the catalog's metric names. Micro-batch losses are summed
    (gradient accumulation). ``combine_metrics(parts: list[tuple[dict, int]]) -> dict`` is how the
    engine folds the micro-batches' metric dicts into the logged one; each part comes with the
    micro-batch's number of valid tokens (an engine that logs per-call means and averages them ignores
    it; the token-weighted fold Σ mean·n / Σ n uses it).
    ``agg_modes``: variant -> the loss_agg_mode the engine forces for it whatever the caller passes (a
    declared convention: verl's SAPO aggregates ``seq-mean-token-mean``); the reference then
    aggregates that variant the same way. A variant not named uses the catalog's token-mean.
    ``calls_agg_mode``: the loss_agg_mode the binding's losses pass to the engine's aggregation (verl's
    ``agg_loss``) for a variant ``agg_modes`` does not name (``None``: not declared). Recorded with each
    finding's engine site (``calls_variant``), so that a loss failing the way its aggregation fails joins
    the aggregation's defect only when the aggregation fails in that mode (verl's GSPO NaN on
    masked garbage is GSPO's own sequence sum, token-mean ``agg_loss`` does not fail there).
    """

    combine_metrics: Callable[[list], dict] | None = None
    agg_modes: Mapping[str, str] = dataclasses.field(default_factory=dict)
    calls_agg_mode: str | None = None


@dataclasses.dataclass(frozen=True)
class Implementation:
    """An alternative implementation of a catalog op: a chunked, naive, row-wise or
    streamed function computing the same thing as the op's default binding, checked as that op under
    the regimes ``impl@data`` (:func:`rlconform.harness.core.opinfo.implementation_regimes`).

    ``fn``: a callable with the op's canonical signature, or a :class:`~rlconform.harness.catalog.binding.Lazy`
    returning one. The contract its docstring states, checked on every case (a breach is a problem of
    the case: it fails the property with the message):

    * ``ranks``: the input ranks (logits ``[N, V]`` is 2, ``[B, T, V]`` is 3) the docstring allows; the
      same data is passed in each of them and every answer is compared with the reference;
    * ``out_dtype``: the output dtype the docstring documents: ``None`` (default: the docstring states none,
      and the output dtype is not checked; an assumed contract is no contract), ``"input"`` (the docstring
      says the input's dtype, fp64 in -> fp64 out) or a dtype name (e.g. ``"float32"``: always float32);
      for an op with several outputs, a mapping output name -> any of these (an output not named: ``None``);
    * ``chunk_arg``: the keyword of its chunk-size parameter (``None``: not chunked); the case's
      ``chunk_size`` (drawn by the family from its ``CHUNK_SIZES``, which hold small sizes and 2048, the
      default of every chunked function bound so far, with row counts one short of, at and one past one
      and two chunks) is passed as that keyword;
    * ``doc``: the docstring's words the contract comes from (shown in the report's notes);
    * ``called_rank``: the input rank the engine's own callers pass (verl's Megatron engine hands
      ``vocab_parallel_entropy_with_chunking`` ``[1, nnz, V/tp]``: 3), or ``None`` when not declared. It is
      checked first (:meth:`checked_ranks`), so a failure on the engine's own path leads a finding and a crash
      of every rank names that rank's exception first; a rank only the docstring allows follows;
    * ``needs``: the device the implementation needs (``"cuda"``: a Triton or CUDA kernel; ``None``: any).
      On a run whose ``--device`` is not one, its findings are ``unavailable`` with the reason ``needs CUDA``, never skipped in silence; the coverage table counts it bound either way.
    """

    fn: Any
    ranks: tuple[int, ...] = (2, 3)
    out_dtype: str | Mapping[str, str] | None = None
    chunk_arg: str | None = None
    doc: str = ""
    needs: str | None = None
    called_rank: int | None = None

    def checked_ranks(self) -> tuple[int, ...]:
        """:attr:`ranks` in the order they are checked: the engine's own (``called_rank``) first."""
        if self.called_rank is None:
            return self.ranks
        return (self.called_rank,) + tuple(r for r in self.ranks if r != self.called_rank)

    def promised(self, output: str | None = None) -> str | None:
        """``"input"``, the dtype name the contract promises for ``output`` (None: the only output), or
        ``None`` when the docstring states no output dtype (not checked)."""
        if self.out_dtype is None or isinstance(self.out_dtype, str):
            return self.out_dtype
        return self.out_dtype.get(output)

    def expected_dtype(self, input_dtype: str, output: str | None = None) -> str | None:
        """The output dtype the contract promises for ``input_dtype``; ``None``: none stated, not checked."""
        promise = self.promised(output)
        if promise is None:
            return None
        return input_dtype if promise == "input" else promise

    def dtype_note(self, output: str | None = None) -> str:
        """How the output dtype of ``output`` is checked, in words for the report's notes."""
        promise = self.promised(output)
        if promise is None:
            return "output dtype: not stated in the docstring, not checked"
        return "output dtype: " + ("the input's" if promise == "input" else promise) + " (from the docstring)"

    def __post_init__(self):
        if not self.ranks or any(r < 1 for r in self.ranks):
            raise BindingError(f"Implementation.ranks must be positive input ranks, got {self.ranks!r}")
        if self.called_rank is not None and self.called_rank not in self.ranks:
            raise BindingError(f"Implementation.called_rank {self.called_rank!r} is not one of its ranks {self.ranks!r}")


def signature_arity(fn: Callable) -> tuple[int, int] | None:
    """(required positional, max positional) of ``fn``; ``None`` when it cannot be inspected or takes *args."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    required = 0
    maximum = 0
    for p in sig.parameters.values():
        if p.kind == p.VAR_POSITIONAL:
            return None
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            maximum += 1
            if p.default is p.empty:
                required += 1
    return required, maximum
