"""Every promise of the README and the documents beside it (CONTRIBUTING.md, docs/) holds: their shell
commands are extracted and the cheap ones run in one scratch folder, with the documents' own example files
(``my_binding.py``, ``token_mean.py``) written from their Python blocks; the paths they name exist.

:data:`PLAN` says, for every command of the documents' code blocks, what this test does with it: run it as
written, run it with options that keep it cheap (an example budget instead of minutes, one op), or skip it
and why (a real-engine check, an install, a placeholder only the reader can fill in). A command added to a
document without an entry in :data:`PLAN` fails :func:`test_every_readme_command_is_planned`.
"""

from __future__ import annotations

import glob
import json
import os
import pathlib
import re
import shlex
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
#: what users and contributors read, README first
DOCUMENTS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").rglob("*.md"))]
README = "\n\n".join(p.read_text() for p in DOCUMENTS)


def code_blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", text, re.S | re.M)


def readme_commands(text: str = README) -> list[str]:
    """The shell commands of the README: every line of its ``bash`` blocks (``# comments`` cut off) and the
    ``$ `` lines of its ``text`` transcripts; ``a | b | c`` after ``rlconform`` (the README's shorthand
    for three subcommands) stays one entry."""
    cmds = []
    for block in code_blocks(text, "bash"):
        for line in block.splitlines():
            line = re.sub(r"\s+#\s.*$", "", line).strip()
            if line:
                cmds.append(line)
    for block in code_blocks(text, "text"):
        cmds += [line[2:].split("  #")[0].strip() for line in block.splitlines() if line.startswith("$ ")]
    return cmds


def python_files(text: str = README) -> dict[str, str]:
    """The README's Python blocks that start with ``# NAME.py``: file name → source."""
    out = {}
    for block in code_blocks(text, "python"):
        m = re.match(r"# (\w+\.py)\b", block)
        if m:
            out[m.group(1)] = block
    return out


#: what the test does with each README command: ("run", extra arguments appended) or ("skip", reason)
PLAN: dict[str, tuple] = {
    "make check-verl": ("skip", "installs torch and the three engines, then checks verl (~30 min)"),
    "make test": ("skip", "the whole self-test suite, this test included"),
    "make test-fast": ("skip", "the fast self-tests, this test included"),
    "rlconform check --engine verl --op agg_loss": ("skip", "a real-engine check (tests/test_verdict_stability.py runs it)"),
    "ci/rlconform-pr.sh --engine verl --base-ref origin/main --xfails rlconform-xfails.txt":
        ("skip", "a fork's checkout only the reader has; tests/test_ci_recipe.py runs the script on a toy fork"),
    "rlconform check --engine verl --device cuda --profile ci --out rlconform-report/verl-cuda":
        ("skip", "needs a GPU (docs/cuda.md)"),
    "rlconform check --engine verl --device cuda:1 --op fused_linear_token_stats": ("skip", "needs a GPU"),
    "RLCONFORM_DEVICE=cuda rlconform replay rlconform-report/verl-cuda/cases/<finding id>.json --engine verl":
        ("skip", "needs a GPU's report"),
    "rlconform diff reports/verl-0.9.1 rlconform-report/verl-cuda --allow-device-mismatch":
        ("skip", "needs a GPU's report; tests/test_device.py diffs a CPU and a CUDA report"),
    "rlconform check --engine verl": ("skip", "a real-engine check (29 min)"),
    "rlconform check --engine skyrl --op metric_pipeline": ("skip", "a real-engine check"),
    "rlconform check --engine verl --device cuda":
        ("skip", "needs a GPU; benchmarks/cuda_check.sh runs it there, tests/test_device.py its CPU paths"),
    "rlconform check --engine verl --engine-path ~/src/my-verl-fork":
        ("skip", "a real-engine check of a fork checkout only the reader has (tests/test_engine_path.py)"),
    "rlconform check --engine my_binding.py": ("run", ["--max-examples", "3"]),
    "rlconform check --engine mutants.mean_of_shard_means":
        ("run", ["--op", "metric_pipeline", "--property", "matches_reference", "--max-examples", "5"]),
    "rlconform replay rlconform-report/cases/<finding id>.json --engine verl":
        ("run", "a failing finding of the report above, on the engine that produced it (verl: a real engine)"),
    "rlconform report rlconform-report": ("run", []),
    "rlconform report rlconform-report --config my_trainer.yaml":
        ("skip", "a trainer config only the reader has; tests/test_config_reach.py reads the committed verl report "
                 "against one"),
    "rlconform fuzz --engine my_binding.py --minutes 10": ("run", ["--max-examples", "4", "--dtype", "float32"]),
    "rlconform list-ops | list-engines | --version": ("run", "each of the three"),
    "rlconform coverage --engine verl [--strict]":
        ("skip", "imports the real engine; tests/test_coverage.py runs the command, --strict included"),
    "rlconform audit --engine verl --report reports/verl-0.9.1":
        ("skip", "reads the real engine's source; tests/test_audit.py runs the command"),
    "rlconform fuzz --engine X [--op Y] [--property P] [--dtype D] [--minutes N] [--max-examples K] [--corpus DIR] "
    "[--db DIR] [--seed S]":
        ("skip", "a synopsis; its options are tested in tests/test_fuzz.py"),
    "rlconform fuzz --engine token_mean.py --minutes 0.5": ("run", ["--max-examples", "4"]),
    "echo $?": ("skip", "shell: the exit code of the command before it, which the test checks"),
    "PYTHONPATH=. rlconform fuzz --engine token_mean:buggy --minutes 0.5": ("run", ["--max-examples", "12"]),
    "PYTHONPATH=. rlconform check --engine token_mean:buggy": ("run", ["--max-examples", "3"]),
    "torchrun --nproc-per-node 2 -m rlconform.harness.workers.pool rlconform.harness.workers.pool_cases:allreduce_sum "
    "'{\"dtype\": \"bfloat16\"}'": ("run", []),
    "torchrun --standalone --nproc-per-node 2 --module rlconform.harness.cli replay DIR/cases/<finding id>.json "
    "--engine X": ("skip", "needs a saved distributed case; tests/test_distributed_mutants.py replays one so"),
}


