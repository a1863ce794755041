"""The ``real_shapes`` regime: nightly-only selection, generator descriptions in case files,
the generator path at small V (a test hook), and the mutant only real shapes catch.

No real-size check runs here: the token-stat tests shrink V (``REAL_VOCABS``) and T (``REAL_ROWS``) by
monkeypatch; the mutant test keeps V = 151 936 with 2 rows (seconds). The one real-size measurement is in
benchmarks/results/real_shapes.md.
"""

from __future__ import annotations

import json

import forked_cli
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings

from rlconform.harness.bindings.load import load_engine
from rlconform.harness.catalog.ops import OPS
from rlconform.harness.core.generated import GeneratorError, LogitsGen, TokensGen
from rlconform.harness.core.profiles import (
    DISTRIBUTED_CAP,
    REAL_SHAPES_CAP,
    ExampleCap,
    capped_settings,
    example_cap,
    profile_only,
)
from rlconform.harness.families import reductions as RD
from rlconform.harness.families import token_stats as TS
from rlconform.harness.run.selection import selected_findings
from rlconform.properties.case import Case, CaseError, decode_record, encode_record, load_case, save_case
from rlconform.properties.checks import run_check

TOKEN_OPS = ("logsumexp", "token_logprobs", "entropy", "sum_pi_squared")
PROPS = ("matches_reference", "non_destructive", "finite_where_reference_finite")


def draw(strategy, n: int) -> list:
    got = []

    @settings(max_examples=n, derandomize=True, database=None, suppress_health_check=list(HealthCheck),
              phases=(Phase.explicit, Phase.generate))
    @given(strategy)
    def collect(x):
        got.append(x)

    collect()
    return got[:n]


@pytest.fixture
def small(monkeypatch):
    """The test hook: real_shapes at V = 1000 / 257 and 3–5 rows, chunks of 2 rows."""
    monkeypatch.setattr(TS, "REAL_VOCABS", (1000, 257))
    monkeypatch.setattr(TS, "REAL_ROWS", (5, 3))
    monkeypatch.setattr(TS, "REAL_CHUNK_BYTES", 2 * 8 * 1000)


def test_only_nightly_selects_real_shapes():
    ops = list(OPS)
    for profile in ("dev", "ci", None):
        assert not [f for f in selected_findings(ops, profile=profile) if "real_shapes" in f[3]], profile
    every = selected_findings(ops, profile="nightly")
    nightly = [f for f in every if f[3] == "real_shapes" and f[0] in TOKEN_OPS]
    assert {(op, p, d) for op, p, d, _ in nightly} == {(op, p, d) for op in TOKEN_OPS for p in PROPS
                                                      for d in ("bfloat16", "float32")}
    reductions = {(op, p, d) for op, p, d, r in every if r == "real_shapes" and OPS[op].family == "reductions"}
    assert reductions == {(op, p, d) for op in OPS if OPS[op].family == "reductions"
                          for p in ("matches_reference", "non_destructive", "finite_where_reference_finite")
                          for d in ("bfloat16", "float32")}
    assert {(op, p, d) for op, p, d, r in every if r == "tp2_real_shapes"} == {
        (op, p, d) for op in OPS if OPS[op].family == "vocab_parallel"
        for p in ("matches_reference", "partition_invariant", "non_destructive") for d in ("bfloat16", "float32")}
    assert {(op, p, d) for op, p, d, r in every if r == "real_shapes" and op == "metric_pipeline"} == {
        ("metric_pipeline", p, d) for p in OPS["metric_pipeline"].properties for d in ("bfloat16", "float32")}
    real = [f for f in every if "real_shapes" in f[3]]
    assert {f[3] for f in real} == {"real_shapes", "tp2_real_shapes"}
    # the CI selection is the same as before the regime existed: every other finding is in both
    assert set(selected_findings(ops, profile="ci")) == set(every) - set(real)
    assert selected_findings(ops, profile="nightly", regimes=["real_shapes"]) == real
    assert OPS["entropy"].regime_profiles("real_shapes") == ("nightly",)
    assert "real_shapes" not in OPS["smoothed_token_logprobs"].regimes


