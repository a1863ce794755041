"""The margin band of the verdict: an example within 1/2 … 4 times its tolerance is
``marginal`` — never red, matched by a ledger line either way — so that the last bits a CPU's vector width
changes never flip a run's exit code (harness/core/tolerance.py: ``verdict``, ``PASS_BELOW``, ``FAIL_ABOVE``,
``LEDGER_ABOVE``)."""

from __future__ import annotations

import json
import math
import os

import forked_cli
import pytest

from rlconform.harness.core.tolerance import FAIL_ABOVE, LEDGER_ABOVE, PASS_BELOW, verdict

BINDING = os.path.join(os.path.dirname(__file__), "bindings", "scaled_error.py")
FID = "masked_sum.matches_reference.float64.padded"


def test_the_band_edges():
    assert (PASS_BELOW, FAIL_ABOVE) == (0.5, 4.0) and math.isclose(LEDGER_ABOVE, math.sqrt(2))
    assert verdict(0.0) == verdict(0.5) == "pass"
    assert verdict(0.5000001) == verdict(1.0) == verdict(1.0001, ok=False) == verdict(4.0, ok=False) == "marginal"
    assert verdict(4.0000001, ok=False) == verdict(math.inf, ok=False) == verdict(math.nan, ok=False) == "discrepancy"
    # a failure without a ratio is never softened; "not ok" at a small ratio cannot pass
    assert verdict(0.1, ok=False) == "marginal"


def _check(tmp_path, ratio: float, ledger_line: str | None = None, *extra: str):
    out = tmp_path / "r"
    args = ["check", "--engine", BINDING, "--op", "masked_sum",
            "--property", "matches_reference", "--dtype", "float64", "--regime", "padded", "--max-examples", "4",
            "--out", str(out), "-q", "--fail-on", "precision", *extra]  # any failure is red, rounding-sized too
    if ledger_line is not None:
        (tmp_path / "xfails.txt").write_text(ledger_line + "\n")
        args += ["--xfails", str(tmp_path / "xfails.txt")]
    env = dict(os.environ, RLCONFORM_TEST_ERROR_RATIO=str(ratio))
    proc = forked_cli.run(args, timeout=900, env=env)  # RLCONFORM_* variables reach a forked child
    (f,) = json.loads((out / "report.json").read_text())["findings"]
    return proc, f, out


@pytest.mark.cli
@pytest.mark.parametrize("ratio, status, code", [(0.1, "pass", 0), (2.0, "marginal", 0), (40.0, "discrepancy", 1)])
def test_a_finding_takes_its_worst_examples_verdict(tmp_path, ratio, status, code):
    proc, f, out = _check(tmp_path, ratio)
    assert (proc.returncode, f["status"]) == (code, status), (f, proc.stdout[-2000:], proc.stderr[-2000:])
    if status == "marginal":
        assert PASS_BELOW < f["max_ratio"] <= FAIL_ABOVE and f["examples"] == 4 and not f["shrink_steps"]
        assert "tolerance" in f["message"] and f["reproducer"], f  # what it was, and how to see it again
        replay = forked_cli.run(["replay",
                                 str(out / f["reproducer"]["case_file"]), "--engine", BINDING], timeout=600,
                                env=dict(os.environ, RLCONFORM_TEST_ERROR_RATIO=str(ratio)))
        assert replay.returncode == 0 and "\nMARGINAL: " in replay.stdout, replay.stdout + replay.stderr
        assert json.loads((out / "report.json").read_text())["summary"]["marginal"] == 1


@pytest.mark.cli
def test_a_listed_finding_is_matched_marginal_or_discrepancy_and_xpass_only_when_it_passes(tmp_path):
    line = f"{FID}  # discrepancy: known"
    proc, f, _ = _check(tmp_path, 2.0, line)
    assert (proc.returncode, f["status"]) == (0, "xfail") and "marginal" in f["message"], f
    proc, f, _ = _check(tmp_path, 40.0, line)
    assert (proc.returncode, f["status"]) == (0, "xfail"), f
    proc, f, _ = _check(tmp_path, 0.1, line)
    assert (proc.returncode, f["status"]) == (1, "xpass"), f


