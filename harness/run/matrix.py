"""The version matrix: the main job on every release of an engine, one report per release.

``rlconform matrix --engine verl --versions 0.5.0,0.6.0,... [--profile ci] [--venvs DIR] [--op X ...]`` runs
``rlconform check`` once per release and writes ``reports/matrix/<engine>.md`` (:mod:`.matrix_md` renders
it) and ``<engine>.json`` next to it. Two sources of releases:

* **the package registry** (default): each release is installed into its own venv,
  ``<venvs>/<engine>-<version>`` (default ``~/.cache/rlconform/matrix``, outside the repository), made by
  hard-linking the running venv (``cp -al``: the local CPU torch and rlconform come along, and pip's
  uninstall in the copy unlinks, it never touches the original) and then
  ``pip install --no-deps -c install/constraints.txt <package>==<version>``: pip never resolves torch.
  An old release that needs older dependencies lists them, pinned, in ``install/matrix/<engine>-<version>.txt``
  (installed the same way, ``--no-deps``). The check runs with that venv's python.
* **a checkout's tags** (``--engine-path DIR``): each version is a git revision (a tag) of the engine's
  checkout, checked out into a git worktree (``<venvs>/worktrees/<name>-<rev>``) and checked with
  ``--engine-path`` by the running python; the worktrees are removed afterwards.

Each release's report goes to ``<venvs>/reports/<engine>-<version>/`` (``--keep-reports DIR`` elsewhere).
Exit codes: 0 the matrix was written, 2 bad input (an unknown engine, no versions, a failed install, a
check that wrote no report).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys

#: engine name -> its package on the registry
PACKAGES = {"verl": "verl", "skyrl": "skyrl", "megatron": "megatron-core"}
#: where the per-version venvs and reports go by default
DEFAULT_CACHE = os.path.join(os.path.expanduser("~"), ".cache", "rlconform", "matrix")
#: the repository's install/ folder (constraints.txt pins the local CPU torch)
INSTALL = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "install")


class MatrixError(Exception):
    """Bad input or a release that could not be installed / checked: one line, exit code 2."""


@dataclasses.dataclass
class Release:
    """One version of the matrix: its label, the python that checks it and the ``--engine-path`` (or None)."""

    version: str
    python: str
    engine_path: str | None = None
    worktree: str | None = None  # a git worktree to remove afterwards (``--engine-path`` mode)


def parse_versions(text: str) -> list[str]:
    """``"0.5.0,0.6.0"`` -> ``["0.5.0", "0.6.0"]``; raises :class:`MatrixError` for an empty list or a
    repeated version."""
    versions = [v.strip() for v in (text or "").split(",") if v.strip()]
    if not versions:
        raise MatrixError("--versions needs at least one version, e.g. --versions 0.5.0,0.6.0")
    dup = sorted({v for v in versions if versions.count(v) > 1})
    if dup:
        raise MatrixError(f"--versions repeats {', '.join(dup)}")
    return versions


def _run(argv: list[str], what: str, log: str) -> None:
    """Run ``argv`` with its output appended to ``log``; :class:`MatrixError` naming ``what`` when it fails."""
    with open(log, "a") as fh:
        fh.write(f"$ {' '.join(argv)}\n")
        fh.flush()
        proc = subprocess.run(argv, stdout=fh, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        with open(log) as fh:
            tail = fh.read().strip().splitlines()[-3:]
        raise MatrixError(f"{what} failed (exit {proc.returncode}; log {log}): {' / '.join(tail)}")


def registry_venv(engine: str, version: str, cache: str, *, base_venv: str | None = None,
                  install_dir: str = INSTALL) -> str:
    """The python of a venv holding ``engine``'s ``version`` from the registry, made once under ``cache``
    (see the module docstring); a venv whose stamp file names the version is reused. Raises
    :class:`MatrixError` when the engine has no package or pip fails."""
    if engine not in PACKAGES:
        raise MatrixError(f"matrix: engine {engine!r} has no registry package; choose from {', '.join(PACKAGES)} "
                          "or give --engine-path")
    base = os.path.abspath(base_venv or sys.prefix)
    venv = os.path.join(cache, f"{engine}-{version}")
    python = os.path.join(venv, "bin", "python")
    stamp = os.path.join(venv, ".rlconform-matrix")
    pin = f"{PACKAGES[engine]}=={version}"
    if os.path.exists(stamp) and open(stamp).read().strip() == pin:
        return python
    os.makedirs(cache, exist_ok=True)
    if not os.path.isdir(venv):
        if base == os.path.abspath(sys.base_prefix):
            raise MatrixError("matrix: run it from a venv (the per-version venvs are hard-linked copies of it)")
        _run(["cp", "-al", base, venv], f"copying the venv {base}", os.path.join(cache, f"{engine}-{version}.log"))
    log = os.path.join(venv, "rlconform-matrix-install.log")
    pip = [python, "-m", "pip", "--disable-pip-version-check", "install", "-q", "--no-deps",
           "-c", os.path.join(install_dir, "constraints.txt")]
    flags = ["--ignore-requires-python"] if engine in ("skyrl", "megatron") else []  # they declare >=3.12
    _run(pip + flags + [pin], f"pip install {pin}", log)
    extra = os.path.join(install_dir, "matrix", f"{engine}-{version}.txt")
    if os.path.exists(extra):
        _run(pip + ["-r", extra], f"pip install -r {extra}", log)
    with open(stamp, "w") as fh:
        fh.write(pin + "\n")
    return python


def tag_worktree(engine_path: str, rev: str, cache: str) -> str:
    """A git worktree of ``engine_path`` at ``rev`` under ``cache/worktrees`` (detached); raises
    :class:`MatrixError` for a path that is not a git checkout or an unknown revision."""
    from rlconform.harness.run.bisect import git

    repo = os.path.abspath(engine_path)
    top = git(repo, "rev-parse", "--show-toplevel", check=False)
    if top.returncode != 0:
        raise MatrixError(f"--engine-path {engine_path} is not a git checkout")
    if git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}", check=False).returncode != 0:
        raise MatrixError(f"--engine-path {engine_path} has no revision {rev!r}")
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", rev)
    path = os.path.join(cache, "worktrees", f"{os.path.basename(top.stdout.strip())}-{safe}")
    if os.path.exists(path):
        git(repo, "worktree", "remove", "--force", path, check=False)
        shutil.rmtree(path, ignore_errors=True)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    git(repo, "worktree", "add", "--detach", "--force", path, rev)
    return path


def check_argv(release: Release, engine: str, out: str, *, profile: str, ops: list[str], numprocesses: int,
               max_examples: int | None, max_shrinks: int | None, extra: list[str] = ()) -> list[str]:
    """The ``rlconform check`` command line of one release (its own python; no ledger: every defect fails)."""
    argv = [release.python, "-m", "rlconform.harness.cli", "check", "--engine", engine, "--out", out,
            "--profile", profile, "-q", "-n", str(numprocesses)]
    if release.engine_path:
        argv += ["--engine-path", release.engine_path]
    for op in ops:
        argv += ["--op", op]
    if max_examples is not None:
        argv += ["--max-examples", str(max_examples)]
    if max_shrinks is not None:
        argv += ["--max-shrinks", str(max_shrinks)]
    return argv + list(extra)


def run_release(release: Release, engine: str, out: str, log: str, *, reuse: bool = False, **options) -> dict:
    """Run the check of one release and return its ``report.json`` document; :class:`MatrixError` when the
    check wrote none (exit 0 and 1 both write one). With ``reuse``, a complete report that an earlier matrix
    wrote there with the same options and the same installed release is returned without a run."""
    report = os.path.join(out, "report.json")
    stamp = os.path.join(out, "matrix-options.json")
    key = json.dumps({"options": options, "engine": engine, "version": release.version}, sort_keys=True)
    if reuse and os.path.exists(report) and os.path.exists(stamp) and open(stamp).read() == key:
        with open(report) as fh:
            doc = json.load(fh)
        if (doc.get("run") or {}).get("complete"):
            return doc
    if os.path.exists(report):
        os.remove(report)
    argv = check_argv(release, engine, out, **options)
    env = dict(os.environ)
    env.pop("RLCONFORM_ENGINE", None)
    with open(log, "w") as fh:
        fh.write(f"$ {' '.join(argv)}\n")
        fh.flush()
        proc = subprocess.run(argv, stdout=fh, stderr=subprocess.STDOUT, env=env)
    if not os.path.exists(report):
        with open(log) as fh:
            tail = fh.read().strip().splitlines()[-2:]
        raise MatrixError(f"the check of {engine} {release.version} wrote no report (exit {proc.returncode}; "
                          f"log {log}): {' / '.join(tail)}")
    with open(stamp, "w") as fh:
        fh.write(key)
    with open(report) as fh:
        return json.load(fh)


def run_matrix(engine: str, versions: list[str], *, cache: str = DEFAULT_CACHE, engine_path: str | None = None,
               reports_dir: str | None = None, reuse: bool = False, progress=print,
               **options) -> dict[str, dict]:
    """Check every version and return ``{version: report.json document}`` in the order given. Registry
    releases are installed by :func:`registry_venv`; with ``engine_path`` each version is a git revision
    checked out by :func:`tag_worktree` (removed afterwards)."""
    reports_dir = reports_dir or os.path.join(cache, "reports")
    docs: dict[str, dict] = {}
    for version in versions:
        if engine_path is not None:
            wt = tag_worktree(engine_path, version, cache)
            release = Release(version, sys.executable, engine_path=wt, worktree=wt)
        else:
            progress(f"[matrix] {engine} {version}: venv")
            release = Release(version, registry_venv(engine, version, cache))
        name = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{os.path.basename(engine)}-{version}")
        out = os.path.join(reports_dir, name)
        os.makedirs(out, exist_ok=True)
        progress(f"[matrix] {engine} {version}: check -> {out}")
        try:
            docs[version] = run_release(release, engine, out, os.path.join(out, "check.log"), reuse=reuse,
                                        **options)
            progress(f"[matrix] {engine} {version}: done ({len(docs[version].get('findings') or [])} findings)")
        finally:
            if release.worktree:
                from rlconform.harness.run.bisect import git

                git(os.path.abspath(engine_path), "worktree", "remove", "--force", release.worktree, check=False)
    return docs


def add_parser(sub) -> None:
    """Add the ``matrix`` subcommand to the CLI's subparsers."""
    m = sub.add_parser("matrix", help="run the check on every release of an engine and write the version matrix "
                                      "(reports/matrix/<engine>.md)")
    m.add_argument("--engine", required=True, help="verl, skyrl or megatron (registry), or any engine spec with "
                                                   "--engine-path")
    m.add_argument("--versions", required=True, help="comma-separated releases (registry versions, or with "
                                                     "--engine-path the checkout's tags / revisions), oldest first")
    m.add_argument("--engine-path", default=None, help="the engine's git checkout: each version is a revision of it")
    m.add_argument("--venvs", default=DEFAULT_CACHE, help="where the per-version venvs, worktrees and reports go "
                                                          "(default: %(default)s)")
    m.add_argument("--out", default=os.path.join("reports", "matrix"),
                   help="folder of the matrix files <engine>.md / .json (default: %(default)s)")
    m.add_argument("--profile", default="ci", choices=["dev", "ci", "nightly"], help="hypothesis profile (default: ci)")
    m.add_argument("--op", action="append", default=[], help="only this op (repeatable; the matrix says so)")
    m.add_argument("--max-examples", type=int, default=None, help="examples per finding (overrides the profile)")
    m.add_argument("--max-shrinks", type=int, default=0,
                   help="shrinking steps per failing finding (default 0: the matrix needs the verdicts, not the "
                        "smallest reproducer)")
    m.add_argument("-n", "--numprocesses", type=int, default=1, help="worker processes per check (default 1)")
    m.add_argument("--reuse", action="store_true",
                   help="keep a release's complete report from an earlier matrix run with the same options")