@pytest.mark.cli
def test_list_ops_and_report_name_the_profile(capsys):
    from rlconform.harness.cli import cmd_list_ops
    from rlconform.harness.report.writer import _profile_lines
    from rlconform.harness.run.recorder import _with_profiles

    cmd_list_ops()
    assert "real_shapes (nightly profile only)" in capsys.readouterr().out
    entry = _with_profiles({"regime": "real_shapes"})
    assert entry["profiles"] == ["nightly"] and "profiles" not in _with_profiles({"regime": "moderate"})
    lines = _profile_lines({"run": {"profile": "nightly"}, "findings": [entry, {"regime": "moderate"}]})
    assert lines[0] == "profile `nightly`; regimes only this profile adds: real_shapes (1 findings)"
    assert _profile_lines({"run": {"profile": "ci"}, "findings": [{"regime": "moderate"}]})[0] == "profile `ci`"


def test_real_shapes_findings_run_few_derandomized_examples_unshrunk():
    base = settings(max_examples=500, derandomize=False)
    assert example_cap("real_shapes") is REAL_SHAPES_CAP and example_cap("moderate") is None
    assert example_cap("tp2_real_shapes") is REAL_SHAPES_CAP and REAL_SHAPES_CAP.max_shrinks == 0
    heavy = capped_settings(base, example_cap("real_shapes"), seeded=False)
    assert heavy.max_examples == 2 and heavy.derandomize and Phase.shrink not in heavy.phases
    assert capped_settings(settings(max_examples=1), REAL_SHAPES_CAP, seeded=False).max_examples == 1
    assert capped_settings(base, None, seeded=False) is base
    assert not capped_settings(base, REAL_SHAPES_CAP, seeded=True).derandomize  # --seed wins
    # an op's own cap wins over the default; a plain cap keeps the profile's phases and randomness
    own = ExampleCap(3)
    assert example_cap("real_shapes", {"real_shapes": own}) is own and own.max_shrinks is None
    # a distributed op's findings get the distributed cap, unless real-size or capped by the op itself
    assert example_cap("tp2_moderate", distributed=True).max_examples == DISTRIBUTED_CAP.max_examples
    assert example_cap("tp2_real_shapes", distributed=True) is REAL_SHAPES_CAP
    assert example_cap("tp2_moderate", {"tp2_moderate": own}, distributed=True) is own
    plain = capped_settings(base, own, seeded=False)
    assert plain.max_examples == 3 and not plain.derandomize and plain.phases == base.phases
    assert profile_only("token-mean@real_shapes") == ("nightly",) and profile_only("peaked") is None
    with pytest.raises(ValueError):
        ExampleCap(0)


def test_generator_rows_are_independent_of_the_range():
    gen = LogitsGen(7, (6, 300), peak=20.0, tail_scale=2.5, decay=0.5, offset=-3.0, head_tokens=3)
    full = gen.materialise("float32")
    assert full.shape == (6, 300) and full.dtype == torch.float32
    assert torch.equal(gen.rows("float32", 2, 5), full[2:5])
    assert torch.equal(gen.materialise("bfloat16"), full.to(torch.bfloat16))
    assert torch.equal(LogitsGen(7, (6, 300), 20.0, 2.5, 0.5, -3.0, 3).materialise("float32"), full)
    assert not torch.equal(LogitsGen(8, (6, 300), 20.0, 2.5, 0.5, -3.0, 3).materialise("float32"), full)
    # a peaked head: the top head token is the row's argmax when the peak dwarfs the tail
    assert (full.argmax(-1).numpy() == gen.head()[:, 0]).all()


