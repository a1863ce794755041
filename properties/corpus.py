"""The corpus of saved counterexamples: ``rlconform fuzz`` saves every new shrunk counterexample as a
case file under ``<corpus>/<finding id>/``; ``check`` replays them before drawing new examples, so a
bug found once is checked forever."""

from __future__ import annotations

import glob
import hashlib
import json
import os

from rlconform.properties.case import Case, load_case


def corpus_files(corpus: str | None, finding_id: str) -> list[str]:
    if not corpus:
        return []
    return sorted(glob.glob(os.path.join(corpus, finding_id, "*.json")))


def replay_corpus(corpus: str | None, finding_id: str, check) -> int:
    """Run ``check(case)`` on every saved case of ``finding_id``; the first failure propagates."""
    files = corpus_files(corpus, finding_id)
    for path in files:
        check(load_case(path))
    return len(files)


def _text(case: Case) -> str:
    return json.dumps(case.to_json(), sort_keys=True)


def corpus_path(corpus: str, case: Case) -> str:
    """Where ``case`` is (or would be) saved: ``corpus/<finding id>/<content hash>.json``."""
    name = hashlib.sha256(_text(case).encode()).hexdigest()[:16] + ".json"
    return os.path.join(corpus, case.finding_id, name)


def save_to_corpus(corpus: str, case: Case) -> str | None:
    """Save ``case`` under ``corpus/<finding id>/<content hash>.json``; return the path, or None if
    the same case is already there."""
    text = _text(case)
    path = corpus_path(corpus, case)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if os.path.exists(path):
        return None
    with open(path, "w") as fh:
        fh.write(text)
    return path