def test_every_readme_command_is_planned():
    cmds = readme_commands()
    assert len(cmds) >= 15  # the extraction works
    assert set(cmds) == set(PLAN), {"not planned": sorted(set(cmds) - set(PLAN)),
                                    "no longer in the README": sorted(set(PLAN) - set(cmds))}
    for cmd, (what, why) in PLAN.items():
        assert what in ("run", "skip") and why is not None, cmd


def _run(cmd: str | list[str], cwd, extra=(), env_extra=None) -> subprocess.CompletedProcess:
    """Run one README command as a reader would after activating the venv: ``rlconform`` and ``torchrun``
    are the venv's (this interpreter's), ``VAR=value`` prefixes go to the environment."""
    argv = shlex.split(cmd) if isinstance(cmd, str) else list(cmd)
    env = dict(os.environ, PYTHONUNBUFFERED="1", **(env_extra or {}))
    while argv and re.match(r"^[A-Z_]+=", argv[0]):
        k, _, v = argv.pop(0).partition("=")
        env[k] = str(cwd / v) if v == "." else v
    bindir = os.path.dirname(sys.executable)
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    if argv[0] == "rlconform":
        argv = [sys.executable, "-m", "rlconform.harness.cli", *argv[1:]]
    elif argv[0] == "torchrun":
        argv = [sys.executable, "-m", "torch.distributed.run", *argv[1:]]
    return subprocess.run([*argv, *extra], cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


def _extra(cmd: str) -> list[str]:
    what, extra = PLAN[cmd]
    assert what == "run" and isinstance(extra, list), cmd
    return extra


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    d = tmp_path_factory.mktemp("readme")
    for name, src in python_files().items():
        (d / name).write_text(src)
    return d


def test_readme_python_examples_are_extracted(scratch):
    assert (scratch / "my_binding.py").exists() and (scratch / "token_mean.py").exists()
    assert (scratch / "test_my_numerics.py").exists()


def test_the_fork_test_file_of_the_readme_runs(scratch):
    """The README's fork test file, with a stand-in ``my_fork.numerics`` whose masked mean ignores the mask:
    its test fails with the finding's message and replay command, in a few lines."""
    pkg = scratch / "my_fork"
    pkg.mkdir(exist_ok=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "numerics.py").write_text("def fast_masked_mean(values, mask):\n    return values.mean()\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_my_numerics.py"],
                          cwd=scratch, env=dict(os.environ, PYTHONPATH=str(scratch)), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "does not conform to op 'masked_mean'" in proc.stdout and "rlconform replay" in proc.stdout
    assert "harness/run/conforms.py" not in proc.stdout  # the failure shows the test's line, not rlconform



@pytest.mark.cli
@pytest.mark.distributed
def test_listing_commands(scratch):
    for sub in ("list-ops", "list-engines", "--version"):
        proc = _run(["rlconform", sub], scratch)
        assert proc.returncode == 0 and proc.stdout.strip(), (sub, proc.stderr)


@pytest.mark.cli
@pytest.mark.distributed
def test_binding_example(scratch):
    """The README's ``my_binding.py`` finds what the README says: its entropy gives NaN on ``-inf``-padded
    vocab in every dtype, ``token_logprobs`` (``my_pkg``, which does not exist) is unavailable, and the
    ``.float()`` makes exactly three float64 gradient findings, all ``precision`` (the one on
    ``near_uniform_offset``, logits near ±1e4, is a wrong gradient on an extreme regime no trainer produces)."""
    cmd = "rlconform check --engine my_binding.py"
    proc = _run(cmd, scratch, _extra(cmd) + ["--out", "mine"])
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    doc = json.loads((scratch / "mine" / "report.json").read_text())
    by_id = {f["id"]: f for f in doc["findings"]}
    for dtype in ("float16", "bfloat16", "float32", "float64"):
        assert by_id[f"entropy.finite_where_reference_finite.{dtype}.neg_inf_padded"]["status"] == "discrepancy"
    assert {f["status"] for f in doc["findings"] if f["op"] == "token_logprobs"} == {"unavailable"}
    assert {f["op"] for f in doc["findings"]} == {"entropy", "token_logprobs"}
    other = {f["id"]: f for f in doc["findings"] if f["op"] == "entropy" and f["status"] != "pass"
             and f["regime"] != "neg_inf_padded"}
    assert {i: f["severity"] for i, f in other.items()} == {
        "entropy.matches_reference.float64.moderate": "precision",
        "entropy.matches_reference.float64.peaked": "precision",
        "entropy.matches_reference.float64.near_uniform_offset": "precision"}, {i: f["message"] for i, f in other.items()}
    assert all(f["message"].startswith("gradient:") for f in other.values())  # the values pass

    cmd = "rlconform fuzz --engine my_binding.py --minutes 10"
    proc = _run(cmd, scratch, _extra(cmd))
    assert proc.returncode == 1 and "new counterexample entropy.finite_where_reference_finite.float32.neg_inf_padded" \
        in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]


