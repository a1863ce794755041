"""The coverage items a change touches: ``rlconform coverage --changed-since REV`` (the pull-request check).

A pull request that adds or edits a numerics function the binding neither binds nor justifies must say so
in its comment, even when no bound function changed ("nothing to check"). :func:`changed_items` keeps the
items of a coverage record whose function (its ``site``: ``file:line`` of its ``def``, relative to the
checkout) has a line ``git diff -U0 REV HEAD`` reports changed.
"""

from __future__ import annotations

import os

from rlconform.harness.core.code_changes import changed_lines, function_ranges

__all__ = ["changed_items"]


def _span(path: str, line: int) -> tuple[int, int]:
    """The smallest function or class range of ``path`` holding ``line`` (its ``def``), else the line alone."""
    spans = [r for r in function_ranges(path).values() if r[0] <= line <= r[1]]
    return min(spans, key=lambda r: r[1] - r[0]) if spans else (line, line)


def changed_items(record: dict, checkout: str, rev: str) -> dict:
    """``record`` (a coverage record) with only its items whose function changed between ``rev`` and HEAD of
    ``checkout``, and its ``counts`` recomputed. Raises :class:`~rlconform.harness.core.code_changes.ChangeError`
    when the change cannot be read."""
    hunks = changed_lines(checkout, rev)
    kept = []
    for item in record.get("items") or ():
        site = item.get("site") if isinstance(item, dict) else None
        file, _, line = (site or "").rpartition(":")
        if not file or not line.isdigit() or file not in hunks:
            continue
        first, last = _span(os.path.join(checkout, file), int(line))
        if any(a <= last and first <= b for a, b in hunks[file]):
            kept.append(item)
    counts: dict[str, int] = {}
    for item in kept:
        counts[item.get("status")] = counts.get(item.get("status"), 0) + 1
    return dict(record, items=kept, counts=counts, changed_since=rev)
