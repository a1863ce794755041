"""Hypothesis profiles: ``dev`` (fast, local), ``ci`` (derandomized; inherits hypothesis' own ``ci``
profile), ``nightly`` (many examples, and the profile-only ``real_shapes`` regime: :data:`PROFILE_ONLY_REGIMES`).
``--max-examples`` and ``--seed`` override per run.

Numbers of examples are per finding (op × property × dtype × regime); the CI profile is sized so that
``rlconform check --engine reference`` runs in a few minutes on 2 cores and every mutant family is
caught (see tests/test_mutants.py).
"""

from __future__ import annotations

import dataclasses
import os

from hypothesis import HealthCheck, Phase, settings

PROFILES = {"dev": 8, "ci": 20, "nightly": 500}

#: Profile-only regimes: regime (data part) -> the profiles that add it. ``real_shapes``
#: (logits at V = 151 936 / 128 256, T up to 4096; reductions over > 2^24 tokens) exists only in
#: ``nightly``: ``dev`` and ``ci`` keep their cost, and under them the regime is not in the selection at all.
PROFILE_ONLY_REGIMES = {"real_shapes": ("nightly",)}
#: examples per finding of a profile-only regime at real sizes (each is seconds to a minute of CPU and up
#: to several GB): derandomized, never shrunk (a shrink step would cost as much as an example, and the
#: description of a failing example is already small), at most this many whatever the profile says
#: (``--max-examples`` may lower it)
REAL_SHAPES_EXAMPLES = 2

#: shrinking steps a failing finding may take per profile (None: hypothesis' own limit). Shrinking is
#: where a failing run spends its time (verl's CI-profile run: 15 500 examples, ~25 000 shrinking steps,
#: one round trip to the gloo ranks each for the distributed findings); past the budget the smallest
#: failing input found so far is the reproducer. A finding the xfails ledger lists shrinks as any other:
#: its shrunk input decides its row of the report (kind, trigger, the engine line that fails), so a check
#: with the ledger (``make check-verl``) writes the report the committed one is (a listed finding that
#: stopped at its first failing example, and verl's report with the ledger showed 38 defects where
#: the same findings shrunk show 34). ``--max-shrinks`` overrides it. Only the reproducer's size and the
#: report's reading of it depend on it, never a finding's status.
MAX_SHRINKS = {"dev": 25, "ci": 50, "nightly": None}
_SUPPRESS = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large,
             HealthCheck.filter_too_much, HealthCheck.differing_executors]

#: the phases of the ci profile: no target phase (no ``target()`` in ``check``) and no explain phase
CI_PHASES = (Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink)


def register_profiles() -> None:
    settings.register_profile("rlconform-dev", max_examples=PROFILES["dev"], deadline=None,
                              suppress_health_check=_SUPPRESS)
    # ci: every setting that decides what is drawn is stated here, none left to a parent profile another
    # package may re-register: derandomized (the runner seeds each finding from its id), no example
    # database (nothing a previous run saved is replayed), no deadline, and neither the target phase
    # (guided generation is `rlconform fuzz`'s) nor the explain phase (extra engine calls after shrinking)
    settings.register_profile("rlconform-ci", parent=settings.get_profile("ci"), max_examples=PROFILES["ci"],
                              deadline=None, suppress_health_check=_SUPPRESS, print_blob=False,
                              derandomize=True, database=None, phases=CI_PHASES)
    settings.register_profile("rlconform-nightly", max_examples=PROFILES["nightly"], deadline=None,
                              suppress_health_check=_SUPPRESS)


def shrink_budget(profile: str, listed: bool, override: int | None = None) -> int | None:
    """Shrinking steps allowed for one failing finding: ``override`` (``--max-shrinks``; negative = no
    limit) if given, else the profile's :data:`MAX_SHRINKS`, whether or not the xfails ledger lists it
    (``listed``: the same budget, see :data:`MAX_SHRINKS`)."""
    if override is not None:
        return None if override < 0 else override
    return MAX_SHRINKS[profile]


def profile_only(regime: str) -> tuple[str, ...] | None:
    """The profiles that add ``regime`` (matched on its data part: ``real_shapes``,
    ``tp2_real_shapes``, ``token-mean@real_shapes``), or None when every profile has it."""
    data = regime.split("@", 1)[-1]
    for name, profiles in PROFILE_ONLY_REGIMES.items():
        if data == name or data.endswith("_" + name):
            return profiles
    return None


def profile_regimes(regimes) -> dict[str, tuple[str, ...]]:
    """``OpInfo.profile_regimes`` for an op with ``regimes``: each profile-only one -> its profiles."""
    return {r: p for r in regimes if (p := profile_only(r)) is not None}


