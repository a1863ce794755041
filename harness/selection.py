"""Which findings a run selects: every ``(op, property, dtype, regime)`` of the catalog that the engine
binds and the ``--op/--property/--dtype`` filters keep (shared by ``check``, the pytest plugin and the
completeness check of a run)."""

from __future__ import annotations


def selected_findings(provided, ops=(), properties=(), dtypes=(), kinds=None) -> list[tuple]:
    """``(op, property, dtype, regime)`` of every finding the binding provides that the filters select,
    in catalog order; ``kinds`` restricts to those op kinds."""
    from rlconform.harness.catalog import OPS

    out = []
    for op in OPS.values():
        if op.name not in provided or (kinds and op.kind not in kinds):
            continue
        for prop in op.properties:
            for dtype, regime in op.cases():
                if (not ops or op.name in ops) and (not properties or prop in properties) and (not dtypes or dtype in dtypes):
                    out.append((op.name, prop, dtype, regime))
    return out
