"""The adopter's ledger of known discrepancies (``--xfails FILE``).

One finding id per line (``op.property.dtype.regime``, as printed in reports), ``#`` starts a comment,
blank lines are ignored. A listed finding that fails is reported ``xfail``; one that now passes is
reported ``xpass`` and fails the run, so the ledger is kept honest (array-api-tests style).
"""

from __future__ import annotations

import re

from rlconform.harness.binding import BindingError
from rlconform.harness.catalog import FLOAT_DTYPES, OPS, PROPERTIES

_ID = re.compile(r"^([A-Za-z0-9_]+)\.([a-z_]+)\.([a-z0-9]+)\.([A-Za-z0-9_]+)$")


class XfailsError(BindingError):
    """The ledger is malformed; the message names the file and line."""


def parse_xfails(path: str, extra_ops: tuple[str, ...] = ()) -> dict[str, str]:
    """Return ``{finding id: comment}``; raise :class:`XfailsError` naming ``path:line`` on a bad line."""
    try:
        with open(path) as fh:
            lines = fh.read().splitlines()
    except OSError as exc:
        raise XfailsError(f"cannot read xfails file {path}: {exc.strerror}") from exc
    out: dict[str, str] = {}
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
        out[text] = comment.strip()
    return out