def cmd_matrix(args) -> int:
    from rlconform.harness.report.matrix_md import matrix_doc, matrix_markdown

    try:
        versions = parse_versions(args.versions)
        if args.engine_path is None and args.engine not in PACKAGES:
            raise MatrixError(f"matrix: engine {args.engine!r} has no registry package; choose from "
                              f"{', '.join(PACKAGES)} or give --engine-path")
        if args.engine_path is not None and not os.path.isdir(args.engine_path):
            raise MatrixError(f"--engine-path {args.engine_path} does not exist or is not a directory")
        options = dict(profile=args.profile, ops=args.op, numprocesses=args.numprocesses,
                       max_examples=args.max_examples, max_shrinks=args.max_shrinks)
        docs = run_matrix(args.engine, versions, cache=os.path.abspath(args.venvs),
                          engine_path=args.engine_path, reuse=args.reuse, **options)
    except MatrixError as exc:
        print(f"rlconform matrix: error: {exc}", file=sys.stderr)
        return 2
    source = f"git revisions of {args.engine_path}" if args.engine_path else "the package registry (PyPI)"
    doc = matrix_doc(os.path.basename(args.engine), docs, source=source, options=options)
    os.makedirs(args.out, exist_ok=True)
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", os.path.basename(args.engine).removesuffix(".py"))
    with open(os.path.join(args.out, f"{name}.json"), "w") as fh:
        json.dump(doc, fh, indent=1, sort_keys=True, allow_nan=False, default=str)
        fh.write("\n")
    with open(os.path.join(args.out, f"{name}.md"), "w") as fh:
        fh.write(matrix_markdown(doc))
    print(f"[matrix] wrote {os.path.join(args.out, name + '.md')} ({len(doc['defects'])} defect(s) over "
          f"{len(versions)} version(s))")
    return 0
