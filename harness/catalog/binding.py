"""Bindings: how an engine (the trainer implementation under test) is mapped onto the op catalog.

A binding is a name plus a mapping ``op name -> implementation``. An implementation is one of

* a callable with the op's canonical signature (see :mod:`rlconform.harness.catalog.ops`);
* a :class:`Lazy` loader, resolved on first use, so that an op whose import fails is reported
  ``unavailable`` with the error while the other ops still run;
* for the two pipeline ops, a :class:`MetricPipeline` or an :class:`AggLoss` (or a Lazy returning one).

A user binds new code in a dozen lines::

    # my_binding.py
    import torch
    from rlconform.harness.catalog.binding import Binding, Lazy

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
import traceback
from typing import Any, Callable, Mapping

from rlconform.harness.catalog.ops import OPS
from rlconform.harness.core.contracts import (  # noqa: F401 - re-exported: bindings import them from here
    AggLoss,
    BatchInfo,
    BindingError,
    Implementation,
    LossVariants,
    MetricPipeline,
    OpUnavailable,
    PolicyStep,
    VariantNotProvided,
    Variants,
    signature_arity,
)
from rlconform.harness.core.declared import Declared  # noqa: F401 - re-exported

__all__ = [
    "AggLoss",
    "BatchInfo",
    "Binding",
    "Coverage",
    "BindingError",
    "Implementation",
    "ImplementationView",
    "Lazy",
    "LossVariants",
    "MetricPipeline",
    "OpUnavailable",
    "PolicyStep",
    "VariantNotProvided",
    "Variants",
    "twins",
]


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
        """The object, imported now; warnings the engine's modules raise while importing are not printed."""
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return self._load()

    def _load(self) -> Any:
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
class Coverage:
    """What of the engine the coverage table inventories (:mod:`rlconform.harness.catalog.coverage`).

    ``modules``: the engine's numerics modules (a package stands for all its submodules); every public
    function, method and class defined there is listed. ``registries``: display name (conventionally
    ``module.REGISTRY``) -> zero-argument loader returning ``{entry name: callable or None}`` as the
    engine holds it now. ``registry_ops``: registry -> the catalog op (or tuple of ops) it feeds: an
    entry whose callable the binding does not hold (or shares with another entry) is bound when an
    implementation of that op holds the entry's name in its closure. ``not_bound``: qualified item name
    (a module that cannot be imported: its name) -> why it is not bound (e.g. "not numerics: a tensor
    reshaping utility", "no catalog op yet: …"). ``importer``: imports a module by name (default
    ``importlib.import_module``; an engine that needs an import shim passes its own).
    ``packages``: the packages whole-package discovery reads (:mod:`rlconform.harness.catalog.discovery`;
    default: the top package of each of ``modules``): every numerics function found there is an
    item too, so ``modules`` is a hint of what to list whole, not the boundary. ``not_bound_under``: module
    prefix (``verl.models.``) -> why the functions discovery finds under it are not bound (a category:
    "model forward: ...", "optimizer schedule: ...", "not numerics: ...", "kernel: needs CUDA: ..."), for
    items that ``not_bound`` does not name; the longest prefix wins.
    """

    modules: tuple[str, ...]
    registries: Mapping[str, Callable[[], Mapping[str, Any]]] = dataclasses.field(default_factory=dict)
    not_bound: Mapping[str, str] = dataclasses.field(default_factory=dict)
    registry_ops: Mapping[str, str | tuple[str, ...]] = dataclasses.field(default_factory=dict)
    importer: Callable[[str], Any] | None = None
    packages: tuple[str, ...] = ()
    not_bound_under: Mapping[str, str] = dataclasses.field(default_factory=dict)


#: ops whose family checks :attr:`Binding.detached` (the output must carry no gradient to the log-probs)
DETACHABLE = ("importance_ratio",)