def test_case_stores_the_description_and_round_trips(small, tmp_path):
    inp = draw(TS.real_logits(), 1)[0]
    assert isinstance(inp["logits"], LogitsGen)
    case = Case("entropy", "matches_reference", "float32", "real_shapes", inp)
    path = tmp_path / "case.json"
    save_case(case, path)
    doc = json.loads(path.read_text())
    assert doc["inputs"]["logits"]["generated"] == "logits/peaked_tail"  # a description, not the tensor
    back = load_case(path)
    assert back.inputs["logits"] == inp["logits"]
    assert np.array_equal(back.inputs["labels"], inp["labels"])
    assert torch.equal(back.inputs["logits"].materialise("float32"), inp["logits"].materialise("float32"))
    rec, meta = decode_record(encode_record(case, {"examples": 1}))
    assert rec.inputs["logits"] == inp["logits"] and meta == {"examples": 1}
    assert "LogitsGen(logits/peaked_tail" in case.summary()
    # replaying the loaded case gives the same verdict and numbers
    ref = load_engine("reference", None)
    a, b = run_check(ref, case), run_check(ref, back)
    assert a.ok and b.ok and a.max_abs_err == b.max_abs_err


@pytest.mark.parametrize("bad, why", [
    ({"generated": "logits/other"}, "unknown generator"),
    ({"shape": [0, 5]}, "positive"),
    ({"shape": [4]}, "[T, V]"),
    ({"seed": -1}, "seed"),
    ({"peak": "nan"}, "peak"),
    ({"peak": "0x1p+2000"}, "peak"),
    ({"head_tokens": 99}, "head_tokens"),
    ({"extra": 1}, "unknown generator fields"),
])
def test_malformed_description_is_a_case_error(small, tmp_path, bad, why):
    inp = draw(TS.real_logits(), 1)[0]
    doc = Case("entropy", "matches_reference", "float32", "real_shapes", inp).to_json()
    doc["inputs"]["logits"].update(bad)
    with pytest.raises(CaseError, match="generator description") as info:
        Case.from_json(doc)
    assert why in str(info.value)
    with pytest.raises(GeneratorError):
        LogitsGen.from_json(doc["inputs"]["logits"])


def test_labels_must_fit_the_generated_shape(small):
    inp = draw(TS.real_logits(), 1)[0]
    doc = Case("token_logprobs", "matches_reference", "float32", "real_shapes", inp).to_json()
    doc["inputs"]["labels"]["data"][0] = inp["logits"].vocab
    with pytest.raises(CaseError, match="outside the vocabulary"):
        Case.from_json(doc)


def test_generator_path_small(small):
    """Every real_shapes finding of the reference engine passes on the generator path (chunked: 2 rows a chunk)."""
    ref = load_engine("reference", None)
    for inp in draw(TS.real_logits(), 2):
        for op in TOKEN_OPS:
            for dtype in ("bfloat16", "float32"):
                for prop in PROPS:
                    out = run_check(ref, Case(op, prop, dtype, "real_shapes", inp))
                    assert out.ok, (op, dtype, prop, out.message)


def test_generator_path_catches_a_wrong_engine(small):
    """The chunked comparison sees an error in any chunk (here: the last row's gradient of a wrong entropy)."""
    from rlconform.harness.bindings.reference import binding as reference
    from rlconform.harness.catalog.binding import Binding

    def entropy(logits):
        h = reference.ops["entropy"](logits)
        bump = torch.zeros_like(h)
        bump[-1] = 1.0
        return h + bump * (logits[..., 0] - logits[..., 0].detach())  # right value, wrong gradient in the last row

    wrong = Binding(name="wrong", ops=dict(reference.ops, entropy=entropy))
    inp = draw(TS.real_logits(), 1)[0]
    out = run_check(wrong, Case("entropy", "matches_reference", "float32", "real_shapes", inp))
    assert not out.ok and "gradient (rows" in out.message


