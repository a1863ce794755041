"""The adopter's ledger of known discrepancies (``--xfails FILE``).

One finding id per line (``op.property.dtype.regime``, as printed in reports), ``#`` starts a comment,
blank lines are ignored. The file is UTF-8 (a byte-order mark, as some editors write, is accepted); a
file that is not UTF-8 is an :class:`XfailsError` naming the line. A finding listed twice is accepted
with one warning (``warnings``) naming both lines of the first duplicate and counting the others (a
million duplicate lines give one warning, not a million). A listed finding that fails is reported ``xfail``; one that now passes is
reported ``xpass`` and fails the run, so the ledger is kept honest (array-api-tests style).

A listed finding that is ``marginal`` (inside the margin band of
:func:`rlconform.harness.core.tolerance.verdict`) stays ``marginal``: a line matches it marginal or failing
alike, so a verdict that CPUs' last bits move is never red either way. (The ``# flaky`` marker of earlier
ledgers is retired: the band covers what it was for, and such a comment is now a comment like any other.)
"""

from __future__ import annotations

import re

from rlconform.harness.catalog.binding import BindingError
from rlconform.harness.catalog.ops import FLOAT_DTYPES, OPS, PROPERTIES
from rlconform.harness.core.opinfo import FINDING_ID

_ID = re.compile(f"^{FINDING_ID}$")


class XfailsError(BindingError):
    """The ledger is malformed; the message names the file and line."""


def parse_xfails(path: str, extra_ops: tuple[str, ...] = (), warnings: list[str] | None = None) -> dict[str, str]:
    """Return ``{finding id: comment}``; raise :class:`XfailsError` naming ``path:line`` on a bad line.
    Duplicate lines are summed up in one ``path:line: ...`` message appended to ``warnings`` (when given)."""
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise XfailsError(f"cannot read xfails file {path}: {exc.strerror or exc}") from exc
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise XfailsError(f"{path}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x}); save the ledger as "
                          f"UTF-8") from None
    lines = text.splitlines()
    out: dict[str, str] = {}
    first_line: dict[str, int] = {}
    first_dup, dups = None, 0
    for n, raw in enumerate(lines, 1):
        text, _, comment = raw.partition("#")
        text = text.strip()
        if not text:
            continue
        m = _ID.match(text)
        if not m:
            raise XfailsError(f"{path}:{n}: malformed finding id {text!r} (expected op.property.dtype.regime)")
        op, prop, dtype, regime = m.groups()
        if op not in OPS and op not in extra_ops:
            raise XfailsError(f"{path}:{n}: unknown op {op!r} in {text!r}")
        if prop not in PROPERTIES:
            raise XfailsError(f"{path}:{n}: unknown property {prop!r} in {text!r} (one of {', '.join(PROPERTIES)})")
        if dtype not in FLOAT_DTYPES:
            raise XfailsError(f"{path}:{n}: unknown dtype {dtype!r} in {text!r}")
        info = OPS.get(op)
        if info is not None:
            if prop not in info.properties:
                raise XfailsError(f"{path}:{n}: property {prop!r} does not apply to {op!r} "
                                  f"(it has {', '.join(info.properties)})")
            if regime not in info.regimes:
                raise XfailsError(f"{path}:{n}: unknown regime {regime!r} for {op!r} "
                                  f"(one of {', '.join(info.regimes)})")
            if dtype not in info.regimes[regime]:
                raise XfailsError(f"{path}:{n}: regime {regime!r} of {op!r} is not checked in {dtype}")
            only = info.property_regimes.get(prop)
            if only is not None and regime not in only:
                raise XfailsError(f"{path}:{n}: property {prop!r} of {op!r} is not checked under regime {regime!r} "
                                  f"(only {', '.join(only)})")
        if text in first_line:
            if first_dup is None:
                first_dup = f"{path}:{n}: {text} is listed again (first on line {first_line[text]})"
            dups += 1
            continue
        first_line[text] = n
        out[text] = comment.strip()
    if first_dup is not None and warnings is not None:
        more = f", and {dups - 1} more duplicate line(s)" if dups > 1 else ""
        warnings.append(f"{first_dup}{more}; the duplicate line{'s are' if dups > 1 else ' is'} ignored")
    return out