@dataclasses.dataclass
class Binding:
    """An engine bound to the catalog.

    ``name``: shown in reports; ``ops``: op name -> implementation (see module docstring);
    ``version``/``path``/``revision``: recorded in the report (a fork's checkout and git revision).
    ``notes``: free text shown in the report (e.g. which engine function each op calls).
    ``spec``: the ``--engine`` value it was loaded from (set by the loader; used in reproducers).
    ``forward_only``: ops whose gradient is not part of the engine's contract (e.g. a statistic always
    computed detached): their values are checked, their gradients are not.
    ``detached``: ops whose output must have *no* gradient path to the log-probs (a TIS /
    rejection weight computed from the rollout's and the old log-probs is a constant for the policy
    gradient): the value is checked, and a gradient that reaches ``log_prob`` non-zero at a valid token
    fails; an output without autograd graph, or one whose backward gives zeros, passes. Families that check
    it: :data:`DETACHABLE`. An op may not be both ``forward_only`` and ``detached`` (BindingError).
    ``coverage``: the engine's numerics modules, registries and justifications for the coverage table
    (:class:`Coverage`; ``None``: the binding declares none).
    ``declared``: the engine's declared conventions, preconditions and guards
    (:class:`~rlconform.harness.core.declared.Declared`): checked as declared, listed in the
    report's "Conventions and guards" section, never as defects.
    ``implementations``: op -> {catalog implementation name -> :class:`Implementation`}: the engine's
    alternative implementations of the op (chunked, naive, ...), each checked as the op
    under regimes ``impl@data``. The op itself must be bound too (its default implementation).
    ``engine_dtypes``: op -> the dtypes (catalog names: ``float32``, ``bfloat16``…) the engine's trainer
    calls it with (e.g. verl's ``masked_var`` on fp32 advantages, ``entropy`` on the model's
    bf16 logits). A defect only in dtypes outside this set is graded ``precision``; an op not listed
    counts every dtype as used.
    ``output_sites``: op -> rules ``(output, "module:qualname", trigger[, line[, row]])`` naming the engine function that
    computes each output of an op whose one entry point dispatches to several (verl's
    ``compute_rollout_correction_and_rejection_mask``: the kept mask in ``compute_rollout_rejection_mask``, the
    ``rollout_corr/`` metrics in ``compute_offpolicy_metrics`` / ``compute_is_metrics``): ``output`` a regular
    expression over a failing value clause's label (``kept mask``, ``metric is_ess``), ``trigger`` one over the
    finding's trigger (``""``: any), ``line`` (optional) a regular expression of the line in that function that
    computes the output, cited instead of its fault anchors (SkyRL's ``compute_off_policy_correction`` computes a
    mask and its metrics), ``row`` (optional) a name that makes that output's failure a defect row of its own
    (``function[row]``) instead of one with the function's other failures of the same class. A failing finding is
    located at the first rule, in order, that one of its
    failing outputs and its trigger match (:func:`rlconform.harness.catalog.engine_site.output_site`);
    resolved only then (the name is imported in the process that ran the engine).
    ``variant_triggers``: op -> {regime variant (``drgrpo+vectorized``) -> the trigger in a maintainer's words
    of a failure of that variant seen on any input}: the configuration the variant sets is what brings it
    out (verl's ``grpo_vectorized`` ignores ``norm_adv_by_std_in_grpo=False`` in the AlgoConfig, so Dr. GRPO
    divides by σ on every input). Replaces a finding's trigger only when it reads ``any input``
    (:func:`rlconform.harness.run.root_cause.declared_trigger`). A key may instead be a trigger the checks read
    (``a row with no valid token``: never a variant's name, which has no space): its words name the
    configuration of the engine that produces that input on every step it applies (verl's sequence-level
    rollout rejection zeroes rejected rows' response mask); the trigger is then replaced whatever the variant.
    Either way the words rank as a configuration (:func:`rlconform.harness.report.triage.reach` level 3).
    ``fault_anchors``: engine function (``module.qualname``) -> {kinds of failure (a regular expression over
    ``wrong value``, ``partition dependence``, ``NaN``…, or a pair (kinds, a regular expression over the
    finding's trigger)) -> regular expressions of its faulty source line}, for a failure whose failing and passing examples execute the same lines (tensor code without a
    branch: the spectrum of :mod:`rlconform.harness.core.fault_lines` cannot tell its lines apart); each is
    resolved in the installed engine's source of that function when a finding is located
    (:func:`rlconform.harness.core.fault_lines.anchor_line`), never a line number, so a fork's checkout
    gets its own line; one no line matches anymore cites the function. A pattern may be
    ``(qualname, pattern)``: a line of another function of the same module that the engine function hands
    its work to (verl's ``vocab_parallel_entropy`` -> ``_VocabParallelEntropy.forward``).
    ``impact_knobs``: op -> ``{"knob", "default", "otherwise", "why"}``: the configuration key on which a wrong
    value of the op reaches training (verl's entropy enters the loss only with
    ``actor_rollout_ref.actor.entropy_coeff`` ≠ 0; at the default 0 it is the logged ``actor/entropy``), its
    default, and the severity at the default (``otherwise``). A ``training`` row of such an op says so.
    ``remedies``: ``"module.qualname"`` -> ``{kinds or (kinds, trigger): (cause, fix[, impact])}``, keyed as
    ``fault_anchors``: one sentence of why a defect located there happens (the operation on its cited line),
    one of how to fix it, and (a training defect) one of what it does to training
    (:mod:`rlconform.harness.report.remedies`).
    ``configs``: which engine configuration reaches each op and variant (:mod:`rlconform.harness.report.config_reach`):
    ``{"defaults": {key: value} or a callable returning them (read from the installed engine), "follows":
    {key: key whose value it defaults to}, "ops": {op: {variant: alternatives}}, "triggers": ((regex,
    conditions), …), "sites": {"module.qualname": {kinds: alternatives}}, "derived": {key: (other key, {its
    value: this key's value})}, "twins": {op: {variant: (twin variant, key)}}}``, a condition ``(key, op, value)``.
    ``needs``: op -> the device its default implementation needs (``"cuda"``: a Triton / CUDA kernel); an
    alternative implementation declares it on its :class:`Implementation` (``needs``). On a run whose
    ``--device`` is not one, the op's findings are ``unavailable: needs CUDA`` (:meth:`device_gap`).
    """

    name: str
    ops: Mapping[str, Any]
    version: str | None = None
    path: str | None = None
    revision: str | None = None
    notes: Mapping[str, str] = dataclasses.field(default_factory=dict)
    spec: str | None = None
    forward_only: frozenset = frozenset()
    detached: frozenset = frozenset()
    coverage: Coverage | None = None
    implementations: Mapping[str, Mapping[str, Implementation]] = dataclasses.field(default_factory=dict)
    engine_dtypes: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    declared: tuple = ()
    needs: Mapping[str, str] = dataclasses.field(default_factory=dict)
    output_sites: Mapping[str, tuple] = dataclasses.field(default_factory=dict)
    variant_triggers: Mapping[str, Mapping[str, str]] = dataclasses.field(default_factory=dict)
    fault_anchors: Mapping[str, Mapping[str | tuple[str, str], tuple]] = dataclasses.field(default_factory=dict)
    impact_knobs: Mapping[str, Mapping[str, str]] = dataclasses.field(default_factory=dict)
    remedies: Mapping[str, Mapping[str | tuple[str, str], tuple]] = dataclasses.field(default_factory=dict)
    configs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    _cache: dict = dataclasses.field(default_factory=dict, init=False, repr=False)

    def config_table(self) -> dict:
        """``configs`` as JSON for ``report.json``'s ``engine.configs`` (defaults read now; empty without
        configs)."""
        if not self.configs:
            return {}
        defaults = self.configs.get("defaults") or {}
        if callable(defaults):
            defaults = defaults()
        odd = {k: type(v).__name__ for k, v in defaults.items() if not isinstance(v, (str, int, float, bool, type(None)))}
        if odd:  # a default must be a plain value: report.json carries it
            raise BindingError(f"binding {self.name!r}: configuration defaults that are not plain values: {odd}")

        def rows(alts):
            return [[list(c) for c in alt] for alt in alts]

        return {"defaults": dict(defaults), "follows": dict(self.configs.get("follows") or {}),
                "ops": {op: {v: rows(alts) for v, alts in by.items()} for op, by in
                        (self.configs.get("ops") or {}).items()},
                "triggers": [[pattern, [list(c) for c in conds]] for pattern, conds in
                             self.configs.get("triggers") or ()],
                "sites": {where: {kinds: rows(alts) for kinds, alts in by.items()} for where, by in
                          (self.configs.get("sites") or {}).items()},
                "derived": {k: [other, dict(mapping)] for k, (other, mapping) in
                            (self.configs.get("derived") or {}).items()},
                "twins": {op: {v: list(pair) for v, pair in by.items()} for op, by in
                          (self.configs.get("twins") or {}).items()}}

    def remedy_table(self) -> dict:
        """``remedies`` as JSON rows for ``report.json``'s ``engine.remedies``: ``{"module.qualname": [{"kinds",
        "trigger", "cause", "fix", "impact"}]}`` (``trigger`` None for a rule keyed by kinds alone)."""
        out: dict[str, list[dict]] = {}
        for where, rules in self.remedies.items():
            for key, (cause, fix, *impact) in rules.items():
                kinds, trig = key if isinstance(key, tuple) else (key, None)
                out.setdefault(where, []).append({"kinds": kinds, "trigger": trig, "cause": cause, "fix": fix,
                                                  "impact": impact[0] if impact else ""})
        return out

    def __post_init__(self):
        both = set(self.forward_only) & set(self.detached)
        if both:
            raise BindingError(f"binding {self.name!r}: {sorted(both)} cannot be both forward_only (gradient not "
                               "checked) and detached (gradient must be absent or zero)")
        for where, rules in self.remedies.items():
            for key, text in rules.items():
                if not (isinstance(text, tuple) and 2 <= len(text) <= 3 and all(isinstance(t, str) for t in text)
                        and text[0] and text[1]):
                    raise BindingError(f"binding {self.name!r}: remedy of {where} [{key}] must be (cause, fix[, "
                                       f"impact]) sentences, got {text!r}")
        odd = set(self.detached) - set(DETACHABLE)
        if odd:
            raise BindingError(f"binding {self.name!r}: detached {sorted(odd)}: only {list(DETACHABLE)} check the "
                               "detached contract")

    def device_gap(self, op: str, regime: str | None = None) -> str | None:
        """Why ``op`` (under ``regime``: an ``impl@data`` regime checks implementation ``impl``) cannot run on
        the run's device (:func:`rlconform.harness.core.device.missing`: ``"needs CUDA (...)"``), or None.
        Reads only the declarations (:attr:`needs`, :attr:`Implementation.needs`): nothing is imported."""
        from rlconform.harness.core import device

        needs = self.needs.get(op)
        impl = self.ops.get(op)
        if isinstance(impl, Implementation) and impl.needs:
            needs = impl.needs
        if regime and "@" in regime:
            name = regime.split("@", 1)[0]
            alt = self.implementations.get(op, {}).get(name)
            if isinstance(alt, Implementation):
                needs = alt.needs
        return device.missing(needs)

    def provided_implementations(self, op: str) -> tuple[str, ...]:
        """The alternative implementations of ``op`` the binding declares (no import needed)."""
        return tuple(self.implementations.get(op, {}))

    def resolve_implementation(self, op: str, name: str) -> Implementation:
        """The :class:`Implementation` ``name`` of ``op`` with ``fn`` resolved (a Lazy loaded); raises
        :class:`VariantNotProvided` when the binding has no such implementation, :class:`OpUnavailable`
        when it cannot be loaded and :class:`BindingError` when it is malformed."""
        key = f"{op}@{name}"
        if key in self._cache:
            cached = self._cache[key]
            if isinstance(cached, OpUnavailable):
                raise cached
            return cached
        impl = self.implementations.get(op, {}).get(name)
        if impl is None:
            raise VariantNotProvided(op, name, self.name)
        if not isinstance(impl, Implementation):
            raise BindingError(f"binding {self.name!r}: implementation {name!r} of {op!r} must be an "
                               f"Implementation, got {type(impl).__name__}")
        fn = impl.fn
        if isinstance(fn, Lazy):
            try:
                fn = fn.load()
            except BindingError:
                raise
            except BaseException as exc:  # noqa: BLE001 - an import failure makes the implementation unavailable
                if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                    raise
                err = OpUnavailable(key, "".join(traceback.format_exception(exc)))
                self._cache[key] = err
                raise err from exc
        validate_impl(op, fn, where=f"binding {self.name!r} (implementation {name!r})")
        resolved = dataclasses.replace(impl, fn=fn)
        self._cache[key] = resolved
        return resolved

    def provided_ops(self) -> list[str]:
        return list(self.ops)

    def extend(self, *, ops: Mapping[str, Any] | None = None, not_bound: Mapping[str, str] | None = None,
               modules: tuple[str, ...] = (), notes: Mapping[str, str] | None = None,
               name: str | None = None) -> "Binding":
        """A new binding: this one with ``ops`` bound (an op already bound is replaced: a fork's own
        function for it), ``not_bound`` justifications (``"module.function": "why it is not an op"``) and
        ``modules`` added to its coverage (the fork's numerics modules, inventoried by ``coverage``), and
        ``notes`` added; this binding is left as it was. Raises :class:`BindingError` for
        an unknown op, or justifications on a binding that declares no coverage."""
        from rlconform.harness.catalog.ops import OPS

        unknown = [op for op in (ops or {}) if op not in OPS]
        if unknown:
            raise BindingError(f"extend: unknown op(s) {', '.join(unknown)}; choose from {', '.join(OPS)}")
        coverage = self.coverage
        if not_bound or modules:
            if coverage is None:
                raise BindingError("extend: not_bound / modules need a binding that declares coverage "
                                   "(Binding.coverage)")
            coverage = dataclasses.replace(coverage, modules=tuple(coverage.modules) + tuple(
                m for m in modules if m not in coverage.modules), not_bound={**coverage.not_bound, **(not_bound or {})})
        return dataclasses.replace(self, ops={**self.ops, **(ops or {})}, coverage=coverage,
                                   notes={**self.notes, **(notes or {})}, name=name or self.name)

    def provided_variants(self, op: str) -> tuple[str, ...] | None:
        """The variants of ``op`` the engine provides (``None``: all the catalog knows, or the op has no
        variants). Resolves the op (may raise :class:`OpUnavailable` / :class:`BindingError`)."""
        return getattr(self.resolve(op), "variants", None)

    def unchecked_variants(self, op: str) -> dict:
        """Variants the engine registers that the catalog does not know: name -> why unchecked."""
        return dict(getattr(self.resolve(op), "unchecked", None) or {})

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
        validate_impl(op, impl, where=f"binding {self.name!r}")
        self._cache[op] = impl
        return impl