@pytest.mark.cli
@pytest.mark.distributed
def test_check_replay_report_of_the_default_folder(scratch):
    """``check`` without ``--out`` writes ``rlconform-report/``; the replay and report commands of the README
    work on what it wrote."""
    cmd = "rlconform check --engine mutants.mean_of_shard_means"
    proc = _run(cmd, scratch, _extra(cmd))
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    out = scratch / "rlconform-report"
    doc = json.loads((out / "report.json").read_text())
    bad = next(f for f in doc["findings"] if f["status"] == "discrepancy")

    replay = next(c for c in PLAN if c.startswith("rlconform replay rlconform-report/"))
    concrete = replay.replace("<finding id>", bad["id"]).replace("--engine verl", f"--engine {doc['engine']['spec']}")
    assert (scratch / shlex.split(concrete)[2]).exists()  # the README's path is where check wrote the case
    proc = _run(concrete, scratch)
    assert proc.returncode == 1 and "DISCREPANCY" in proc.stdout, proc.stdout + proc.stderr

    for name in ("report.md", "report.html"):
        os.remove(out / name)
    proc = _run("rlconform report rlconform-report", scratch)
    assert proc.returncode == 0, proc.stderr
    assert (out / "report.md").exists() and (out / "report.html").exists()


@pytest.mark.cli
@pytest.mark.distributed
def test_fuzzing_transcript(scratch):
    """The worked fuzzing example: the correct reducer has no counterexample (exit 0), the refactor's is
    found and saved, and ``check`` replays the saved cases first: each of those findings fails on its first
    example."""
    cmd = "rlconform fuzz --engine token_mean.py --minutes 0.5"
    proc = _run(cmd, scratch, _extra(cmd) + ["--corpus", "clean-corpus"])
    assert proc.returncode == 0 and "no counterexample" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]

    cmd = "PYTHONPATH=. rlconform fuzz --engine token_mean:buggy --minutes 0.5"
    proc = _run(cmd, scratch, _extra(cmd) + ["--stats", "buggy.json"])
    assert proc.returncode == 1 and "new counterexample" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]
    found = [t["id"] for t in json.loads((scratch / "buggy.json").read_text())["targets"] if t["status"] == "found"]
    assert found and all(glob.glob(str(scratch / "rlconform-corpus" / i / "*.json")) for i in found)

    cmd = "PYTHONPATH=. rlconform check --engine token_mean:buggy"
    proc = _run(cmd, scratch, _extra(cmd) + ["--out", "buggy-report"])
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    doc = json.loads((scratch / "buggy-report" / "report.json").read_text())
    by_id = {f["id"]: f for f in doc["findings"]}
    for i in found:
        assert by_id[i]["status"] == "discrepancy" and by_id[i]["examples_to_first_failure"] == 1, by_id[i]


