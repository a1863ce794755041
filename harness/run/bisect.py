"""``rlconform bisect``: the first commit of an engine checkout at which a saved case fails.

    rlconform bisect --engine-path CHECKOUT --good REV --bad REV CASE_FILE [--engine SPEC] [--timeout S]

Runs ``git bisect`` in the git repository holding CHECKOUT. At each commit it replays CASE_FILE in a
fresh subprocess, ``rlconform replay CASE_FILE --engine SPEC --engine-path CHECKOUT``, so that each
commit's code is imported anew, and turns replay's exit code into git bisect's verdict (the mapping of
``git bisect run``):

    replay 0 (the case passes)                               -> good
    replay 1 (a discrepancy, or the engine crashed on it)    -> bad
    replay 2 (the engine does not import: a binding error),
    or the replay ran past ``--timeout``                     -> skip (``git bisect run``'s exit code 125)
    anything else (interrupted, killed)                      -> stop, exit 130 or 2

SPEC is ``--engine``, else ``$RLCONFORM_ENGINE``, else ``reference``: a case file never chooses code to run, so a case recorded with another engine is refused (exit 2) unless ``--engine`` names it. Replay is given ``--engine`` only if
``rlconform replay --help`` lists it (checked at run time); otherwise the engine and path are written
into a temporary copy of the case file, which older replays read. The case file is read once, before
anything is checked out (it may live inside the checkout).

Before bisecting, the case is replayed at BAD (it must fail) and at GOOD (it must pass); GOOD must be an
ancestor of BAD. Replays run with ``PYTHONDONTWRITEBYTECODE=1`` so that no ``__pycache__`` appears in the
checkout. The checkout is left on the branch (or detached HEAD) it was found on, with nothing changed
(``git bisect reset``, then a check); a checkout with uncommitted changes to tracked files, or one where
a bisect is already in progress, is refused.

Exit codes: 0 the first bad commit is printed (``first bad commit: <hash> <subject>``); 1 skipped
commits leave it ambiguous (the candidates are printed); 2 usage error, dirty checkout, or the case does
not fail at BAD / pass at GOOD; 130 interrupted.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile

EXIT_FOUND, EXIT_AMBIGUOUS, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130

#: replay exit code -> git bisect verdict (None: stop bisecting)
VERDICTS = {0: "good", 1: "bad", 2: "skip"}

#: how a replay of this package is started (the same interpreter, hence the same rlconform)
REPLAY = (sys.executable, "-m", "rlconform.harness.cli", "replay")


class BisectError(Exception):
    """The bisection cannot start or go on (a usage error: exit code 2). The message says why."""


class Interrupted(Exception):
    """A replay was interrupted (Ctrl-C, SIGTERM): the bisection stops, exit code 130."""


@dataclasses.dataclass
class Step:
    """One replay: ``commit`` (40-hex hash), ``subject``, ``code`` (replay's exit code, None on a timeout),
    ``verdict`` (good / bad / skip), ``output`` (replay's stdout and stderr)."""

    commit: str
    subject: str
    code: int | None
    verdict: str
    output: str


@dataclasses.dataclass
class Result:
    """``first_bad`` (hash, or None when skipped commits leave it ambiguous), ``candidates`` (the hashes
    it could be then), ``steps`` (every replay, in order)."""

    first_bad: str | None
    candidates: list[str]
    steps: list[Step]


def git(repo: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """``git -C repo args`` with the checkout's programs switched off (:mod:`rlconform.harness.core.safe_git`),
    text output; raises BisectError with git's message when ``check`` and it fails."""
    from rlconform.harness.core.safe_git import git as safe_git

    proc = safe_git(repo, *args)
    if check and proc.returncode != 0:
        raise BisectError(f"git {' '.join(args)} failed in {repo}: {(proc.stderr or proc.stdout).strip()}")
    return proc


def subject(repo: str, commit: str) -> str:
    return git(repo, "show", "-s", "--format=%s", commit).stdout.strip()


def replay_flags(replay: tuple[str, ...] = REPLAY) -> set[str]:
    """The options ``rlconform replay --help`` lists among ``--engine`` and ``--engine-path``."""
    proc = subprocess.run([*replay, "--help"], capture_output=True, text=True)
    return {flag for flag in ("--engine", "--engine-path") if re.search(re.escape(flag) + r"(?![\w-])", proc.stdout)}


def replay_argv(case_doc: dict, engine: str | None, engine_path: str, flags: set[str], tmp: str,
                replay: tuple[str, ...] = REPLAY) -> list[str]:
    """The replay command line for a case (given as its JSON document ``case_doc``).

    ``engine`` and ``engine_path`` go on the command line when replay lists the option (``flags``), and
    into the copy of the case file written under ``tmp`` otherwise. Raises BisectError when no engine is
    known and replay needs one on its command line.
    """
    doc = dict(case_doc)
    argv = list(replay)
    recorded = dict(doc.get("engine") or {})
    if "--engine" in flags:
        if engine is None:
            raise BisectError("no engine: give --engine SPEC (the case file records none)")
        argv_engine = ["--engine", engine]
    else:
        argv_engine = []
        if engine is not None:
            recorded["spec"] = engine
    if "--engine-path" in flags:
        argv_path = ["--engine-path", engine_path]
    else:
        argv_path = []
        recorded["path"] = engine_path
    doc["engine"] = recorded
    case_file = os.path.join(tmp, "case.json")
    with open(case_file, "w") as fh:
        json.dump(doc, fh)
    return argv + [case_file] + argv_engine + argv_path


class Bisector:
    """Bisects ``repo`` (a git work tree holding ``engine_path``) between ``good`` and ``bad`` (hashes)."""

    def __init__(self, repo: str, argv: list[str], *, timeout: float | None = None, log=print):
        self.repo, self.argv, self.timeout, self.log = repo, argv, timeout, log
        self.steps: list[Step] = []
        self.env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONSAFEPATH": "1"}
        self.env.pop("RLCONFORM_ENGINE", None)  # the engine is the one bisect was given, nothing else

    def replay_here(self) -> Step:
        """Replay the case at the checked-out commit."""
        commit = git(self.repo, "rev-parse", "HEAD").stdout.strip()
        try:
            proc = subprocess.run(self.argv, capture_output=True, text=True, timeout=self.timeout, env=self.env)
            code, output = proc.returncode, proc.stdout + proc.stderr
        except subprocess.TimeoutExpired as exc:
            code, output = None, f"replay ran past --timeout {self.timeout:g} s\n{_text(exc.stdout)}{_text(exc.stderr)}"
        except KeyboardInterrupt:
            raise Interrupted from None
        if code is None:
            verdict = "skip"
        elif code in VERDICTS:
            verdict = VERDICTS[code]
        elif code in (130, -2, -15):
            raise Interrupted
        else:
            raise BisectError(f"replay at {commit[:12]} exited {code}, which is neither 0 (good), 1 (bad) nor "
                              f"2 (skip):\n{output.strip()}")
        step = Step(commit, subject(self.repo, commit), code, verdict, output)
        self.steps.append(step)
        why = "timeout" if code is None else f"replay exit {code}"
        self.log(f"  {commit[:12]} {verdict:4s} ({why})  {step.subject}")
        return step

    def run(self, good: str, bad: str, fixed: bool = False) -> Result:
        """Bisect; the caller restores the checkout (:func:`restore`) whatever happens. ``fixed``: ``bad`` is
        the older commit and ``good`` the newer, and the commit sought is the first at which the case passes
        (git bisect's terms ``broken`` / ``fixed``); ``Result.first_bad`` is then that first fixed commit."""
        if fixed:
            term, start, sought = {"good": "fixed", "bad": "broken", "skip": "skip"}, ["--term-new=fixed",
                                                                                      "--term-old=broken"], "fixed"
            ends = ((good, "good"), (bad, "bad"))
        else:
            term, start, sought = {"good": "good", "bad": "bad", "skip": "skip"}, [], "bad"
            ends = ((bad, "bad"), (good, "good"))
        git(self.repo, "bisect", "start", *start)
        for rev, want in ends:
            git(self.repo, "checkout", "-q", "--detach", rev)
            step = self.replay_here()
            if step.verdict != want:
                what = {"good": "passes", "bad": "fails", "skip": "cannot be replayed (the engine does not import)"}
                raise BisectError(f"the case {what[step.verdict]} at {'--' + want} {rev[:12]} ({step.subject}); "
                                  f"it must {'fail' if want == 'bad' else 'pass'} there. Replay said:\n"
                                  f"{step.output.strip()}")
        git(self.repo, "bisect", term[ends[0][1]], ends[0][0])
        out = git(self.repo, "bisect", term[ends[1][1]], ends[1][0], check=False)
        while True:
            text = out.stdout + out.stderr
            found = re.search(rf"^([0-9a-f]{{40}}) is the first {sought} commit", text, re.M)
            if found:
                return Result(found.group(1), [found.group(1)], self.steps)
            if "only 'skip'ped commits left" in text:
                tail = text.split("could be any of:", 1)[-1]
                return Result(None, re.findall(r"^([0-9a-f]{40})\s*$", tail, re.M), self.steps)
            if out.returncode != 0:
                raise BisectError(f"git bisect failed: {text.strip()}")
            step = self.replay_here()
            out = git(self.repo, "bisect", term[step.verdict], check=False)


@dataclasses.dataclass
class Place:
    """Where a checkout stands: ``branch`` (full ref name, or None when HEAD is detached) and ``head``."""

    branch: str | None
    head: str


def where(repo: str) -> Place:
    branch = git(repo, "symbolic-ref", "-q", "HEAD", check=False).stdout.strip() or None
    return Place(branch, git(repo, "rev-parse", "--verify", "HEAD").stdout.strip())


def restore(repo: str, place: Place) -> None:
    """End any bisect and put the checkout back on ``place``; raises BisectError if that fails."""
    if git(repo, "bisect", "log", check=False).returncode == 0:
        git(repo, "bisect", "reset", check=False)
    if where(repo) != place:
        if place.branch:
            git(repo, "checkout", "-q", place.branch.removeprefix("refs/heads/"))
        else:
            git(repo, "checkout", "-q", "--detach", place.head)
    if where(repo) != place:
        raise BisectError(f"could not put {repo} back on {place.branch or place.head}; it is on "
                          f"{where(repo).branch or where(repo).head}")


def check_clean(repo: str) -> None:
    """Raise BisectError when ``repo`` has uncommitted changes to tracked files or is already bisecting."""
    dirty = git(repo, "status", "--porcelain", "--untracked-files=no").stdout.splitlines()
    if dirty:
        shown = "\n  ".join(dirty[:8]) + ("\n  …" if len(dirty) > 8 else "")
        raise BisectError(f"the checkout {repo} has uncommitted changes; commit or stash them first "
                          f"(bisect checks out other commits):\n  {shown}")
    if git(repo, "bisect", "log", check=False).returncode == 0:
        raise BisectError(f"a git bisect is already in progress in {repo}; finish it or run `git bisect reset`")


def resolve(repo: str, rev: str, flag: str) -> str:
    proc = git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}", check=False)
    if proc.returncode != 0:
        raise BisectError(f"{flag} {rev}: no such commit in {repo}")
    return proc.stdout.strip()


def bisect(engine_path: str, good: str, bad: str, case_file: str, engine: str | None = None, *,
           timeout: float | None = None, replay: tuple[str, ...] = REPLAY, log=print, fixed: bool = False) -> Result:
    """Find the first commit between ``good`` (passes) and ``bad`` (fails) at which ``case_file`` fails; with
    ``fixed``, ``bad`` is the older commit and the first commit at which the case passes is found (the
    commit that fixed it: what an ``xpass`` ledger line asks).

    Raises BisectError (usage, dirty checkout, endpoints that do not behave, git failures) and
    Interrupted. The checkout is restored in every case.
    """
    engine_path = os.path.abspath(engine_path)
    if not os.path.isdir(engine_path):
        raise BisectError(f"--engine-path {engine_path} does not exist or is not a directory")
    top = git(engine_path, "rev-parse", "--show-toplevel", check=False)
    if top.returncode != 0:
        raise BisectError(f"--engine-path {engine_path} is not inside a git work tree")
    repo = top.stdout.strip()
    from rlconform.harness.core.safe_json import JsonFileError, load_object
    from rlconform.properties.case import Case

    try:
        doc = load_object(case_file, "case file")
        Case.from_json(doc)
    except JsonFileError as exc:
        raise BisectError(f"cannot read {case_file}: {str(exc).removeprefix('case file: ')}") from None
    except (ValueError, KeyError) as exc:
        raise BisectError(f"bad case file {case_file}: {exc}") from None
    engine = engine or os.environ.get("RLCONFORM_ENGINE")
    if engine is None:  # a case file never chooses code to run: the same rule as replay's
        recorded = doc.get("engine") if isinstance(doc.get("engine"), dict) else {}
        named = recorded.get("spec")
        if named not in (None, "reference"):
            raise BisectError(f"case file {case_file} was recorded with engine {named!r}; bisect never runs an "
                              f"engine named by a case file. To bisect on that engine, say so: --engine {named}")
        engine = "reference"
    good_c, bad_c = resolve(repo, good, "--good"), resolve(repo, bad, "--bad")
    if good_c == bad_c:
        raise BisectError(f"--good {good} and --bad {bad} are the same commit")
    older, newer = (bad_c, good_c) if fixed else (good_c, bad_c)
    if git(repo, "merge-base", "--is-ancestor", older, newer, check=False).returncode != 0:
        raise BisectError(f"--good {good} is not an ancestor of --bad {bad}" if not fixed else
                          f"--bad {bad} is not an ancestor of --good {good} (with --fixed the case fails at the "
                          f"older commit)")
    check_clean(repo)
    place = where(repo)
    with tempfile.TemporaryDirectory(prefix="rlconform-bisect-") as tmp:
        argv = replay_argv(doc, engine, engine_path, replay_flags(replay), tmp, replay)
        log(f"bisecting {repo} from good {good_c[:12]} to bad {bad_c[:12]}: replay {doc.get('op')}."
            f"{doc.get('property')}.{doc.get('dtype')}.{doc.get('regime')} on engine {engine}")
        try:
            return Bisector(repo, argv, timeout=timeout, log=log).run(good_c, bad_c, fixed=fixed)
        finally:
            restore(repo, place)


def add_parser(sub) -> None:
    """Add the ``bisect`` subcommand to the CLI's subparsers."""
    b = sub.add_parser("bisect", help="find the first commit of an engine checkout at which a saved case fails")
    b.add_argument("case_file", help="a saved case (a report's cases/<finding id>.json)")
    b.add_argument("--engine-path", required=True, help="the engine's git checkout")
    b.add_argument("--good", required=True, help="a revision at which the case passes")
    b.add_argument("--bad", required=True, help="a revision at which the case fails")
    b.add_argument("--engine", default=None, help="engine spec (default: $RLCONFORM_ENGINE, else reference; never the one a case file names)")
    b.add_argument("--fixed", action="store_true",
                   help="find the commit that fixed the case: it fails at --bad (older) and passes at --good (newer)")
    b.add_argument("--timeout", type=float, default=None,
                   help="seconds one replay may take; a replay past it counts as skip (default: no limit)")


def cmd_bisect(args) -> int:
    try:
        result = bisect(args.engine_path, args.good, args.bad, args.case_file, args.engine, timeout=args.timeout,
                        fixed=getattr(args, "fixed", False))
    except BisectError as exc:
        print(f"rlconform bisect: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (Interrupted, KeyboardInterrupt):
        print("rlconform bisect: interrupted; the checkout is back where it was", file=sys.stderr)
        return EXIT_INTERRUPTED
    repo = git(os.path.abspath(args.engine_path), "rev-parse", "--show-toplevel").stdout.strip()
    if result.first_bad is None:
        print("skipped commits (the engine did not import) leave the first bad commit ambiguous; it is one of:")
        for c in result.candidates:
            print(f"  {c} {subject(repo, c)}")
        return EXIT_AMBIGUOUS
    print(f"first {'fixed' if getattr(args, 'fixed', False) else 'bad'} commit: {result.first_bad} "
          f"{subject(repo, result.first_bad)}")
    last = next((s for s in result.steps if s.commit == result.first_bad), None)
    if last is not None:
        print("  replay there:\n    " + last.output.strip().replace("\n", "\n    "))
    return EXIT_FOUND


def _text(data) -> str:
    if data is None:
        return ""
    return data.decode(errors="replace") if isinstance(data, bytes) else data
