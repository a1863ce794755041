"""Which findings a run selects: every ``(op, property, dtype, regime)`` of the catalog that the engine
binds and the ``--op/--property/--dtype`` filters keep (shared by ``check``, the pytest plugin and the
completeness check of a run). A variant regime (``variant@data``) is selected only when the engine
provides that variant (``variants``: op -> the provided variants, or None for all). For an op with
alternative implementations (issue 11 part 2) the plain regimes check its default implementation and an
``impl@data`` regime is selected only when ``variants[op]`` lists ``impl`` (none when it is absent)."""

from __future__ import annotations


def selected_findings(provided, ops=(), properties=(), dtypes=(), *, distributed: bool | None = None,
                      variants: dict | None = None) -> list[tuple]:
    """``(op, property, dtype, regime)`` of every finding the binding provides that the filters select, in
    catalog order; ``distributed`` keeps only the ops that are (True) or are not (False) checked on ranks."""
    from rlconform.harness.catalog import OPS
    from rlconform.harness.opinfo import split_regime

    out = []
    for op in OPS.values():
        if op.name not in provided or (distributed is not None and op.distributed != distributed):
            continue
        allowed = (variants or {}).get(op.name) if op.variants else None
        impls = set((variants or {}).get(op.name) or ()) if op.implementations else None
        for prop, dtype, regime in op.findings():
            if allowed is not None and split_regime(regime)[0] not in allowed:
                continue
            if impls is not None and split_regime(regime)[0] not in impls | {None}:
                continue
            if (not ops or op.name in ops) and (not properties or prop in properties) and (not dtypes or dtype in dtypes):
                out.append((op.name, prop, dtype, regime))
    return out