@pytest.mark.cli
def test_the_ledger_lists_a_marginal_finding_above_the_bands_centre(tmp_path):
    from rlconform.harness.cli import main

    for ratio, listed in ((2.0, True), (0.7, False)):
        proc, f, out = _check(tmp_path, ratio)
        assert f["status"] == "marginal", f
        # ratio 2.0 → example ratios in [1, 2]; 0.7 → [0.35, 0.7]: above and below √2 resp. only if the floor
        # dominates, so the test reads the recorded ratio rather than assume it
        expect = f["max_ratio"] > LEDGER_ABOVE
        if listed:
            assert expect, f
        proc = forked_cli.run(["ledger", str(out / "report.json")],
                              timeout=300)
        assert proc.returncode == 0
        assert (FID in proc.stdout) == expect, proc.stdout
    del main


@pytest.mark.parametrize("prop", ["partition_invariant", "mask_invariant", "implementations_agree"])
@pytest.mark.parametrize("scale, expected", [(0.25, "pass"), (2.0, "marginal"), (40.0, "discrepancy")])
def test_the_band_grades_differences_between_runs_like_differences_from_the_reference(prop, scale, expected):
    """An alternative run (another partition, garbage at masked positions, a second implementation) that
    differs from the base run by ``scale`` times the allowed difference is graded by the same band as an
    error against the reference: 2× is marginal (CPU-dependent last bits), 40× a discrepancy."""
    import numpy as np

    from rlconform.harness.core.evaluation import Compared, Evaluation
    from rlconform.properties import generic

    ref = np.array([1.0, 2.0])
    base = Compared("value", ref.copy(), ref, None, "float32", "reduction")
    probe = Compared("value", ref.copy(), ref, None, "float32", "reduction")
    allowed = getattr(generic, "agreement_bound")(ref, ref, ref, None, dtype="float32", kind="reduction") \
        if prop == "implementations_agree" else 2 * generic.bound(ref, None, dtype="float32", kind="reduction")
    alt = Compared("value", ref + scale * allowed * np.array([0.0, 1.0]), ref, None, "float32", "reduction")
    outcome = getattr(generic, prop)(Evaluation(values=[base], alternatives=[("other", [alt])]))
    assert outcome.verdict == expected, (outcome, allowed)
    assert (outcome.message == "") == (expected == "pass")
    assert probe.engine.tolist() == ref.tolist()


@pytest.mark.parametrize("prop, kind", [("partition_invariant", "partition dependence"),
                                        ("mask_invariant", "masked-value dependence"),
                                        ("implementations_agree", "implementations disagree")])
def test_the_report_reads_the_difference_the_property_wrote(prop, kind):
    """The triage parses the very message the property writes (a value doubled under another partition is a
    partition dependence, not rounding): the two cannot drift apart (a changed message once sent every
    partition dependence of verl's report into a rounding row)."""
    import numpy as np

    from rlconform.harness.core.evaluation import Compared, Evaluation
    from rlconform.harness.report import triage
    from rlconform.properties import generic

    ref = np.array([1.0, 2.0])
    base = Compared("loss", ref.copy(), ref, None, "float32", "reduction")
    alt = Compared("loss", 2 * ref, ref, None, "float32", "reduction")
    outcome = getattr(generic, prop)(Evaluation(values=[base], alternatives=[("other", [alt])]))
    finding = {"id": f"agg_loss.{prop}.float32.token-mean@moderate", "op": "agg_loss", "property": prop,
               "dtype": "float32", "regime": "token-mean@moderate", "status": outcome.verdict,
               "message": outcome.message, "max_ratio": outcome.ratio, "max_rel_err": outcome.max_rel_err}
    assert outcome.verdict == "discrepancy" and triage.kind(finding) == kind, (outcome.message, triage.kind(finding))