@pytest.mark.cli
@pytest.mark.distributed
def test_torchrun_pool_example(scratch):
    cmd = next(c for c in PLAN if c.startswith("torchrun --nproc-per-node 2 -m rlconform.harness.workers.pool"))
    proc = _run(cmd, scratch)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]


#: paths the README names that the reader's commands write (not in the repository): the command that writes each
WRITTEN = {
    ".venv/rlconform-install.log": "make setup (Makefile: PIPLOG)",
    ".venv/rlconform-engines-install.log": "make engines",
    "rlconform-report": "rlconform check (the default --out; test_check_replay_report_of_the_default_folder)",
    "rlconform-report/verl": "make check-verl (Makefile: --out $(OUT)/verl)",
    "rlconform-report/verl/": "make check-verl (Makefile: --out $(OUT)/verl)",
    "rlconform-report/verl/report.json": "make check-verl (Makefile: --out $(OUT)/verl)",
    "rlconform-ci/comment.md": "ci/rlconform-pr.sh (tests/test_ci_recipe.py)",
    "rlconform-ci/rlconform.sarif": "ci/rlconform-pr.sh: rlconform diff --sarif (tests/test_ci_recipe.py)",
    "rlconform-ci/head/report.html": "ci/rlconform-pr.sh (tests/test_ci_recipe.py)",
    "rlconform-ci/head/selection.txt": "ci/rlconform-pr.sh (tests/test_ci_recipe.py)",
    "rlconform-ci/head/cases/…": "ci/rlconform-pr.sh (tests/test_ci_recipe.py)",
    "rlconform-ci/": "ci/rlconform-pr.sh (tests/test_ci_recipe.py)",
    ".github/workflows/rlconform.yml": "the fork's workflow file the README shows",
    "./rlconform-corpus": "rlconform fuzz",
    "rlconform-corpus/": "rlconform fuzz",
    "rlconform-xfails.txt": "rlconform init, in the reader's fork (tests/test_init.py)",
    "reports/verl-0.9.1-cuda/": "benchmarks/cuda_check.sh on a GPU machine (docs/cuda.md)",
}
TOP = ("harness/", "tests/", "reports/", "reference/", "install/", "properties/", "distributed_tests/", "ci/",
       "benchmarks/", ".github/", ".venv/", "rlconform-", "./rlconform-")


@pytest.mark.cli
def test_paths_the_readme_names_exist():
    tokens = set(re.findall(r"`([^`\s]+)`", README))
    paths = sorted(t for t in tokens if t.startswith(TOP) and not re.search(r"[(){}=|\[\]]", t))
    assert len(paths) >= 20
    missing = []
    for p in paths:
        if p in WRITTEN:
            continue
        pattern = re.sub(r"<[^>]+>", "*", p.split(":")[0])
        if not glob.glob(str(ROOT / pattern)):
            missing.append(p)
    assert not missing, missing
    # what WRITTEN says writes them does: the Makefile's targets and pip log
    makefile = (ROOT / "Makefile").read_text()
    assert "--out $(OUT)/verl" in makefile and re.search(r"^OUT\s*\?=\s*rlconform-report$", makefile, re.M)
    assert "rlconform-install.log" in makefile
    assert "rlconform-ci" in (ROOT / "ci" / "rlconform-pr.sh").read_text()


def test_reproducers_of_the_committed_reports_exist():
    """``rlconform replay reports/<engine>/cases/<finding id>.json --engine <engine>``: the README's form of
    every committed reproducer, and its case file is there."""
    for rep in glob.glob(str(ROOT / "reports" / "*" / "report.json")):
        folder = pathlib.Path(rep).parent
        doc = json.loads(pathlib.Path(rep).read_text())
        for f in doc["findings"]:
            cmd = (f.get("reproducer") or {}).get("command")
            if cmd:
                argv = shlex.split(cmd)
                assert argv[:2] == ["rlconform", "replay"] and argv[-2] == "--engine", cmd
                assert (ROOT / argv[2]).exists() and pathlib.Path(argv[2]).parent == \
                    folder.relative_to(ROOT) / "cases", cmd
