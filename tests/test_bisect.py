"""``rlconform bisect`` on a small git repository built here: a binding whose ``masked_mean``
goes wrong (divides by the wrong count) at commit k, with a commit before it where the module does not
import (skip). The checkout must be left on its branch (or detached HEAD) with nothing changed.

The end-to-end test runs the real ``rlconform bisect`` (each replay a subprocess, ~5 s); the others
drive the same git logic with a stand-in replay that reads the checked-out ``toypkg/ops.py``.
"""

from __future__ import annotations

import importlib.util
import pathlib
import subprocess
import sys

import forked_cli
import numpy as np
import pytest

from rlconform.harness.run import bisect as B
from rlconform.properties.case import Case, save_case

_spec = importlib.util.spec_from_file_location("toyfork", pathlib.Path(__file__).with_name("toyfork.py"))
T = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(T)

#: k = 6 (index 5): right, then a commit that does not import, fixed, then the wrong count from k on
HISTORY = [("add masked_mean", T.RIGHT), ("docs", T.RIGHT), ("tests", T.RIGHT),
           ("refactor: move helpers (WIP)", T.BROKEN_IMPORT), ("refactor: finish", T.RIGHT),
           ("speed up masked_mean", T.WRONG_COUNT), ("tidy", T.WRONG_COUNT), ("more tidy", T.WRONG_COUNT)]
K = 5

#: a stand-in for `rlconform replay CASE --engine SPEC --engine-path DIR`: 2 if the checked-out ops do not
#: import, 1 if they count the masked tokens, 0 otherwise. WITH_ENGINE=False: an older replay without --engine.
FAKE_REPLAY = '''
import pathlib, sys
if "--help" in sys.argv:
    print("usage: replay case_file {flags}")
    sys.exit(0)
ops = (pathlib.Path(sys.argv[sys.argv.index("--engine-path") + 1]) / "toypkg" / "ops.py").read_text()
sys.exit(2 if "_not_yet_written" in ops else 1 if "numel" in ops else 0)
'''


def fake_replay(tmp_path, flags="[--engine ENGINE] [--engine-path ENGINE_PATH]") -> tuple[str, ...]:
    path = tmp_path / "fake_replay.py"
    path.write_text(FAKE_REPLAY.replace("{flags}", flags))
    return (sys.executable, str(path))


def failing_case(path) -> pathlib.Path:
    """masked_mean of [1, 2, 3, 4] with the last two tokens padded: 1.5, and 0.75 with the wrong count."""
    case = Case("masked_mean", "matches_reference", "float32", "padded",
                {"values": np.array([[1.0, 2.0, 3.0, 4.0]]), "mask": np.array([[True, True, False, False]]),
                 "unbiased": True, "garbage": float("nan")})
    save_case(case, path)
    return pathlib.Path(path)


@pytest.fixture
def fork(tmp_path):
    repo = tmp_path / "fork"
    return repo, T.make_fork(repo, HISTORY)


