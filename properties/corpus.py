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


def save_to_corpus(corpus: str, case: Case) -> str | None:
    """Save ``case`` under ``corpus/<finding id>/<content hash>.json``; return the path, or None if
    the same case is already there."""
    doc = case.to_json()
    text = json.dumps(doc, sort_keys=True)
    name = hashlib.sha256(text.encode()).hexdigest()[:16] + ".json"
    folder = os.path.join(corpus, case.finding_id)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, name)
    if os.path.exists(path):
        return None
    with open(path, "w") as fh:
        fh.write(text)
    return path
