"""The vocabulary of the op catalog: property names, dtypes and :class:`OpInfo` (PyTorch OpInfo style).

The bottom of the core layer: it imports nothing of the project. Op families
(:mod:`rlconform.harness.families`) build their :class:`OpInfo` entries from it; the catalog
(:mod:`rlconform.harness.catalog.ops`) collects them.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable

MATCHES_REFERENCE = "matches_reference"
PARTITION_INVARIANT = "partition_invariant"
NON_DESTRUCTIVE = "non_destructive"
FINITE = "finite_where_reference_finite"
METRIC_INTEGRITY = "metric_integrity"
MASK_INVARIANT = "mask_invariant"
IMPLEMENTATIONS_AGREE = "implementations_agree"
#: the generic properties, in report order (see :mod:`rlconform.properties.generic`)
PROPERTIES = (MATCHES_REFERENCE, PARTITION_INVARIANT, NON_DESTRUCTIVE, FINITE, METRIC_INTEGRITY, MASK_INVARIANT,
              IMPLEMENTATIONS_AGREE)

FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")

#: separator between a variant (an estimator, a loss_agg_mode, ...) and the data regime in a regime name,
#: e.g. ``grpo@uneven_groups``: each variant is its own finding, so a fault in one is never diluted; an
#: alternative implementation of an op (``chunked@peaked``) uses the same separator
VARIANT_SEP = "@"
#: separator between a variant and the name of a second implementation of it in a regime name, e.g.
#: ``grpo+vectorized@uneven_groups``: the variant is kept, the implementation named. A catalog
#: variant name may end in ``+`` (kl_estimator's straight-through ``k1+``), never hold one elsewhere, and an
#: implementation name is ``[A-Za-z0-9_]+``, so ``k1++fused`` still parses as (``k1+``, ``fused``).
IMPL_SEP = "+"
_IMPL_NAME = re.compile(r"[A-Za-z0-9_]+")


#: a finding id ``op.property.dtype.regime`` (the regime may be ``variant@data``; variant names hold
#: letters, digits, ``_``, ``-`` and ``+``): groups op, property, dtype, regime. Every parser of finding
#: ids (the xfails ledger, the pytest plugin's node ids, case file names) uses this one pattern.
FINDING_ID = r"([A-Za-z0-9_]+)\.([a-z_]+)\.([a-z0-9]+)\.([A-Za-z0-9_@+\-]+)"


def variant_regime(variant: str, data: str) -> str:
    """The regime name of ``variant`` under data regime ``data`` (``variant@data``)."""
    return f"{variant}{VARIANT_SEP}{data}"


def implementation_regimes(regimes: dict[str, tuple[str, ...]], implementations) -> dict[str, tuple[str, ...]]:
    """``regimes`` plus ``impl@data`` for every alternative implementation ``impl``: the
    plain regimes check the engine's default implementation, each ``impl@data`` one alternative, so a
    fault in one implementation is its own finding, never diluted by the other."""
    out = dict(regimes)
    for impl in implementations:
        out.update({variant_regime(impl, data): dtypes for data, dtypes in regimes.items()})
    return out


def implemented_variant(variant: str, impl: str) -> str:
    """The name of implementation ``impl`` of ``variant`` (``grpo+vectorized``)."""
    return f"{variant}{IMPL_SEP}{impl}"


def split_variant(variant: str | None) -> tuple[str | None, str | None]:
    """``grpo+vectorized`` -> (``grpo``, ``vectorized``); a plain variant (``grpo``, ``k1+``) or None ->
    (variant, None)."""
    if variant is None:
        return None, None
    head, sep, tail = variant.rpartition(IMPL_SEP)
    if sep and head and _IMPL_NAME.fullmatch(tail):
        return head, tail
    return variant, None


def plain_regime(regime: str) -> str:
    """``grpo+vectorized@data`` -> ``grpo@data`` (the regime the variant's default implementation is checked
    under, same inputs); any other regime unchanged."""
    variant, data = split_regime(regime)
    plain, impl = split_variant(variant)
    return regime if impl is None else variant_regime(plain, data)


def regime_implementation(regime: str) -> str | None:
    """The second implementation a variant regime names (``grpo+vectorized@data`` -> ``vectorized``), or None."""
    return split_variant(split_regime(regime)[0])[1]


def with_variant_implementations(op: "OpInfo", implementations: dict[str, str]) -> "OpInfo":
    """``op`` (an op with variants, regimes ``variant@data``) with second implementations of its variants: ``implementations`` maps a catalog implementation name to what it is. Every
    ``variant@data`` regime gets a ``variant+impl@data`` twin with the same dtypes, checked with every
    property of the op (a property restricted to some regimes also gets their twins) plus
    :data:`IMPLEMENTATIONS_AGREE`, which only the twins have: the two implementations against each other
    on the same input. A binding provides an implementation per variant
    (:attr:`rlconform.harness.core.contracts.Variants.implementations`); the twins of a variant it does not
    provide are listed as not provided, like variants."""
    if not op.variants:
        raise ValueError(f"op {op.name!r} has no variants: alternative implementations of an op without "
                         f"variants are OpInfo.implementations (impl@data)")
    twins: dict[str, str] = {}  # twin regime -> its plain regime
    for regime in op.regimes:
        variant, data = split_regime(regime)
        if variant is None:
            continue
        for impl in implementations:
            twins[variant_regime(implemented_variant(variant, impl), data)] = regime
    regimes = dict(op.regimes)
    regimes.update({twin: op.regimes[plain] for twin, plain in twins.items()})
    restricted = {prop: tuple(only) + tuple(t for t, p in twins.items() if p in only)
                  for prop, only in op.property_regimes.items()}
    restricted[IMPLEMENTATIONS_AGREE] = tuple(twins)
    properties = op.properties + (() if IMPLEMENTATIONS_AGREE in op.properties else (IMPLEMENTATIONS_AGREE,))
    return dataclasses.replace(op, regimes=regimes, property_regimes=restricted, properties=properties,
                               variant_implementations=dict(implementations))


def split_regime(regime: str) -> tuple[str | None, str]:
    """``variant@data`` -> (variant, data); a plain regime -> (None, regime)."""
    if VARIANT_SEP in regime:
        variant, data = regime.split(VARIANT_SEP, 1)
        return variant, data
    return None, regime


@dataclasses.dataclass(frozen=True)
class OpInfo:
    """Description of one catalog op.

    ``kind``: the family's kind (``token_stat``, ``reduction``, ``agg_loss``, ``metric_pipeline``,
    ``advantage``, ``vocab_parallel``, ``context_parallel``, ``dp_metric``, ...); ``family``: the
    name of the :class:`~rlconform.harness.families.OpFamily` that declares it.
    ``arity``: positional arguments of the canonical callable (``None`` for pipeline objects and
    variant registries). ``properties``: the generic properties that apply. ``regimes``: regime name ->
    dtypes (a variant family's regimes are ``variant@data``). ``variants``: the variants the catalog
    knows (estimators, modes); empty for ops without variants. ``differentiable``: gradients are
    compared too (closed-form reference gradient ``reference_grad``). ``distributed``: checked on gloo
    ranks by :mod:`rlconform.distributed_tests`. ``source``: where the formula comes from.
    """

    name: str
    kind: str
    arity: int | None
    properties: tuple[str, ...]
    regimes: dict[str, tuple[str, ...]]
    reference: Callable[..., Any]
    reference_grad: Callable[..., Any] | None = None
    differentiable: bool = False
    source: str = ""
    family: str = ""
    variants: tuple[str, ...] = ()
    distributed: bool = False
    #: property -> the only regimes it is checked under (e.g. ``mask_invariant`` needs masked positions)
    property_regimes: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    #: scalar parameters of the canonical callable, after its tensor arguments, in signature order: name ->
    #: the values the strategies draw (e.g. ``{"label_smoothing": (0.1, 0.01, 0.5, 0.9)}``). A case carries
    #: each under ``inputs[name]``; the engine call, the reference and the faithful path all receive them
    #: from :meth:`parameter_values`, so a parameterised op needs no special case anywhere.
    parameters: dict[str, tuple] = dataclasses.field(default_factory=dict)
    #: regime -> :class:`~rlconform.harness.core.profiles.ExampleCap` for a regime whose one example is expensive
    #: (``metric_statistics@large_counts`` builds 2²⁴-token tensors); a profile-only regime has
    #: :data:`~rlconform.harness.core.profiles.REAL_SHAPES_CAP` unless listed here. Read through :meth:`example_cap`,
    #: the one place a runner (single-process or distributed) takes a finding's caps from.
    example_caps: dict[str, Any] = dataclasses.field(default_factory=dict)

    def example_cap(self, regime: str, profile: str | None = None):
        """The :class:`~rlconform.harness.core.profiles.ExampleCap` of this op's findings under ``regime`` in
        ``profile`` (None: whatever the profile), or None."""
        from rlconform.harness.core.profiles import example_cap

        return example_cap(regime, self.example_caps, distributed=self.distributed, profile=profile)

    def parameter_values(self, inputs: dict) -> tuple:
        """The case's values of this op's scalar parameters, in signature order (Python scalars).

        Raises KeyError naming the parameter when a case lacks one (a case file of another version)."""
        out = []
        for name in self.parameters:
            if name not in inputs:
                raise KeyError(f"{self.name}: the case has no value for the parameter {name!r}")
            value = inputs[name]
            out.append(value.item() if hasattr(value, "item") else value)
        return tuple(out)

    #: the op's metric keys are the binding's names for the catalog's statistics (``metric_statistics``: a
    #: probe pushing every aggregation type through the engine's reducer), not keys the engine's trainer
    #: emits: a defect's headline shows a member of an op whose keys the engine emits when it has one
    #: (:func:`rlconform.harness.report.triage.defects`)
    probe_metric_keys: bool = False

    #: variant -> its parameters in words, as the reference defines the variant and the binding passes them to
    #: the engine (``"token k1: kept for 0.5 ≤ r ≤ 1.5"``, ``"dual-clip c = 3, log-ratio clamp ±20"``): printed
    #: with a report row whose example is of that variant, in ``replay`` and in ``explain``
    variant_parameters: dict[str, str] = dataclasses.field(default_factory=dict)
    #: the relative error beyond which a failing value of this op is a wrong value, not the rounding of its
    #: computation (None: the catalog's ``WRONG_REL``, 1 %); an op whose float32 computation is well conditioned
    #: by construction (the policy step of a tiny model) sets it far lower, so a structural 0.1 % error is not
    #: graded ``precision``
    wrong_rel: float | None = None

    #: profile-only regimes: regime -> the profiles that add it (e.g. ``real_shapes`` -> ``("nightly",)``);
    #: a regime not listed is in every profile. A profile-only regime is a catalog regime like any other
    #: (case files and ledgers may name it), but a run of another profile does not select it.
    profile_regimes: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)

    #: alternative implementations of the op the catalog knows (chunked, naive, rowwise,
    #: ...), name -> what it is. A binding declares which it has (``Binding.implementations``); each is
    #: checked as the op under regimes ``impl@data`` (:func:`implementation_regimes`), against the same
    #: reference with the same properties, plus the contract the binding declares for it (output dtype,
    #: input ranks: :class:`~rlconform.harness.core.contracts.Implementation`). An op has variants or
    #: implementations, not both (both would use the ``@`` of the regime).
    implementations: dict[str, str] = dataclasses.field(default_factory=dict)

    #: second implementations of the op's variants the catalog knows (verl's
    #: ``grpo_vectorized`` is ``vectorized``), name -> what it is; added by
    #: :func:`with_variant_implementations`, checked under regimes ``variant+impl@data``.
    variant_implementations: dict[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if self.variants and self.implementations:
            raise ValueError(f"op {self.name!r}: an op has variants or implementations, not both")
        for v in self.variants:
            if IMPL_SEP in v.rstrip(IMPL_SEP) or VARIANT_SEP in v:
                raise ValueError(f"op {self.name!r}: variant {v!r} may hold {IMPL_SEP!r} only at its end, "
                                 f"{VARIANT_SEP!r} nowhere")
        for impl in self.variant_implementations:
            if not _IMPL_NAME.fullmatch(impl):
                raise ValueError(f"op {self.name!r}: implementation name {impl!r} must match [A-Za-z0-9_]+")

    @property
    def implemented_variants(self) -> tuple[str, ...]:
        """``variant+impl`` for every variant and catalog implementation of it."""
        return tuple(implemented_variant(v, i) for i in self.variant_implementations for v in self.variants)

    def regime_profiles(self, regime: str) -> tuple[str, ...] | None:
        """The profiles that add ``regime`` (None: every profile has it)."""
        return self.profile_regimes.get(regime)

    def cases(self, prop: str | None = None, profile: str | None = None):
        """Yield every (dtype, regime) pair this op is checked under (for ``prop``, when given) in
        ``profile``; ``profile=None``: the regimes every profile has (no profile-only regime)."""
        only = self.property_regimes.get(prop) if prop is not None else None
        for regime, dtypes in self.regimes.items():
            if only is not None and regime not in only:
                continue
            adds = self.profile_regimes.get(regime)
            if adds is not None and profile not in adds:
                continue
            for dtype in dtypes:
                yield dtype, regime

    def findings(self, profile: str | None = None):
        """Yield every (property, dtype, regime) this op is checked under in ``profile`` (None: the
        findings every profile has)."""
        for prop in self.properties:
            for dtype, regime in self.cases(prop, profile):
                yield prop, dtype, regime


def reference_function(name: str) -> Callable:
    """A late-bound call of ``rlconform.reference.<name>`` (named like it, for messages)."""

    def call(*args, **kwargs):
        import rlconform.reference as R

        return getattr(R, name)(*args, **kwargs)

    call.__name__ = name
    call.__qualname__ = f"reference.{name}"
    return call