class ImplementationView:
    """``binding`` as a second implementation of its variants sees it: ``resolve(op)`` gives the
    registry whose ``impls`` are implementation ``impl``'s callables (:meth:`Variants.implementation`), so a
    family's ``evaluate`` checks it under the plain ``variant@data`` regime with no change; everything else
    (name, spec, other ops, forward_only) is the binding's."""

    def __init__(self, binding: "Binding", op: str, impl: str):
        self._binding, self._op, self.implementation_name = binding, op, impl

    def resolve(self, op: str) -> Any:
        impl = self._binding.resolve(op)
        if op == self._op and isinstance(impl, Variants):
            return impl.implementation(self.implementation_name)
        return impl

    def __getattr__(self, name: str) -> Any:
        return getattr(self._binding, name)


def validate_impl(op: str, impl: Any, *, where: str = "binding") -> None:
    """Check that ``impl`` has the shape the catalog expects for ``op``; raise :class:`BindingError`
    naming the op (and the callable's file and line) otherwise."""
    info = OPS.get(op)
    if info is None:
        return  # ops outside the catalog are rejected by engines.validate_binding
    if info.kind == "agg_loss":
        if not isinstance(impl, AggLoss):
            raise BindingError(f"{where}: op 'agg_loss' must be an AggLoss, got {type(impl).__name__}")
        return
    if info.kind == "metric_pipeline":
        if not isinstance(impl, MetricPipeline):
            raise BindingError(f"{where}: op 'metric_pipeline' must be a MetricPipeline, got {type(impl).__name__}")
        return
    if info.kind == "policy_step":
        if not isinstance(impl, PolicyStep):
            raise BindingError(f"{where}: op 'policy_step' must be a PolicyStep, got {type(impl).__name__}")
        return
    if info.variants:
        if not isinstance(impl, Variants):
            raise BindingError(f"{where}: op {op!r} has variants ({', '.join(info.variants)}): bind it as "
                               f"Variants({{variant: callable}}), got {type(impl).__name__}")
        unknown = sorted(set(impl.impls) - set(info.variants))
        if unknown:
            raise BindingError(f"{where}: op {op!r} has no variant(s) {unknown}; the catalog knows "
                               f"{', '.join(info.variants)} (list engine-only names in Variants.unchecked)")
        for name, fn in impl.impls.items():
            if not callable(fn):
                raise BindingError(f"{where}: variant {name!r} of {op!r} must be callable, got {type(fn).__name__}")
        for impl_name, fns in (impl.implementations or {}).items():
            if impl_name not in info.variant_implementations:
                known = ", ".join(info.variant_implementations) or "none"
                raise BindingError(f"{where}: op {op!r} has no implementation {impl_name!r} of its variants; the "
                                   f"catalog knows {known} (list engine-only names in Variants.unchecked)")
            for name, fn in fns.items():
                if name not in impl.impls:
                    raise BindingError(f"{where}: implementation {impl_name!r} of variant {name!r} of {op!r} needs "
                                       f"the variant's default implementation in Variants.impls (it is checked "
                                       f"against it)")
                if not callable(fn):
                    raise BindingError(f"{where}: implementation {impl_name!r} of variant {name!r} of {op!r} must "
                                       f"be callable, got {type(fn).__name__}")
        return
    if isinstance(impl, Implementation):  # the op bound with its contract (e.g. fused_linear_token_stats)
        impl = impl.fn
    if not callable(impl):
        raise BindingError(f"{where}: op {op!r} must be callable, got {type(impl).__name__}")
    arity = signature_arity(impl)
    if arity is not None and info.arity is not None:
        required, maximum = arity
        if not (required <= info.arity <= maximum):
            code = getattr(impl, "__code__", None)
            loc = f" ({code.co_filename}:{code.co_firstlineno})" if code is not None else ""
            raise BindingError(
                f"{where}: op {op!r} takes {info.arity} positional argument(s) "
                f"but {getattr(impl, '__qualname__', impl)!r}{loc} accepts {required}..{maximum}"
            )


def twins(variants, key: str) -> dict[str, list[str]]:
    """``configs["twins"]`` (read by :func:`rlconform.harness.report.config_reach.alternatives`) of variants named
    ``<mode>-with-<correction>``: each correction drawn on exactly two modes pairs its two variants, ``key`` the
    configuration key of the mode."""
    by_correction: dict[str, list[str]] = {}
    for v in variants:
        mode, _, correction = v.partition("-with-")
        if correction:
            by_correction.setdefault(correction, []).append(v)
    return {v: [pair[1 - i], key] for pair in by_correction.values() if len(pair) == 2 for i, v in enumerate(pair)}