@dataclasses.dataclass(frozen=True)
class ExampleCap:
    """A cap on one finding of a regime whose one example is expensive (``OpInfo.example_caps``): at most
    ``max_examples`` examples and, unless None, ``max_shrinks`` shrinking steps, whatever the profile says
    (``--max-examples`` / ``--max-shrinks`` may only lower them). ``fixed``: derandomized unless the run is
    seeded (``--seed``), no target phase — the same few examples every run. ``profiles``: the profiles it holds
    in (None: every profile); under another the finding has the profile's numbers.

    Raises ValueError for ``max_examples`` < 1, ``max_shrinks`` < 0 or an unknown profile."""

    max_examples: int
    max_shrinks: int | None = None
    fixed: bool = False
    profiles: tuple[str, ...] | None = None

    def __post_init__(self):
        if self.max_examples < 1 or (self.max_shrinks is not None and self.max_shrinks < 0):
            raise ValueError(f"ExampleCap needs max_examples >= 1 and max_shrinks >= 0, not {self}")
        if self.profiles is not None and not set(self.profiles) <= set(PROFILES):
            raise ValueError(f"ExampleCap profiles {self.profiles} are not among {tuple(PROFILES)}")

    def holds_in(self, profile: str | None) -> bool:
        """Whether the cap holds under ``profile`` (None: a run that names none holds every cap)."""
        return self.profiles is None or profile is None or profile in self.profiles


#: the cap of every profile-only regime at real sizes (each example is seconds to minutes of CPU and up to
#: several GB): a few derandomized examples, never shrunk (a shrink step would cost as much as an example,
#: and the description of a failing example is already small)
REAL_SHAPES_CAP = ExampleCap(REAL_SHAPES_EXAMPLES, 0, fixed=True)

#: the cap of a distributed finding (environment variable ``RLCONFORM_DIST_MAX_EXAMPLES``, default 10): a
#: round trip costs 2–5 ms on the pool, but an engine's first call in a worker may compile (verl's
#: vocab-parallel entropy uses ``torch.compile``), and there are about 250 distributed findings per engine.
#: Shrinking keeps the profile's budget.
DISTRIBUTED_CAP = ExampleCap(int(os.environ.get("RLCONFORM_DIST_MAX_EXAMPLES", "10")))


def example_cap(regime: str, caps: dict[str, ExampleCap] | None = None, *, distributed: bool = False,
                profile: str | None = None) -> ExampleCap | None:
    """The cap of a finding of ``regime`` under ``profile`` — the one place a runner takes it from: the op's own
    (``caps``, its ``OpInfo.example_caps``) where it holds in ``profile``, else :data:`REAL_SHAPES_CAP` for a
    profile-only regime, else :data:`DISTRIBUTED_CAP` for a ``distributed`` op, else None (the profile's numbers)."""
    if caps and regime in caps and caps[regime].holds_in(profile):
        return caps[regime]
    if profile_only(regime) is not None:
        return REAL_SHAPES_CAP
    return DISTRIBUTED_CAP if distributed else None


def capped_settings(base: settings, cap: ExampleCap | None, seeded: bool) -> settings:
    """``base`` under ``cap``: unchanged without one; else at most ``cap.max_examples`` examples, and for a
    ``fixed`` cap no target phase and derandomized unless the run is ``seeded``. (Shrinking steps are
    counted by the runner, not by hypothesis.)"""
    if cap is None:
        return base
    kw = {"max_examples": max(1, min(base.max_examples, cap.max_examples))}
    if cap.fixed:
        from hypothesis import Phase

        kw["phases"] = (Phase.explicit, Phase.reuse, Phase.generate)
        if not seeded:
            kw.update(derandomize=True, database=None)
    return settings(base, **kw)


def settings_for(profile: str, max_examples: int | None = None, database=None) -> settings:
    """The hypothesis settings of ``profile`` (dev|ci|nightly), optionally with ``max_examples`` and an
    example ``database`` overridden. Also pins example generation to the seed
    (:func:`rlconform.harness.core.determinism.pin_generation`)."""
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; choose one of {', '.join(PROFILES)}")
    from rlconform.harness.core.determinism import pin_generation

    pin_generation()  # the same examples wherever the engine, the binding or rlconform live
    register_profiles()
    base = settings.get_profile(f"rlconform-{profile}")
    kwargs = {}
    if max_examples is not None:
        kwargs["max_examples"] = max_examples
    if database is not None:
        kwargs["database"] = database
    return settings(base, **kwargs) if kwargs else base