def test_split_vocab_mutant_is_caught_only_at_real_vocab(monkeypatch):
    """mutants.split_vocab_bf16_workspace: exact below its 32 768-entry tile (every CI regime, and V = 4096
    here), off by ~1e-3 at V = 151 936 / 128 256 (1 row: seconds). The reference passes the same cases."""
    mutant = load_engine("mutants.split_vocab_bf16_workspace", None)
    ref = load_engine("reference", None)
    monkeypatch.setattr(TS, "REAL_ROWS", (1,))
    for inp in draw(TS.real_logits(), 2):
        assert inp["logits"].vocab in (151936, 128256)
        for op in ("logsumexp", "entropy"):
            case = Case(op, "matches_reference", "float32", "real_shapes", inp)
            assert run_check(ref, case).ok
            out = run_check(mutant, case)
            assert not out.ok and out.ratio > 4, out.message
    monkeypatch.setattr(TS, "REAL_VOCABS", (4096,))
    inp = draw(TS.real_logits(), 1)[0]
    for op in ("logsumexp", "entropy"):
        assert run_check(mutant, Case(op, "matches_reference", "float32", "real_shapes", inp)).ok


# --- reductions: > 2^24 tokens, sequences up to 32 768 ------------------------------------------------


def test_real_reduction_cases_exceed_2_to_the_24_tokens():
    """Every drawn real_shapes reduction case has > 2^24 unmasked tokens in rows of ≤ 32 768 (computed from
    the description: nothing is materialised)."""
    for inp in draw(RD.real_inputs(), 20):
        gen = inp["tokens"]
        assert gen.nnz() > 1 << 24 and gen.shape[1] in (32768, 8192) and gen.shape[1] <= 32768


def test_reduction_generator_path_small(monkeypatch, tmp_path):
    monkeypatch.setattr(RD, "REAL_SEQUENCES", (64, 17))
    monkeypatch.setattr(RD, "REAL_MIN_TOKENS", 500)
    ref = load_engine("reference", None)
    mutant = load_engine("mutants.fp32_token_counter", None)  # exact below 2^24 tokens
    for inp in draw(RD.real_inputs(), 2):
        gen = inp["tokens"]
        values, mask = gen.materialise("bfloat16")
        assert values.shape == gen.shape and int(mask.sum()) == gen.nnz() > 500
        assert np.array_equal(values, torch.from_numpy(values).to(torch.bfloat16).double().numpy())
        for op in [o for o in OPS if OPS[o].family == "reductions"]:
            for dtype in ("bfloat16", "float32"):
                for prop in ("matches_reference", "non_destructive", "finite_where_reference_finite"):
                    case = Case(op, prop, dtype, "real_shapes", inp)
                    assert run_check(ref, case).ok, (op, dtype, prop)
                    if op in ("masked_count", "masked_mean"):
                        assert run_check(mutant, case).ok, (op, dtype, prop)
        path = tmp_path / "case.json"
        save_case(Case("masked_mean", "matches_reference", "float32", "real_shapes", inp), path)
        assert path.stat().st_size < 2000 and load_case(path).inputs["tokens"] == gen


def test_fp32_token_counter_mutant_is_the_saturating_counter():
    """The mutant's count is what a float32 counter incremented by 1.0 per token reaches (checked with
    float16, whose counter saturates at 2^11, by incrementing it token by token)."""
    from rlconform.harness.mutants import fp32_token_counter as M

    assert float(np.float32(M.SATURATION) + np.float32(1.0)) == M.SATURATION
    c = np.float16(0)
    for _ in range(2100):
        c = np.float16(c + np.float16(1))
    assert float(c) == 2048.0  # the same saturation one level down: 2^11 for float16's 11-bit significand
    mask = torch.ones(3, 5, dtype=torch.bool)
    assert float(M.masked_count(mask)) == 15.0