@pytest.mark.cli
@pytest.mark.slow
def test_bisect_names_commit_k_and_leaves_the_checkout_as_found(tmp_path, fork):
    repo, hashes = fork
    case = failing_case(tmp_path / "case.json")
    T.git(repo, "checkout", "-q", "-b", "feature")  # a branch other than the one bisected
    before = T.state(repo)
    proc = forked_cli.run(["bisect", "--engine-path", str(repo),
                           "--good", hashes[0], "--bad", "main", "--engine", T.SPEC, str(case)],
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"first bad commit: {hashes[K]} speed up masked_mean" in proc.stdout
    assert " skip " in proc.stdout, "the commit that does not import was visited and skipped:\n" + proc.stdout
    assert "engine 0.75 vs reference 1.5" in proc.stdout  # the replay at the first bad commit
    assert T.state(repo) == before


def test_bisect_skips_unimportable_commits_and_restores_detached_head(tmp_path, fork):
    repo, hashes = fork
    T.git(repo, "checkout", "-q", "--detach", hashes[2])
    before = T.state(repo)
    log = []
    result = B.bisect(str(repo), hashes[0], hashes[-1], str(failing_case(tmp_path / "c.json")), T.SPEC,
                      replay=fake_replay(tmp_path), log=log.append)
    assert result.first_bad == hashes[K]
    assert [s.verdict for s in result.steps][:2] == ["bad", "good"]  # the endpoints are checked first
    assert hashes[3] in [s.commit for s in result.steps if s.verdict == "skip"]
    assert T.state(repo) == before and before[0] == "DETACHED"


def test_only_skipped_commits_left_is_ambiguous(tmp_path):
    """Not importable right up to the commit that introduces the bug: it could be any of them."""
    repo = tmp_path / "fork"
    hashes = T.make_fork(repo, [("a", T.RIGHT), ("wip", T.BROKEN_IMPORT), ("wip 2", T.BROKEN_IMPORT),
                                ("finish, faster", T.WRONG_COUNT)])
    before = T.state(repo)
    result = B.bisect(str(repo), hashes[0], hashes[-1], str(failing_case(tmp_path / "c.json")), T.SPEC,
                      replay=fake_replay(tmp_path), log=lambda s: None)
    assert result.first_bad is None and set(result.candidates) == set(hashes[1:])
    assert T.state(repo) == before


def test_older_replay_reads_engine_from_a_copy_of_the_case(tmp_path, fork):
    """Without --engine in `replay --help`, the engine and path go into a temporary copy of the case file."""
    repo, hashes = fork
    doc = Case("masked_mean", "matches_reference", "float32", "padded", {}).to_json()
    argv = B.replay_argv(doc, T.SPEC, str(repo), set(), str(tmp_path), replay=("replay",))
    copy = __import__("json").loads(pathlib.Path(argv[1]).read_text())
    assert argv == ["replay", str(tmp_path / "case.json")]
    assert copy["engine"] == {"spec": T.SPEC, "path": str(repo)} and copy["op"] == "masked_mean"
    argv = B.replay_argv(doc, T.SPEC, str(repo), {"--engine", "--engine-path"}, str(tmp_path), replay=("replay",))
    assert argv[2:] == ["--engine", T.SPEC, "--engine-path", str(repo)]
    assert B.replay_flags(fake_replay(tmp_path, flags="[--engine-path ENGINE_PATH]")) == {"--engine-path"}
    assert B.replay_flags(fake_replay(tmp_path)) == {"--engine", "--engine-path"}
    assert B.replay_flags() >= {"--engine-path"}  # the real one


@pytest.mark.cli
def test_dirty_checkout_is_refused_and_left_alone(tmp_path, fork):
    repo, hashes = fork
    (repo / "toypkg" / "ops.py").write_text("# local edit\n")
    before = T.state(repo)
    with pytest.raises(B.BisectError, match="uncommitted changes"):
        B.bisect(str(repo), hashes[0], hashes[-1], str(failing_case(tmp_path / "c.json")), T.SPEC,
                 replay=fake_replay(tmp_path), log=lambda s: None)
    assert T.state(repo) == before
    code = __import__("rlconform.harness.cli", fromlist=["main"]).main(
        ["bisect", "--engine-path", str(repo), "--good", hashes[0], "--bad", hashes[-1], "--engine", T.SPEC,
         str(tmp_path / "c.json")])
    assert code == 2 and T.state(repo) == before


@pytest.mark.parametrize("good, bad, message", [(0, 0, "same commit"), (-1, 0, "not an ancestor"),
                                                (0, None, "no such commit")])
def test_bad_revisions_are_usage_errors(tmp_path, fork, good, bad, message):
    repo, hashes = fork
    with pytest.raises(B.BisectError, match=message):
        B.bisect(str(repo), hashes[good], "nope" if bad is None else hashes[bad],
                 str(failing_case(tmp_path / "c.json")), T.SPEC, replay=fake_replay(tmp_path), log=lambda s: None)


def test_endpoints_must_behave(tmp_path, fork):
    """The case must fail at --bad and pass at --good; otherwise nothing is bisected and HEAD is restored."""
    repo, hashes = fork
    before = T.state(repo)
    with pytest.raises(B.BisectError, match="passes at --bad"):
        B.bisect(str(repo), hashes[0], hashes[2], str(failing_case(tmp_path / "c.json")), T.SPEC,
                 replay=fake_replay(tmp_path), log=lambda s: None)
    with pytest.raises(B.BisectError, match="fails at --good"):
        B.bisect(str(repo), hashes[5], hashes[7], str(failing_case(tmp_path / "c.json")), T.SPEC,
                 replay=fake_replay(tmp_path), log=lambda s: None)
    assert T.state(repo) == before
    assert subprocess.run(["git", "-C", str(repo), "bisect", "log"], capture_output=True).returncode != 0


#: wrong from the start, fixed at index FIXED, right from there on
FIX_HISTORY = [("add masked_mean, fast", T.WRONG_COUNT), ("docs", T.WRONG_COUNT), ("tests", T.WRONG_COUNT),
               ("fix the count", T.RIGHT), ("tidy", T.RIGHT), ("more tidy", T.RIGHT)]
FIXED = 3


def test_bisect_fixed_names_the_commit_that_fixed_the_case(tmp_path):
    """What an ``xpass`` ledger line asks: the case fails at the older commit and passes at the newer one."""
    from rlconform.harness.run.bisect import bisect

    repo = tmp_path / "fork"
    hashes = T.make_fork(repo, FIX_HISTORY)
    case = failing_case(tmp_path / "case.json")
    before = T.state(repo)
    result = bisect(str(repo), hashes[-1], hashes[0], str(case), T.SPEC, replay=fake_replay(tmp_path),
                    log=lambda *_: None, fixed=True)
    assert result.first_bad == hashes[FIXED]
    assert T.state(repo) == before
    with pytest.raises(B.BisectError, match="with --fixed the case fails at the older commit"):
        bisect(str(repo), hashes[0], hashes[-1], str(case), T.SPEC, replay=fake_replay(tmp_path),
               log=lambda *_: None, fixed=True)
