"""Bindings: how an engine (the trainer implementation under test) is mapped onto the op catalog.

A binding is a name plus a mapping ``op name -> implementation``. An implementation is one of

* a callable with the op's canonical signature (see :mod:`rlconform.harness.catalog`);
* a :class:`Lazy` loader, resolved on first use, so that an op whose import fails is reported
  ``unavailable`` with the error while the other ops still run;
* for the two pipeline ops, a :class:`MetricPipeline` or an :class:`AggLoss` (or a Lazy returning one).

A user binds new code in a dozen lines::

    # my_binding.py
    import torch
    from rlconform.harness.binding import Binding, Lazy

    def my_entropy(logits):                      # [..., V] -> [...]
        p = torch.softmax(logits.float(), -1)
        return -(p * torch.log_softmax(logits.float(), -1)).sum(-1)

    binding = Binding(
        name="mine",
        ops={
            "entropy": my_entropy,
            "token_logprobs": Lazy("my_pkg.losses:logprobs", adapt=lambda f: lambda x, y: f(x, y)),
        },
    )

and runs ``rlconform check --engine my_binding.py`` (or ``--engine my_pkg.my_binding:binding``).
Adapters must keep the engine's own behaviour: no clone, upcast or fix that would hide what the
engine does to its inputs.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import traceback
from typing import Any, Callable, Mapping, Sequence

__all__ = [
    "AggLoss",
    "BatchInfo",
    "Binding",
    "BindingError",
    "Lazy",
    "MetricPipeline",
    "OpUnavailable",
]


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


@dataclasses.dataclass(frozen=True)
class Lazy:
    """An implementation resolved on first use: ``"package.module:attr.sub"`` imported lazily.

    ``adapt`` (optional) maps the imported object to the canonical-signature callable (or to a
    :class:`MetricPipeline` / :class:`AggLoss`). ``loader`` may be given instead of ``target``: a
    zero-argument callable returning the implementation.
    """

    target: str | None = None
    adapt: Callable[[Any], Any] | None = None
    loader: Callable[[], Any] | None = None

    def load(self) -> Any:
        if self.loader is not None:
            obj = self.loader()
        else:
            if not self.target or ":" not in self.target:
                raise BindingError(f"Lazy target must look like 'module:attr', got {self.target!r}")
            mod_name, attr = self.target.split(":", 1)
            obj = importlib.import_module(mod_name)
            for part in attr.split("."):
                obj = getattr(obj, part)
        return self.adapt(obj) if self.adapt is not None else obj


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

    def __post_init__(self):
        for rule in (self.micro_combine, self.dp_combine):
            if not callable(rule) and rule not in ("sum", "mean"):
                raise BindingError("AggLoss.micro_combine / dp_combine must be 'sum', 'mean' or a callable")

    @staticmethod
    def combine(rule, values: list) -> float:
        """Apply a combination rule to per-shard contributions (Python floats)."""
        import math

        if callable(rule):
            return float(rule(values))
        total = math.fsum(values)
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
    carry it (default: each emitted key must itself reach the final dict).
    ``equal_micro_batches_per_rank``: the engine requires every DP rank of a mini-batch to hold the same
    number of micro-batches (verl's ``same_micro_num_in_dp``); partitions are regularised to that.
    ``emit`` may take a third argument ``info`` (dict: mini_batch, dp_rank, dp_size, micro_batch,
    num_micro_batches).
    """

    emit: Callable[..., dict]
    reduce_micro: Callable[[list], dict]
    reduce_dp: Callable[[list], dict]
    finalize: Callable[[dict], dict]
    stats: Mapping[str, str]
    reduce_mini: Callable[[list], dict] | None = None
    emitted_to_final: Mapping[str, str] | None = None
    equal_micro_batches_per_rank: bool = False


@dataclasses.dataclass
class Binding:
    """An engine bound to the catalog.

    ``name``: shown in reports; ``ops``: op name -> implementation (see module docstring);
    ``version``/``path``/``revision``: recorded in the report (a fork's checkout and git revision).
    ``notes``: free text shown in the report (e.g. which engine function each op calls).
    ``spec``: the ``--engine`` value it was loaded from (set by the loader; used in reproducers).
    ``forward_only``: ops whose gradient is not part of the engine's contract (e.g. a statistic always
    computed detached): their values are checked, their gradients are not.
    """

    name: str
    ops: Mapping[str, Any]
    version: str | None = None
    path: str | None = None
    revision: str | None = None
    notes: Mapping[str, str] = dataclasses.field(default_factory=dict)
    spec: str | None = None
    forward_only: frozenset = frozenset()
    _cache: dict = dataclasses.field(default_factory=dict, init=False, repr=False)

    def provided_ops(self) -> list[str]:
        return list(self.ops)

    def resolve(self, op: str) -> Any:
        """Return the implementation of ``op``; raise :class:`OpUnavailable` if it cannot be loaded
        and :class:`BindingError` if the binding does not provide it or it has the wrong shape."""
        if op in self._cache:
            cached = self._cache[op]
            if isinstance(cached, OpUnavailable):
                raise cached
            return cached
        if op not in self.ops:
            raise BindingError(f"binding {self.name!r} does not provide op {op!r}")
        impl = self.ops[op]
        if isinstance(impl, Lazy):
            try:
                impl = impl.load()
            except BindingError:
                raise
            except BaseException as exc:  # noqa: BLE001 - any import failure makes the op unavailable
                if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                    raise
                err = OpUnavailable(op, "".join(traceback.format_exception(exc)))
                self._cache[op] = err
                raise err from exc
        from rlconform.harness.catalog import validate_impl  # local: catalog imports this module

        validate_impl(op, impl, where=f"binding {self.name!r}")
        self._cache[op] = impl
        return impl


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
