"""Where rlconform keeps what it can compute again: ``$RLCONFORM_CACHE_DIR``, else ``$XDG_CACHE_HOME/rlconform``,
else ``~/.cache/rlconform``; ``RLCONFORM_NO_CACHE=1`` turns every cache off. Each cache is a folder of its own
under it (an engine's metadata, discovery's reading of source files), and a file that cannot be read or written
is ignored by its reader: a cache only ever saves time."""

from __future__ import annotations

import os

__all__ = ["cache_folder"]


def cache_folder(name: str) -> str | None:
    """The folder of cache ``name`` (not created), or None when ``RLCONFORM_NO_CACHE`` is set."""
    if os.environ.get("RLCONFORM_NO_CACHE"):
        return None
    root = os.environ.get("RLCONFORM_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "rlconform")
    return os.path.join(root, name)
