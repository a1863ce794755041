"""What users and contributors read: no project-history words anywhere in the repository, and
docs/bug-kinds.md names mutants that exist and properties that catch them.

A public source names its repository (``SkyRL issue #1822``, ``verl PR #6153``) and stays; a bare issue
number, a section sign after one, a numbered "family" or "seed", or a path outside the repository does not
(a decision worth keeping is a record under ``docs/decisions/``)."""

from __future__ import annotations

import importlib
import pathlib
import re
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

#: each pattern with what it catches; ``#1822``-style public references never match (a word before ``#``)
HISTORY = {
    "a bare issue number": re.compile(r"\b[Ii]ssues? \d"),
    "a numbered seed": re.compile(r"\b[Ss]eed \d{3}\b"),
    "a numbered bug family": re.compile(r"\b[Ff]amil(?:y|ies) \d"),
    "a bare section tag": re.compile("\\(\u00a7\\s?\\d"),
    "a file outside the repository": re.compile(r"\.\./shared|\bcases\.md\b|\bdesign\.md\b"),
    "a reading of the project's history": re.compile(r"maintainer'?s (?:first |second )?reading"),
}
TEXT_SUFFIXES = {".py", ".md", ".txt", ".sh", ".j2", ".toml", ".json", ".yml", ".yaml", ".cfg", ".html", ""}


def _tracked_files() -> list[pathlib.Path]:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, check=True,
                             text=True).stdout
        names = [n for n in out.split("\0") if n]
    except (OSError, subprocess.CalledProcessError):  # an unpacked source tree without git
        names = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file() and ".git" not in p.parts]
    return [ROOT / n for n in names]


def test_no_project_history_words_in_the_repository():
    this = pathlib.Path(__file__).resolve()
    hits = []
    for path in _tracked_files():
        if path.resolve() == this or path.suffix not in TEXT_SUFFIXES or not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for lineno, line in enumerate(text.splitlines(), 1):
            for what, pattern in HISTORY.items():
                if pattern.search(line):
                    hits.append(f"{path.relative_to(ROOT)}:{lineno}: {what}: {line.strip()[:120]}")
    assert len(_tracked_files()) > 100, "no files to read: the check would pass in silence"
    assert not hits, "\n".join(hits)


def test_the_history_patterns_catch_what_they_name():
    # planted texts assembled from parts, so this file holds none of them whole
    word, sign = "issue", "\u00a7"
    assert HISTORY["a bare issue number"].search(f"as {word} 23 {sign}2 says")
    assert not HISTORY["a bare issue number"].search(f"SkyRL {word} #1822")
    assert HISTORY["a numbered seed"].search("(" + "seed" + " 002)")
    assert HISTORY["a numbered bug family"].search("family" + " 9")
    assert HISTORY["a bare section tag"].search(f"the lock file ({sign}10)")
    assert HISTORY["a file outside the repository"].search("`../" + "shared/tools/x.sh`")


def _bug_kind_rows() -> list[tuple[str, list[tuple[str, str]], str]]:
    rows = []
    for line in (ROOT / "docs" / "bug-kinds.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 6 or not cells[5].startswith("`"):
            continue
        pairs = [tuple(p.split(".", 1)) for p in re.findall(r"`(\w+\.\w+)`", cells[4])]
        rows.append((cells[0], pairs, cells[5].strip("`")))
    return rows


def test_bug_kinds_table_rows_are_proven_by_their_mutants():
    rows = _bug_kind_rows()
    assert len(rows) >= 19, rows
    for kind, pairs, mutant in rows:
        mod = importlib.import_module(f"rlconform.harness.mutants.{mutant}")
        declared = set(getattr(mod, "EXPECTED", [])) | set(getattr(mod, "EXPECTED_CRASH", []))
        assert pairs, f"{kind}: no op.property named"
        for pair in pairs:
            assert pair in declared, f"{kind}: {mutant} does not declare {pair} (it declares {sorted(declared)})"


@pytest.mark.parametrize("path", ["README.md", "CONTRIBUTING.md"])
def test_relative_links_of_the_front_pages_resolve(path):
    text = (ROOT / path).read_text()
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [link for link in links if "://" not in link and not link.startswith("mailto:")]
    assert local, f"{path} links to nothing in the repository"
    missing = [link for link in local if not (ROOT / link).exists()]
    assert not missing, missing
