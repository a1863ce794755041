"""Which findings a run selects: every ``(op, property, dtype, regime)`` of the catalog that the engine
binds and the ``--op/--property/--dtype`` filters keep (shared by ``check``, the pytest plugin and the
completeness check of a run). A variant regime (``variant@data``) is selected only when the engine
provides that variant (``variants``: op -> the provided variants, or None for all). A profile-only regime
(:attr:`~rlconform.harness.core.opinfo.OpInfo.profile_regimes`, e.g. ``real_shapes`` in ``nightly``) is selected
only under a profile that adds it: under any other it is not in the selection at all (not a skip).
For an op with alternative implementations the plain regimes check its default
implementation and an ``impl@data`` regime is selected only when ``variants[op]`` lists ``impl`` (none when it is absent)."""

from __future__ import annotations


def selected_findings(provided, ops=(), properties=(), dtypes=(), *, distributed: bool | None = None,
                      variants: dict | None = None, profile: str | None = None, regimes=(),
                      findings=None) -> list[tuple]:
    """``(op, property, dtype, regime)`` of every finding the binding provides that the filters select, in
    catalog order; ``distributed`` keeps only the ops that are (True) or are not (False) checked on ranks;
    ``profile``: the run's profile (its profile-only regimes are added; None: none are); ``regimes``: only
    these regimes (a data regime name also selects ``variant@data`` and ``<layout>_data`` regimes);
    ``findings``: only these finding ids (``--findings``, ``--changed-since``; None: no such filter)."""
    from rlconform.harness.catalog.ops import OPS
    from rlconform.harness.core.opinfo import split_regime

    out = []
    for op in OPS.values():
        if op.name not in provided or (distributed is not None and op.distributed != distributed):
            continue
        allowed = (variants or {}).get(op.name) if op.variants else None
        impls = set((variants or {}).get(op.name) or ()) if op.implementations else None
        for prop, dtype, regime in op.findings(profile):
            if allowed is not None and split_regime(regime)[0] not in allowed:
                continue
            if impls is not None and split_regime(regime)[0] not in impls | {None}:
                continue
            if regimes and not any(regime_matches(regime, r) for r in regimes):
                continue
            if findings is not None and ".".join((op.name, prop, dtype, regime)) not in findings:
                continue
            if (not ops or op.name in ops) and (not properties or prop in properties) and (not dtypes or dtype in dtypes):
                out.append((op.name, prop, dtype, regime))
    return out


def regime_matches(regime: str, name: str) -> bool:
    """``regime`` is ``name``, or its data part is (``variant@name``, ``tp2_name``)."""
    from rlconform.harness.core.opinfo import split_regime

    data = split_regime(regime)[1]
    return regime == name or data == name or data.endswith("_" + name)


def finding_costs(report_path: str) -> dict[str, float]:
    """finding id -> its cost in seconds (``cost_s``) in a report.json of an earlier run (what ``--shard``
    balances); raises OSError / ValueError when the file is not a readable report."""
    from rlconform.harness.core.safe_json import load_object

    doc = load_object(report_path)
    out = {}
    for f in doc.get("findings") or ():
        cost = f.get("cost_s") if isinstance(f, dict) else None
        if isinstance(f, dict) and isinstance(f.get("id"), str) and isinstance(cost, (int, float)) \
                and not isinstance(cost, bool) and cost >= 0:
            out[f["id"]] = float(cost)
    return out


def shard_of(ids: list[str], costs: dict[str, float], index: int, count: int) -> list[str]:
    """The finding ids of shard ``index`` (1-based) of ``count``: the selection split so that the shards'
    costs (``costs``: seconds per finding from an earlier run; a finding without one costs the median of the
    known, or 1) are balanced — longest first, each to the shard with the least so far, ties to the lower
    shard. Deterministic: every job of a CI matrix computes the same split. Returned in ``ids``' order."""
    known = sorted(costs[i] for i in ids if i in costs)
    default = known[len(known) // 2] if known else 1.0
    cost = {i: costs.get(i, default) for i in ids}
    loads = [0.0] * count
    owner = {}
    for i in sorted(ids, key=lambda x: (-cost[x], x)):
        k = min(range(count), key=lambda s: (loads[s], s))
        loads[k] += cost[i]
        owner[i] = k
    return [i for i in ids if owner[i] == index - 1]
