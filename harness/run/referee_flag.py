"""The ``--referee`` / ``--no-referee`` option of ``check``, ``replay`` and ``fuzz``.

The referee is on by default for an engine: the float64 reference, the dtype-faithful path, the tolerance and
the property's judgment run in a process that never imports engine code
(:mod:`rlconform.harness.workers.referee`). ``--no-referee`` (or ``RLCONFORM_REFEREE=0`` / ``false`` /
``no`` / ``off`` in the environment) runs the whole check in the engine's process: for debugging only, an
engine that patches torch or rlconform there can bend the verdict. rlconform's own code (the reference
engine, ``mutants.*``: no engine package, nothing patched at import) is judged in its own process unless
``--referee`` (or ``RLCONFORM_REFEREE=1``) asks for the referee: the verdicts are the same
(docs/decisions/own-code-in-process.md), and a referee's start is saved.
"""

from __future__ import annotations

import argparse
import os

#: values of ``RLCONFORM_REFEREE`` that turn the referee off
OFF = ("0", "false", "no", "off")

HELP = ("judge in a referee process that never imports the engine (the default for an engine; rlconform's own "
        "reference and mutants.* are judged in their process unless --referee); --no-referee judges in the "
        "engine's process: for debugging only, an engine can bend the verdict (RLCONFORM_REFEREE=0 sets it)")


def default() -> bool:
    """Whether the referee is on when the command line does not say: on unless ``RLCONFORM_REFEREE`` is one
    of :data:`OFF` (case and surrounding spaces ignored)."""
    return resolve(None, own_code=False)


def resolve(value: bool | None, own_code: bool) -> bool:
    """Whether a command judges in a referee: ``value`` (``--referee`` / ``--no-referee``) when given, else
    ``RLCONFORM_REFEREE`` when set (one of :data:`OFF`: no; anything else: yes), else yes for an engine and no
    for rlconform's own code (``own_code``: the reference engine, ``mutants.*``)."""
    if value is not None:
        return bool(value)
    env = os.environ.get("RLCONFORM_REFEREE", "").strip().lower()
    if env:
        return env not in OFF
    return not own_code


def add_argument(parser: argparse.ArgumentParser) -> None:
    """Add ``--referee`` / ``--no-referee`` to ``parser`` (``args.referee``: True, False, or None when the
    command line does not say: :func:`resolve` decides once the engine is known)."""
    parser.add_argument("--referee", action=argparse.BooleanOptionalAction, default=None, help=HELP)