def test_metric_pipeline_generator_path_small(monkeypatch):
    """metric_pipeline real_shapes at a small size (the test hook): the reference pipeline passes every
    property on the generated batch split by nested partitions."""
    monkeypatch.setattr(RD, "REAL_SEQUENCES", (64,))
    monkeypatch.setattr(RD, "REAL_MIN_TOKENS", 600)
    from rlconform.harness.catalog.ops import strategy_for

    ref = load_engine("reference", None)
    for inp in draw(strategy_for("metric_pipeline", "float32", "real_shapes"), 2):
        assert isinstance(inp["tokens"], TokensGen)
        for prop in OPS["metric_pipeline"].properties:
            case = Case("metric_pipeline", prop, "float32", "real_shapes", inp)
            assert run_check(ref, case).ok, prop


# --- vocab-parallel shards under TP = 2 ---------------------------------------------------------------


def test_vocab_parallel_generator_path_small(monkeypatch):
    """tp2_real_shapes at a small V (the test hook): the shards of a generated tensor on 2 gloo ranks."""
    from rlconform.distributed_tests.checks import run_check as run_distributed
    from rlconform.harness.catalog.ops import strategy_for
    from rlconform.harness.workers.pool import close_all_pools

    monkeypatch.setattr(TS, "REAL_VOCABS", (1000,))
    ref = load_engine("reference", None)
    try:
        for op in ("vocab_parallel_entropy", "vocab_parallel_token_logprobs"):
            inp = draw(strategy_for(op, "float32", "tp2_real_shapes"), 1)[0]
            assert isinstance(inp["logits"], LogitsGen) and inp["vocab"] == 1000
            for prop in ("matches_reference", "partition_invariant", "non_destructive"):
                out = run_distributed(ref, Case(op, prop, "float32", "tp2_real_shapes", inp))
                assert out.ok, (op, prop, out.message)
    finally:
        close_all_pools()


@pytest.mark.cli
def test_check_under_ci_has_no_real_shapes(tmp_path):
    """`rlconform check --profile ci --regime real_shapes` selects nothing: a usage error naming the profile."""
    proc = forked_cli.run(["check", "--engine", "reference",
                           "--profile", "ci", "--regime", "real_shapes", "--op", "entropy", "--out", str(tmp_path)],
                          timeout=300)
    assert proc.returncode == 2 and "another --profile" in proc.stderr, proc.stderr


class _State:
    def __init__(self, out, max_examples):
        self.settings = settings(max_examples=max_examples, database=None, deadline=None,
                                 suppress_health_check=list(HealthCheck))
        self.corpus, self.seed, self.out, self.xfails, self.inflight = None, None, out, {}, None
        self.binding = type("B", (), {"spec": "fake", "path": None, "resolve": lambda self, op: None})()

    def shrink_budget(self, finding_id):
        return None  # nightly: no limit, except what the regime itself says


@pytest.mark.parametrize("fails", [False, True])
def test_run_finding_gives_real_shapes_two_examples_and_no_shrinking(small, tmp_path, fails):
    """Under the nightly profile (500 examples, unlimited shrinking) a real_shapes finding runs 2 examples
    (derandomized: the same two every run) and a failure is reported as found, not shrunk."""
    from rlconform.harness.run.recorder import FindingRecorder
    from rlconform.properties import runner
    from rlconform.properties.checks import PropertyFailure
    from rlconform.properties.generic import Outcome

    seen = []

    def check(binding, case):
        seen.append(case.inputs["logits"])
        return Outcome(not fails, "wrong" if fails else "", ratio=20.0 if fails else 0.25)  # beyond / below the margin band

    fid = ("entropy", "matches_reference", "float32", "real_shapes")
    for attempt in range(2):
        state = _State(str(tmp_path), 500)
        rec = FindingRecorder(state, ".".join(fid))
        if fails:
            with pytest.raises(PropertyFailure):
                runner.run_finding(state.binding, fid, rec, state, TS.real_logits(), check=check)
            assert rec.examples == 1 and rec.shrink_steps == 0
        else:
            runner.run_finding(state.binding, fid, rec, state, TS.real_logits(), check=check)
            assert rec.examples == 2
    half = len(seen) // 2
    assert seen[:half] == seen[half:]  # derandomized
