"""Every mutant is caught by the property docs/bug-kinds.md names, under the CI profile; every generic property is
failed by at least one mutant; the reference engine passes everything it is checked on.

A mutant is rlconform's own code (it patches nothing at import and never ends its process), so it is checked
in the test's process (:func:`_check_in_process`): the worker's own finding runner and recorder, the CI
profile's settings and each finding's seed, so the same examples as ``rlconform check --profile ci`` (one
mutant of each kind is also run through the command line, and its report must give the same statuses:
:func:`test_mutant_is_caught_by_the_command_line`). The distributed mutants of one test process share its gloo
pool. A mutant that declares ``CAUGHT_BY`` (finding ids of its ``EXPECTED`` / ``EXPECTED_CRASH`` pairs) is
checked on those findings only: each must fail, and every declared pair must have a listed finding
(:func:`test_caught_by_covers_the_declared_pairs`). The findings of the op that the mutant does not break
prove nothing about it (the reference engine's run, :func:`test_reference_engine_passes_everything`, proves
they pass for a correct engine)."""

from __future__ import annotations

import importlib
import json
import shlex
import subprocess

import forked_cli
import pytest

from rlconform.harness.bindings.load import mutant_names
from rlconform.harness.catalog.ops import PROPERTIES

MUTANTS = mutant_names()
DISTRIBUTED_KINDS = ("vocab_parallel", "context_parallel", "dp_metric")


@pytest.fixture(scope="module", autouse=True)
def _pools_closed_after_the_module():
    """The gloo pool the distributed mutants share ends with this module."""
    yield
    from rlconform.harness.workers.pool import close_all_pools

    close_all_pools()


