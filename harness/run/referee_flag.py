"""The ``--referee`` / ``--no-referee`` option of ``check``, ``replay`` and ``fuzz``.

The referee is on by default: the float64 reference, the dtype-faithful path, the tolerance and the
property's judgment run in a process that never imports engine code
(:mod:`rlconform.harness.workers.referee`). ``--no-referee`` (or ``RLCONFORM_REFEREE=0`` / ``false`` /
``no`` / ``off`` in the environment) runs the whole check in the engine's process: for debugging only, an
engine that patches torch or rlconform there can bend the verdict.
"""

from __future__ import annotations

import argparse
import os

#: values of ``RLCONFORM_REFEREE`` that turn the referee off
OFF = ("0", "false", "no", "off")

HELP = ("judge in a referee process that never imports the engine (the default); --no-referee judges in the "
        "engine's process: for debugging only, an engine can bend the verdict (RLCONFORM_REFEREE=0 sets it)")


def default() -> bool:
    """Whether the referee is on when the command line does not say: on unless ``RLCONFORM_REFEREE`` is one
    of :data:`OFF` (case and surrounding spaces ignored)."""
    return os.environ.get("RLCONFORM_REFEREE", "").strip().lower() not in OFF


def add_argument(parser: argparse.ArgumentParser) -> None:
    """Add ``--referee`` / ``--no-referee`` (``args.referee``: bool) to ``parser``."""
    parser.add_argument("--referee", action=argparse.BooleanOptionalAction, default=default(), help=HELP)
