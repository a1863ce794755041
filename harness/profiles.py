"""Hypothesis profiles: ``dev`` (fast, local), ``ci`` (derandomized; inherits hypothesis' own ``ci``
profile), ``nightly`` (many examples). ``--max-examples`` and ``--seed`` override per run.

Numbers of examples are per finding (op × property × dtype × regime); the CI profile is sized so that
``rlconform check --engine reference`` runs in a few minutes on 2 cores and every mutant family is
caught (see tests/test_mutants.py).
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings

PROFILES = {"dev": 8, "ci": 20, "nightly": 500}

#: shrinking steps a failing finding may take per profile (None: hypothesis' own limit). Shrinking is
#: where a failing run spends its time (verl's CI-profile run: 15 500 examples, ~25 000 shrinking steps,
#: one round trip to the gloo ranks each for the distributed findings); past the budget the smallest
#: failing input found so far is the reproducer. A finding listed in the xfails ledger is not shrunk at
#: all (:data:`KNOWN_SHRINKS`): its first failing example confirms a known discrepancy. ``--max-shrinks``
#: overrides both. Only the reproducer's size depends on it, never a finding's status.
MAX_SHRINKS = {"dev": 25, "ci": 50, "nightly": None}
KNOWN_SHRINKS = 0
_SUPPRESS = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large,
             HealthCheck.filter_too_much, HealthCheck.differing_executors]


def register_profiles() -> None:
    settings.register_profile("rlconform-dev", max_examples=PROFILES["dev"], deadline=None,
                              suppress_health_check=_SUPPRESS)
    settings.register_profile("rlconform-ci", parent=settings.get_profile("ci"), max_examples=PROFILES["ci"],
                              deadline=None, suppress_health_check=_SUPPRESS, print_blob=False)
    settings.register_profile("rlconform-nightly", max_examples=PROFILES["nightly"], deadline=None,
                              suppress_health_check=_SUPPRESS)


def shrink_budget(profile: str, listed: bool, override: int | None = None) -> int | None:
    """Shrinking steps allowed for one failing finding: ``override`` (``--max-shrinks``; negative = no
    limit) if given, else :data:`KNOWN_SHRINKS` for a finding listed in the xfails ledger, else the
    profile's :data:`MAX_SHRINKS`."""
    if override is not None:
        return None if override < 0 else override
    return KNOWN_SHRINKS if listed else MAX_SHRINKS[profile]


def settings_for(profile: str, max_examples: int | None = None, database=None) -> settings:
    """The hypothesis settings of ``profile`` (dev|ci|nightly), optionally with ``max_examples`` and an
    example ``database`` overridden. Also pins example generation to the seed
    (:func:`rlconform.harness.determinism.pin_generation`)."""
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; choose one of {', '.join(PROFILES)}")
    from rlconform.harness.determinism import pin_generation

    pin_generation()  # the same examples wherever the engine, the binding or rlconform live (issue 12)
    register_profiles()
    base = settings.get_profile(f"rlconform-{profile}")
    kwargs = {}
    if max_examples is not None:
        kwargs["max_examples"] = max_examples
    if database is not None:
        kwargs["database"] = database
    return settings(base, **kwargs) if kwargs else base