def run_cli(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return forked_cli.run(args, cwd=cwd, timeout=900)  # a fresh process, forked with torch imported


def expected(name: str) -> list[tuple[str, str]]:
    return importlib.import_module(f"rlconform.harness.mutants.{name}").EXPECTED


def expected_crash(name: str) -> list[tuple[str, str]]:
    """(op, property) pairs whose finding must be a ``crash``: a mutant of a "raises on a legal input"
    family (a degenerate batch raises) declares them in ``EXPECTED_CRASH``."""
    return list(getattr(importlib.import_module(f"rlconform.harness.mutants.{name}"), "EXPECTED_CRASH", []))


def caught_by(name: str) -> list[str]:
    """Finding ids that catch the mutant under the CI profile (optional ``CAUGHT_BY`` of its module)."""
    return list(getattr(importlib.import_module(f"rlconform.harness.mutants.{name}"), "CAUGHT_BY", []))


@pytest.mark.parametrize("name", [n for n in MUTANTS if caught_by(n)])
def test_caught_by_covers_the_declared_pairs(name):
    import re

    from rlconform.harness.core.opinfo import FINDING_ID

    ids = caught_by(name)
    declared = set(expected(name)) | set(expected_crash(name))
    bad = [i for i in ids if not re.fullmatch(FINDING_ID, i)]
    assert not bad, f"mutants.{name}: CAUGHT_BY entries that are not finding ids: {bad}"
    named = {tuple(i.split(".")[:2]) for i in ids}
    assert named <= declared, f"mutants.{name}: CAUGHT_BY names undeclared pairs {named - declared}"
    assert declared <= named, f"mutants.{name}: no CAUGHT_BY finding for {declared - named}"


def test_mutant_zoo_covers_every_property():
    failed_by_some = {prop for name in MUTANTS for _, prop in expected(name)}
    assert set(PROPERTIES) <= failed_by_some, f"no mutant fails {set(PROPERTIES) - failed_by_some}"


def test_zoo_has_a_mutant_per_single_process_family():
    assert len(MUTANTS) >= 10


def _check_in_process(name: str, tmp_path, pairs, crash_pairs, finding_ids=None, dtypes=()) -> dict:
    """Finding id -> (status, recorder) of mutant ``name`` on the findings of ``pairs`` (``finding_ids``
    when given), in this process: the examples of ``rlconform check --profile ci --max-shrinks 0 -n 0
    --no-referee`` (the worker's own :func:`~rlconform.properties.runner.run_finding`, with the CI profile's
    settings, the finding's seed and the same recorder; the status by the worker's
    :func:`~rlconform.harness.run.recorder.classify`). A distributed op runs on this process's gloo pool, kept
    for the next mutant."""
    from rlconform.harness.bindings.load import load_engine, variant_info
    from rlconform.harness.catalog.ops import strategy_for
    from rlconform.harness.core.profiles import settings_for
    from rlconform.harness.run.dispatch import checker_for
    from rlconform.harness.run.recorder import FindingRecorder, classify
    from rlconform.harness.run.selection import selected_findings
    from rlconform.properties.runner import run_finding

    binding = load_engine(f"mutants.{name}")
    state = type("State", (), dict(settings=settings_for("ci"), seed=None, corpus=None, out=str(tmp_path),
                                   xfails={}, inflight=None, binding=binding,
                                   shrink_budget=staticmethod(lambda fid: 0)))()
    ops = sorted({op for op, _ in pairs + crash_pairs})
    props = sorted({p for _, p in pairs + crash_pairs})
    chosen = selected_findings(binding.provided_ops(), ops, props, dtypes, variants=variant_info(binding)[0],
                               profile="ci", findings=set(finding_ids) if finding_ids else None)
    assert chosen, f"mutants.{name}: nothing selected for {pairs + crash_pairs}"
    out = {}
    for finding in chosen:
        fid = ".".join(finding)
        rec = FindingRecorder(state, fid)
        op, _, dtype, regime = finding
        try:
            run_finding(binding, finding, rec, state, strategy_for(op, dtype, regime), check=checker_for(op))
        except pytest.skip.Exception as exc:
            out[fid] = (f"unavailable: {exc}", rec)
        except BaseException as exc:  # noqa: BLE001 - classified as the worker does
            if isinstance(exc, KeyboardInterrupt):
                raise
            out[fid] = (classify(exc), rec)
        else:
            out[fid] = ("pass", rec)
    return out


def _assert_caught(name: str, tmp_path) -> None:
    """Mutant ``name`` fails each of its ``CAUGHT_BY`` findings (else some finding of each declared pair) as
    it declares, and the failing example, saved as a case file, replays to the same verdict."""
    from rlconform.harness.bindings.load import load_engine
    from rlconform.harness.core.evaluation import EngineCrash
    from rlconform.harness.run.dispatch import run_check
    from rlconform.properties.case import load_case, save_case

    pairs, crash_pairs = expected(name), expected_crash(name)
    real = list(getattr(importlib.import_module(f"rlconform.harness.mutants.{name}"), "EXPECTED_REAL_SHAPES", []))
    if real and not pairs and not crash_pairs:
        # a fault that only exists at real sizes: the CI profile's regimes of its ops pass (it is caught by the
        # nightly profile's real_shapes regime: tests/test_real_shapes.py)
        got = _check_in_process(name, tmp_path, real, [], dtypes=("float32",))
        assert len(got) >= 2 * len(real) and {s for s, _ in got.values()} == {"pass"}, \
            f"mutants.{name} fails the CI regimes: { {k: s for k, (s, _) in got.items()} }"
        return
    assert pairs or crash_pairs, f"mutants.{name} declares neither EXPECTED nor EXPECTED_CRASH"
    listed = caught_by(name)  # the findings that catch it, with the CI profile's examples; else its whole ops
    got = _check_in_process(name, tmp_path, pairs, crash_pairs, listed)
    statuses = {fid: s for fid, (s, _) in got.items()}
    for fid in listed:
        assert statuses.get(fid) in ("discrepancy", "crash"), f"mutants.{name}: CAUGHT_BY {fid} is {statuses.get(fid)}"
    for op, prop in pairs:
        mine = {s for fid, s in statuses.items() if fid.startswith(f"{op}.{prop}.")}
        assert "discrepancy" in mine, f"mutants.{name}: {op}.{prop} statuses {mine}"
    for op, prop in crash_pairs:
        mine = {s for fid, s in statuses.items() if fid.startswith(f"{op}.{prop}.")}
        assert "crash" in mine, f"mutants.{name}: {op}.{prop} statuses {mine} (expected a crash)"
    # the failing example, saved as the report's case file, replays to the same verdict on a fresh load of the
    # binding (as `rlconform replay --no-referee` runs it: in this process)
    verdict = "discrepancy" if pairs else "crash"
    fid, (_, rec) = next((fid, v) for fid, v in got.items() if v[0] == verdict)
    assert rec.failing is not None, f"mutants.{name}: {fid} failed without a failing case"
    path = tmp_path / f"{fid}.json"
    save_case(rec.failing, str(path))
    try:
        outcome = run_check(load_engine(f"mutants.{name}"), load_case(str(path)))
        replayed = outcome.verdict
    except EngineCrash as exc:
        replayed = "crash"
        outcome = exc
    assert replayed == verdict, f"mutants.{name}: {fid} replays as {replayed}: {outcome}"


def _distributed(name: str) -> bool:
    from rlconform.harness.catalog.ops import get_op

    pairs = expected(name) + expected_crash(name) + list(
        getattr(importlib.import_module(f"rlconform.harness.mutants.{name}"), "EXPECTED_REAL_SHAPES", []))
    return any(get_op(op).distributed for op, _ in pairs)


@pytest.mark.parametrize("name", [n for n in MUTANTS if not _distributed(n)])
def test_mutant_is_caught(name, tmp_path):
    _assert_caught(name, tmp_path)


@pytest.mark.distributed
@pytest.mark.parametrize("name", [n for n in MUTANTS if _distributed(n)])
def test_distributed_mutant_is_caught(name, tmp_path):
    # every distributed mutant of this process shares one gloo pool (its ranks load each mutant by name)
    _assert_caught(name, tmp_path)


#: one mutant of each way a mutant is caught, through the whole command line: a single-process discrepancy,
#: an engine that raises on a legal input, a distributed discrepancy (the rest are checked in process above,
#: with the same examples)
CLI_MUTANTS = ("mean_of_shard_means", "whiten_raises_one_token", "vp_smoothing_per_shard")


@pytest.mark.cli
@pytest.mark.parametrize("name", CLI_MUTANTS)
def test_mutant_is_caught_by_the_command_line(name, tmp_path):
    pairs = expected(name)
    crash_pairs = expected_crash(name)
    # --fail-on precision: a mutant is caught when its findings fail, whatever their severity (a rounding-level
    # mutant's findings are `precision`, which the default --fail-on does not turn red)
    # --max-shrinks 0: a finding's status never depends on shrinking (harness/core/profiles.py), only its
    # reproducer's size, and the unshrunk reproducer is replayed below
    out = tmp_path / "out"
    # --no-referee, -n 0: a mutant is rlconform's own code and patches nothing at import; it runs in the CLI's
    # process (tests/test_referee_*.py and tests/test_robustness_*.py prove the referee and the worker paths)
    args = ["check", "--engine", f"mutants.{name}", "--out", str(out), "--profile", "ci", "-q",
            "--fail-on", "precision", "--max-shrinks", "0", "--no-referee", "-n", "0"]
    for op in sorted({op for op, _ in pairs + crash_pairs}):
        args += ["--op", op]
    for prop in sorted({p for _, p in pairs + crash_pairs}):
        args += ["--property", prop]
    listed = caught_by(name)
    if listed:
        (tmp_path / "caught_by.txt").write_text("\n".join(listed) + "\n")
        args += ["--findings", str(tmp_path / "caught_by.txt")]
    proc = run_cli(*args)
    assert proc.returncode == 1, f"mutants.{name} not caught (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    with open(out / "report.json") as fh:
        doc = json.load(fh)
    assert doc["run"]["complete"]
    by_id = {f["id"]: f["status"] for f in doc["findings"]}
    for fid in listed:
        assert by_id.get(fid) in ("discrepancy", "crash"), f"mutants.{name}: CAUGHT_BY {fid} is {by_id.get(fid)}"
    for op, prop in pairs:
        statuses = {f["status"] for f in doc["findings"] if f["op"] == op and f["property"] == prop}
        assert "discrepancy" in statuses, f"mutants.{name}: {op}.{prop} statuses {statuses}"
    for op, prop in crash_pairs:
        statuses = {f["status"] for f in doc["findings"] if f["op"] == op and f["property"] == prop}
        assert "crash" in statuses, f"mutants.{name}: {op}.{prop} statuses {statuses} (expected a crash)"
    # the report's statuses are the in-process check's (the same examples)
    inproc = _check_in_process(name, tmp_path / "inproc", pairs, crash_pairs, listed)
    assert {fid: s for fid, (s, _) in inproc.items()} == {fid: by_id[fid] for fid in inproc}
    # every discrepancy (or expected crash) comes with a reproducer that replays to the same verdict
    verdict = "discrepancy" if pairs else "crash"
    bad = [f for f in doc["findings"] if f["status"] == verdict]
    command = shlex.split(bad[0]["reproducer"]["command"])  # the command the report prints, engine included
    assert command[:2] == ["rlconform", "replay"] and command[command.index("--engine") + 1] == f"mutants.{name}"
    replay = run_cli(*command[1:], "--no-referee")
    assert replay.returncode == 1, replay.stdout + replay.stderr
    assert verdict.upper() in replay.stdout


#: the reference engine's whole catalog runs as this many shards (``check --shard K/N``), one test each: xdist
#: spreads them over its workers, so the longest test of the suite is a third as long
REFERENCE_SHARDS = 3


@pytest.mark.cli
@pytest.mark.parametrize("shard", range(1, REFERENCE_SHARDS + 1))
def test_reference_engine_passes_everything(tmp_path, shard):
    # every finding of the catalog (a third in each shard) with three examples each, through the command
    # line's worker and referee: the full CI profile of the reference engine runs in `make reports`-sized time, not
    # in the self-tests (benchmarks and the nightly profile do it); one worker, as the suite runs two tests at once
    proc = run_cli("check", "--engine", "reference", "--out", str(tmp_path), "--profile", "ci", "--max-examples", "3",
                   "--shard", f"{shard}/{REFERENCE_SHARDS}", "-q", "-n", "1")
    with open(tmp_path / "report.json") as fh:
        doc = json.load(fh)
    bad = [f"{f['id']}: {f['status']}: {f['message'][:300]}" for f in doc["findings"] if f["status"] != "pass"]
    assert proc.returncode == 0 and not bad, "\n".join(bad) + proc.stdout[-2000:] + proc.stderr[-2000:]
    # the shards partition the catalog (tests/test_shards.py): each holds a third of it
    assert doc["run"]["shard"] == f"{shard}/{REFERENCE_SHARDS}" and doc["summary"]["pass"] >= 300
