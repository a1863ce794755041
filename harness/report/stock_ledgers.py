"""The ledgers of the released engines that ship with rlconform, chosen by name.

``reports/<engine>-<version>/xfails.txt`` of the repository is package data of ``rlconform.ledgers``
(``pyproject.toml``), so an installed rlconform reads ``--xfails verl-0.9.1`` without a checkout. A name is
looked up only when no file of that name exists: a path always wins.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import re

#: what a stock ledger's name looks like: ``<engine>-<version>``
_NAME = re.compile(r"^[a-z][a-z0-9_.-]*-\d[\w.]*$")


def _root() -> pathlib.Path | None:
    """The folder of ``rlconform.ledgers`` (a namespace package: its search locations, the first folder among
    them; an editable install lists a path hook there too, which ``importlib.resources`` cannot read)."""
    try:
        spec = importlib.util.find_spec("rlconform.ledgers")
    except ModuleNotFoundError:  # a source tree without the mapping (never in an install)
        return None
    for location in (spec.submodule_search_locations or []) if spec else []:
        if os.path.isdir(location):
            return pathlib.Path(location)
    return None


def names() -> list[str]:
    """The stock ledgers this rlconform ships, sorted (e.g. ``["megatron-core-0.19.2", "skyrl-0.4.0", …]``)."""
    root = _root()
    if root is None:
        return []
    return sorted(p.name for p in root.iterdir() if p.is_dir() and (p / "xfails.txt").is_file())


def resolve(value: str) -> str:
    """``value`` itself when it names an existing file or is not a ledger name; else the path of the stock
    ledger of that name. Raises ``FileNotFoundError`` naming the stock ledgers when ``value`` looks like a
    name (``<engine>-<version>``) that none has."""
    if os.path.exists(value) or not _NAME.match(value) or os.sep in value:
        return value
    root = _root()
    if root is not None:
        candidate = root / value / "xfails.txt"
        if candidate.is_file():
            return os.fspath(candidate)
    raise FileNotFoundError(f"no ledger file {value!r} and no stock ledger of that name; stock ledgers: "
                            f"{', '.join(names()) or 'none'}")
