"""A cache of an installed engine's metadata (:func:`rlconform.harness.bindings.load.probe_engine`).

Reading what a built-in binding provides (its ops, variants, coverage table, configurations, engine sites)
imports the engine in a child process: for verl about 15 CPU s, more than the checks of a narrowed run. The
result is a function of code only, so it is kept, as JSON, under a key made of everything it is read from:

* the binding spec and whether engine sites were asked for;
* the interpreter (``sys.version``, ``sys.prefix``) and every installed distribution's name and version;
* the path, size and modification time of every Python file of rlconform's own packages and of the engine's
  top-level package (``verl``, ``skyrl``, ``megatron``), so an edit of either reads it afresh;
* the ``RLCONFORM_*`` environment variables and ``CUDA_VISIBLE_DEVICES``.

Only the built-in engines as installed are cached (no ``--engine-path``: a fork's revision is part of its
metadata; no binding file or ``module:attr``: a user's binding may read anything at import). A metadata read
that fails is never kept. The cache lives in ``$RLCONFORM_CACHE_DIR``, else ``$XDG_CACHE_HOME/rlconform``, else
``~/.cache/rlconform``; ``RLCONFORM_NO_CACHE=1`` turns it off. A file that cannot be read or written is
ignored (the metadata is read as without a cache).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import sys
import tempfile

#: the built-in engines whose metadata is cached -> the top-level package whose files key it
ENGINE_PACKAGES = {"verl": "verl", "skyrl": "skyrl", "megatron": "megatron"}
#: rlconform's own packages (their files key every entry)
OWN_PACKAGES = ("rlconform.harness", "rlconform.properties", "rlconform.distributed_tests", "rlconform.reference")
FORMAT = 1
#: environment variables besides ``RLCONFORM_*`` that key an entry (which devices torch sees)
KEYED_ENV = ("CUDA_VISIBLE_DEVICES",)


def cache_dir() -> str | None:
    """The folder of the cache, or None when ``RLCONFORM_NO_CACHE`` is set."""
    from rlconform.harness.core.user_cache import cache_folder

    return cache_folder("engine-meta")


def _package_dirs(name: str) -> list[str]:
    try:
        spec = importlib.util.find_spec(name)  # finds a top-level package without importing it
    except (ImportError, ValueError):
        return []
    if spec is None:
        return []
    return sorted(spec.submodule_search_locations or ())


def _tree_stats(dirs: list[str], digest) -> int:
    """Feed ``digest`` with (path, size, mtime) of every ``.py`` file under ``dirs``; returns the count."""
    n = 0
    for top in dirs:
        for root, subdirs, files in os.walk(top):
            subdirs[:] = sorted(d for d in subdirs if d != "__pycache__")
            for f in sorted(files):
                if f.endswith(".py"):
                    path = os.path.join(root, f)
                    try:
                        st = os.stat(path)
                    except OSError:
                        continue
                    digest.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
                    n += 1
    return n


def key(spec: str, engine_path: str | None, sites: bool) -> str | None:
    """The cache key of ``spec``'s metadata, or None when it is not cached (see the module docstring)."""
    if engine_path is not None or spec not in ENGINE_PACKAGES:
        return None
    engine_dirs = _package_dirs(ENGINE_PACKAGES[spec])
    if not engine_dirs:
        return None  # not installed: the probe says so
    digest = hashlib.sha256(f"{FORMAT}\0{spec}\0{sites}\0{sys.version}\0{sys.prefix}\n".encode())
    dists = sorted(f"{d.metadata['Name']}=={d.version}" for d in importlib.metadata.distributions()
                   if d.metadata and d.metadata["Name"])
    digest.update("\n".join(dists).encode())
    own = [d for name in OWN_PACKAGES for d in _package_dirs(name)]
    if not own or not _tree_stats(own, digest) or not _tree_stats(engine_dirs, digest):
        return None
    digest.update("".join(f"{k}={v}\n" for k, v in sorted(os.environ.items())
                          if k.startswith("RLCONFORM_") or k in KEYED_ENV).encode())
    return digest.hexdigest()


def cached_probe(spec: str, engine_path: str | None, sites: bool, probe) -> dict:
    """``probe()`` (the engine's metadata), read from the cache when an entry for its key is there, else
    computed and kept. Raises what ``probe`` raises (nothing is kept then)."""
    folder = cache_dir()
    k = key(spec, engine_path, sites) if folder else None
    if k is None:
        return probe()
    # one entry per engine, interpreter and sites flag, replaced when its key changes (an edit of rlconform
    # or of the engine does not add a file)
    where = hashlib.sha256(f"{sys.prefix}\0{sites}".encode()).hexdigest()[:16]
    path = os.path.join(folder, f"{spec}-{where}.json")
    try:
        with open(path, encoding="utf-8") as fh:
            entry = json.load(fh)
        if isinstance(entry, dict) and entry.get("key") == k and isinstance(entry.get("meta"), dict):
            return entry["meta"]
    except (OSError, ValueError):
        pass
    meta = probe()
    try:
        text = json.dumps({"key": k, "meta": meta})
    except (TypeError, ValueError):
        return meta  # not plain data: not kept
    try:
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".json")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
            os.replace(tmp, path)  # whole or not at all: several checks may write the same entry
        except OSError:
            os.unlink(tmp)
            raise
    except OSError:
        pass
    # what a later run reads back (JSON: a tuple is a list), as the engine's workers read it from engine.json
    return json.loads(text)["meta"]
