"""The corpus of saved counterexamples: ``rlconform fuzz`` saves every new shrunk counterexample as a
case file under ``<corpus>/<finding id>/``; ``check`` replays them before drawing new examples, so a
bug found once is checked forever.

A corpus file that cannot be read or is not a valid case is a :class:`CorpusError` naming the file:
a harness-side error (``rlconform check`` exits 2 before running anything), never blamed on the engine.
Files are written atomically (a ``.tmp-*`` file renamed into place), so a killed fuzz run leaves no
half-written case behind (the glob of ``*.json`` does not see the hidden temporary files).
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import tempfile

from rlconform.properties.case import Case, CaseError, load_case


class CorpusError(ValueError):
    """A corpus file is unreadable or not a valid case; the message names the file."""


def corpus_files(corpus: str | None, finding_id: str) -> list[str]:
    if not corpus:
        return []
    return sorted(glob.glob(os.path.join(glob.escape(corpus), glob.escape(finding_id), "*.json")))


def load_corpus_case(path: str, finding_id: str | None = None) -> Case:
    """Load one corpus file; :class:`CorpusError` naming it if it is unreadable, invalid, or (with
    ``finding_id``) a case of another finding than its folder says."""
    try:
        case = load_case(path)
    except OSError as exc:
        raise CorpusError(f"corrupt corpus file {path}: cannot read it ({exc.strerror or exc})") from None
    except CaseError as exc:
        raise CorpusError(f"corrupt corpus file {path}: {exc}") from None
    if finding_id is not None and case.finding_id != finding_id:
        raise CorpusError(f"corrupt corpus file {path}: it holds a case of {case.finding_id}, not of the "
                          f"folder's finding {finding_id}")
    return case


def validate_corpus(corpus: str | None) -> int:
    """Load every case file of the corpus; return how many; raise :class:`CorpusError` on the first bad one."""
    if not corpus:
        return 0
    if not os.path.isdir(corpus):
        raise CorpusError(f"corpus {corpus} is not a folder")
    n = 0
    for path in sorted(glob.glob(os.path.join(glob.escape(corpus), "*", "*.json"))):
        load_corpus_case(path, os.path.basename(os.path.dirname(path)))
        n += 1
    return n


def replay_corpus(corpus: str | None, finding_id: str, check) -> int:
    """Run ``check(case)`` on every saved case of ``finding_id``; the first failure propagates."""
    files = corpus_files(corpus, finding_id)
    for path in files:
        check(load_corpus_case(path, finding_id))
    return len(files)


def _text(case: Case) -> str:
    return json.dumps(case.to_json(), sort_keys=True)


def corpus_path(corpus: str, case: Case) -> str:
    """Where ``case`` is (or would be) saved: ``corpus/<finding id>/<content hash>.json``."""
    name = hashlib.sha256(_text(case).encode()).hexdigest()[:16] + ".json"
    return os.path.join(corpus, case.finding_id, name)


def write_atomic(path: str, text: str) -> None:
    """Write ``text`` to ``path`` through a hidden temporary file in the same folder and a rename."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def save_to_corpus(corpus: str, case: Case) -> str | None:
    """Save ``case`` under ``corpus/<finding id>/<content hash>.json``; return the path, or None if
    the same case is already there."""
    text = _text(case)
    path = corpus_path(corpus, case)
    if os.path.exists(path):
        return None
    write_atomic(path, text)
    return path
