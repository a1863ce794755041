"""One safe way to read a JSON file that a user hands the harness.

Reports (``report.json``), case files, corpus cases and the engine record of a run are data that may be
malformed, truncated, not UTF-8, or built to break a parser (200 000 nested ``[``: CPython's decoder raises
``RecursionError``). :func:`load_json` turns every such failure into one :class:`JsonFileError` (a
``ValueError``) whose message is one line naming the file and the fault, so that every command can print
it and exit 2, never a traceback.

Nesting deeper than :data:`MAX_DEPTH` is refused (no rlconform document nests more than a few levels), so
no code that later walks the document recursively can hit the interpreter's recursion limit.
"""

from __future__ import annotations

import json

#: the deepest nesting of ``[`` / ``{`` accepted (rlconform's own documents nest fewer than 10 levels)
MAX_DEPTH = 64
_TOO_DEEP = object()


class JsonFileError(ValueError):
    """A JSON file could not be read or decoded; the message is one line naming the file."""


def nesting_depth(doc: object, limit: int = MAX_DEPTH) -> int:
    """The deepest nesting of lists / dicts in the decoded ``doc`` (iterative), counted up to ``limit + 1``."""
    deepest, stack = 0, [(doc, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, (list, dict)):
            if depth > deepest:
                deepest = depth
                if deepest > limit:
                    return deepest
            stack.extend((v, depth + 1) for v in (node.values() if isinstance(node, dict) else node))
    return deepest


def loads(text: str | bytes, what: str = "JSON") -> object:
    """Decode ``text`` (bytes are read as UTF-8, a byte-order mark accepted). Raises :class:`JsonFileError`
    (one line, starting with ``what``) on bytes that are not UTF-8, text that is not JSON, or nesting
    deeper than :data:`MAX_DEPTH`."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise JsonFileError(f"{what}: not UTF-8 text (byte {exc.start})") from None
    try:
        doc = json.loads(text)
    except RecursionError:
        doc = _TOO_DEEP
    except ValueError as exc:
        raise JsonFileError(f"{what}: not JSON: {exc}") from None
    if doc is _TOO_DEEP or nesting_depth(doc) > MAX_DEPTH:
        raise JsonFileError(f"{what}: JSON nested deeper than {MAX_DEPTH} levels; not an rlconform document")
    return doc


def load_json(path: str, what: str | None = None) -> object:
    """Read and decode the JSON file ``path``. Raises :class:`JsonFileError` (one line naming ``path``) when it
    cannot be read or decoded (see :func:`loads`)."""
    label = what or str(path)
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise JsonFileError(f"{label}: cannot read: {exc.strerror or exc}") from None
    return loads(data, label)


def load_object(path: str, what: str | None = None) -> dict:
    """:func:`load_json`, and the document must be one JSON object (else :class:`JsonFileError`)."""
    doc = load_json(path, what)
    if not isinstance(doc, dict):
        raise JsonFileError(f"{what or path}: not a JSON object (a {type(doc).__name__})")
    return doc
