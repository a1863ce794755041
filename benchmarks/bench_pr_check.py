"""The pull-request check's cost: CPU seconds (user + sys of the whole process tree, head and base together)
and wall time of ``ci/rlconform-pr.sh`` on one-function pull requests of a git fork of the installed verl.

For each pull request (``--pr``): a fork is built from the installed verl (its package folder, one commit),
the pull request is one more commit; then

* ``miss``: the PR script checks the head (``--changed-since`` the base) and the base (``--findings``);
* ``hit``: the same, with ``--base-report`` the base report the miss run wrote (as the fork's main workflow
  would have it for that commit): the base is read, not checked;

each without a ledger and, with ``--ledger``, with the stock ledger copied into the fork (whose selection
must be the same). CPU seconds do not move with the machine's load; wall time does (the load average is
recorded beside it).

    python benchmarks/bench_pr_check.py [--pr kl_penalty_forward] [--pr agg_loss] [--ledger]
        [--out benchmarks/results/pr_check.json]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import resource
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
STOCK_LEDGER = ROOT / "reports" / "verl-0.9.1" / "xfails.txt"
CORE_ALGOS = "verl/trainer/ppo/core_algos.py"
#: pull request name -> (file, old text, new text): one line of one function
PRS = {
    # a documentation line of kl_penalty_forward (few callers: kl_estimator's findings)
    "kl_penalty_forward": (CORE_ALGOS, '"""Compute KL divergence given logprob and ref_logprob.\n',
                           '"""Compute KL divergence given logprob and ref_logprob (a fork edits this function).\n'),
    # agg_loss's token-mean drops the loss mask (many callers: every policy and value loss)
    "agg_loss": (CORE_ALGOS, "loss = verl_F.masked_sum(loss_mat, loss_mask) / batch_num_tokens * dp_size",
                 "loss = loss_mat.sum() / batch_num_tokens * dp_size"),
}
_GIT_ENV = {"GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@example.org", "GIT_COMMITTER_NAME": "b",
            "GIT_COMMITTER_EMAIL": "b@example.org", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}


def git(repo, *args) -> str:
    out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True,
                         env={**os.environ, **_GIT_ENV})
    return out.stdout.strip()


def make_fork(where: pathlib.Path, pr: str, ledger: bool) -> pathlib.Path:
    import verl

    fork = where / "fork"
    shutil.copytree(os.path.dirname(verl.__file__), fork / "verl", ignore=shutil.ignore_patterns("__pycache__"))
    if ledger:
        shutil.copyfile(STOCK_LEDGER, fork / "rlconform-xfails.txt")
    git(fork, "init", "-q", "-b", "main")
    git(fork, "add", "-A")
    git(fork, "commit", "-qm", "verl as installed")
    file, old, new = PRS[pr]
    path = fork / file
    text = path.read_text()
    assert text.count(old) == 1, f"{pr}: the line to change is not in the installed verl"
    path.write_text(text.replace(old, new))
    git(fork, "commit", "-qam", f"the {pr} pull request")
    return fork


def run_pr(fork: pathlib.Path, out: pathlib.Path, ledger: bool, base_report: pathlib.Path | None) -> dict:
    cmd = ["bash", str(ROOT / "ci" / "rlconform-pr.sh"), "--engine", "verl", "--head", str(fork),
           "--base-ref", "HEAD~1", "--out", str(out)]
    if ledger:
        cmd += ["--xfails", "rlconform-xfails.txt"]  # a path inside the head, as the recipe says
    if base_report is not None:
        cmd += ["--base-report", str(base_report)]
    env = {**os.environ, "RLCONFORM_SKIP_INSTALL": "1",
           "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=fork)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    sel = json.loads((out / "head" / "selection.json").read_text()) if (out / "head" / "selection.json").exists() else {}
    comment = (out / "comment.md").read_text() if (out / "comment.md").exists() else ""
    return {"exit": proc.returncode, "cpu_s": round(cpu, 1), "wall_s": round(wall, 1), "load_1min_at_start": load,
            "selected": len(sel.get("ids") or []), "selection": sel.get("ids") or [],
            "base_from_cache": "read from" in proc.stdout, "comment_head": comment.splitlines()[:12],
            "log_tail": (proc.stdout + proc.stderr)[-1500:]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pr", action="append", choices=sorted(PRS), default=[])
    ap.add_argument("--ledger", action="store_true", help="also run each pull request with the stock ledger")
    ap.add_argument("--no-hit", action="store_true", help="skip the cache-hit runs")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "pr_check.json"))
    args = ap.parse_args()
    results = {"machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]}, "runs": {}}
    for pr in args.pr or ["kl_penalty_forward"]:
        for ledger in ([False, True] if args.ledger else [False]):
            key = f"{pr}{' +stock ledger' if ledger else ''}"
            with tempfile.TemporaryDirectory(prefix="rlconform-bench-pr-") as tmp:
                tmp = pathlib.Path(tmp)
                fork = make_fork(tmp, pr, ledger)
                miss = run_pr(fork, tmp / "ci-miss", ledger, None)
                results["runs"][f"{key} · cache miss"] = miss
                print(f"{key} · cache miss: exit {miss['exit']}, {miss['selected']} findings, {miss['cpu_s']} CPU-s, "
                      f"{miss['wall_s']} s wall", flush=True)
                if not args.no_hit and (tmp / "ci-miss" / "base" / "report.json").exists():
                    hit = run_pr(fork, tmp / "ci-hit", ledger, tmp / "ci-miss" / "base")
                    results["runs"][f"{key} · cache hit"] = hit
                    print(f"{key} · cache hit: exit {hit['exit']}, base read: {hit['base_from_cache']}, "
                          f"{hit['cpu_s']} CPU-s, {hit['wall_s']} s wall", flush=True)
    pathlib.Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
