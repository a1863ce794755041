"""``rlconform explain`` and the standalone reproducers.

The scripts of verl's defects are generated from the committed ``reports/verl-0.9.1/`` (defects found by engine
function and failure class, the script's member chosen by explain among the defect's member findings, never by
id text). All of them run in one subprocess of a venv holding only torch, verl, megatron-core and their
dependencies (symlinked from this environment, no network; about 2 s to build), where rlconform cannot be
imported (runpy, so torch and verl are imported once): each exits 1 against verl
as installed and prints the engine's and the exact value; then five run again with the engine function replaced
by a correct stand-in (geo_mean's micro-batch scaling, an entropy
that handles bf16 and −inf logits, the loop RLOO that follows verl's singleton convention, a masked mean that
selects) and exit 0.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys

import pytest

from rlconform.harness.cli import main
from rlconform.harness.report.explain import (
    NO_SCRIPT,
    explain_markdown,
    find_defect,
    read_case,
    script_member_id,
    scripted_member,
    standalone_script,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPORT = os.path.join(ROOT, "reports", "verl-0.9.1")

pytestmark = pytest.mark.skipif(not os.path.exists(os.path.join(REPORT, "report.json")),
                                reason="the committed verl report is not in this checkout")

#: name -> (failure class, engine functions): verl's defects whose standalone script must exist and exit 1
SCRIPTED = {
    "geo_mean": ("partition dependence", {"compute_policy_loss_geo_mean"}),
    "agg_loss_wrong": ("wrong value", {"agg_loss"}),
    "agg_loss_nan": ("NaN / inf", {"agg_loss"}),
    "entropy_bf16": ("wrong value", {"entropy_from_logits"}),
    "entropy_neg_inf": ("NaN / inf", {"entropy_from_logits"}),
    # entropy_from_logits_with_chunking's bf16 "wrong value" (0 vs 1.4e-5 from logits of 266) is ulp-level at the
    # input's scale (severity.ulp_level): its module's rounding, no defect to script
    "entropy_chunked_neg_inf": ("NaN / inf", {"entropy_from_logits_with_chunking"}),
    "sum_pi_squared_bf16": ("wrong value", {"calculate_sum_pi_squared_from_logits"}),
    "rloo_vectorized_singleton": ("wrong value", {"compute_rloo_vectorized_outcome_advantage"}),
    "grpo_vectorized": ("wrong value", {"compute_grpo_vectorized_outcome_advantage"}),
    # the policy loss's fractions marked MEAN by ppo_loss, averaged unweighted over micro-batches and DP ranks
    "dp_mean_of_means": ("partition dependence", {"ppo_loss"}),
    "cp_masked_mean_nan": ("NaN / inf", {"distributed_masked_mean"}),
    "gae_nan": ("NaN / inf", {"compute_gae_advantage_return"}),
    "rejection_mask_bounds": ("wrong value", {"compute_rollout_correction_and_rejection_mask",
                                              "compute_rollout_rejection_mask"}),
}
# _VocabParallelEntropy.backward's write into the logits it saved is no defect: a precondition verl declares (its
# only caller clones the logits and computes Σπ² first), explained by its card (tests/test_declared.py)
#: the scripts that also run against a correct stand-in of the engine function (PRELUDE's FIXES)
FIXED = ("geo_mean", "entropy_bf16", "entropy_neg_inf", "rloo_vectorized_singleton",
         "cp_masked_mean_nan")


@pytest.fixture(scope="module")
def doc():
    with open(os.path.join(REPORT, "report.json")) as f:
        return json.load(f)


def _candidates(doc, name):
    cls, functions = SCRIPTED[name]
    return [d for d in doc["defects"] if d["signature"]["kind"] == cls
            and (d.get("engine_function") or {}).get("function") in functions and d["severity"] != "precision"]


def _defect(doc, name):
    """The defect of ``name`` (the first with a script when the grouping splits it)."""
    found = _candidates(doc, name)
    if not found:
        pytest.fail(f"no {name} defect {SCRIPTED[name]} in the committed report")
    return next((d for d in found if standalone_script(doc, d, REPORT)[0] is not None), found[0])


def _imports(text: str) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            out.add((node.module or "").split(".")[0])
    return out


@pytest.fixture(scope="module")
def scripts(doc):
    out = {}
    for name in SCRIPTED:
        d = _defect(doc, name)
        text, why = standalone_script(doc, d, REPORT)
        assert text is not None, f"{name}: {why}"
        out[name] = text
    return out


def test_scripts_import_only_torch_the_engine_and_the_standard_library(scripts):
    allowed = set(sys.stdlib_module_names) | {"torch", "verl", "megatron"}
    for name, text in scripts.items():
        imported = _imports(text)
        # numpy only where verl's own call needs it (the trainer's uids are a NumPy object array)
        extra = {"numpy"} if name in ("rloo_vectorized_singleton", "grpo_vectorized") else set()
        assert imported <= allowed | extra, (name, imported - allowed)
        assert "rlconform" not in imported, name
        assert "sys.exit(main())" in text, name


def test_script_embeds_the_smallest_input_bit_for_bit(doc, scripts):
    d = _defect(doc, "geo_mean")
    case = read_case(REPORT, d)
    namespace: dict = {}
    tree = ast.parse(scripts["geo_mean"])
    inputs = next(n for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "INPUTS")
    exec(compile(ast.Module([inputs], []), "<inputs>", "exec"), namespace)
    got = namespace["INPUTS"]["log_prob"]
    assert got["shape"] == case["inputs"]["log_prob"]["shape"]
    assert [h for row in got["values"] for h in row] == case["inputs"]["log_prob"]["hex"]
    assert namespace["INPUTS"]["partitions"] == case["inputs"]["partitions"]


def _crash_defect(doc):
    return next(d for d in doc["defects"] if d["signature"]["kind"].startswith("crash"))


def test_a_defect_without_templatable_member_says_so_in_one_line(doc):
    d = _crash_defect(doc)
    text, why = standalone_script(doc, d, REPORT)
    assert text is None and why.startswith(f"none of its {len(d['members'])} member finding")
    assert "\n" not in why
    md = explain_markdown(doc, d, read_case(REPORT, d), REPORT)
    assert f"**Standalone script:** {NO_SCRIPT} (none of its" in md and "```python" not in md


def test_the_script_reproduces_a_member_when_the_representative_case_has_no_template(doc, scripts):
    # the mean-of-means row's representative is a finding of another op (the step's or the policy loss's), a case
    # no template is written for; its script is the smallest metric_pipeline partition member
    from rlconform.harness.report.explain import _template

    d = _defect(doc, "dp_mean_of_means")
    rep = next(f for f in doc["findings"] if f["id"] == d["reproducer"]["finding"])
    assert isinstance(_template(rep, read_case(REPORT, d)), str), "the representative has a template"
    member = script_member_id(scripts["dp_mean_of_means"])
    assert member in d["members"] and member != d["reproducer"]["finding"]
    assert member.startswith("metric_pipeline.partition_invariant.")
    md = explain_markdown(doc, d, read_case(REPORT, d), REPORT)
    assert f"**Standalone script** of member `{member}`" in md


def test_selection_skips_members_without_template_or_case_and_prefers_the_smallest(doc, tmp_path):
    import shutil

    d = _defect(doc, "entropy_neg_inf")
    by_id = {f["id"]: f for f in doc["findings"]}
    crash = by_id[_crash_defect(doc)["reproducer"]["finding"]]
    members = [m for m in d["members"] if m.startswith("entropy.finite_where_reference_finite.")]
    (tmp_path / "cases").mkdir()
    for fid in [crash["id"], *members]:
        rel = by_id[fid]["reproducer"]["case_file"]
        shutil.copy(os.path.join(REPORT, rel), tmp_path / rel)
    gone = dict(by_id[members[0]], reproducer={"case_file": "cases/missing.json"})
    synthetic = dict(doc, findings=[crash, gone, *(by_id[m] for m in members[1:])],
                     defects=[dict(d, reproducer=dict(crash["reproducer"], finding=crash["id"]),
                                   members=[crash["id"], *members])])
    f, case, _ = scripted_member(synthetic, synthetic["defects"][0], str(tmp_path))
    sizes = {m: len(json.dumps(read_case(REPORT, by_id[m])["inputs"])) for m in members[1:]}
    assert f["id"] in members[1:] and case["op"] == "entropy"
    assert sizes[f["id"]] == min(sizes.values())


def test_explain_markdown_has_every_part(doc):
    import re

    d = _defect(doc, "geo_mean")
    case = read_case(REPORT, d)
    md = explain_markdown(doc, d, case, REPORT)
    # the numbers as the finding's own message states them (2 micro-batches vs the exact value), 9 digits
    rep = next(f for f in doc["findings"] if f["id"] == d["reproducer"]["finding"])
    engine, exact = re.search(r"loss = (\S+) vs loss = \S+ at flat index 0 \(reference ([^,]+),", rep["message"]).groups()
    numbers = (f"{float(engine):.9g}", f"{float(exact):.9g}")
    for part in ("compute_policy_loss_geo_mean", "verl/trainer/ppo/core_algos.py:", "more than one micro-batch",
                 *numbers, "rlconform replay", "```python", case["inputs"]["log_prob"]["hex"][0]):
        assert part in md, part


@pytest.mark.cli
def test_unknown_id_is_one_line_and_exit_2(capsys):
    assert main(["explain", "verl.no.such.defect", "--report", REPORT]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "closest:" in err and "verl." in err.split("closest:")[1]


def test_a_unique_prefix_is_accepted(doc):
    d = _defect(doc, "geo_mean")
    assert find_defect(doc, d["id"][:-8]) is d or find_defect(doc, d["id"][:-8])["id"] == d["id"]


@pytest.mark.cli
def test_script_flag_writes_only_the_script(doc, tmp_path, capsys):
    d = _defect(doc, "agg_loss_wrong")
    out = tmp_path / "repro.py"
    assert main(["explain", d["id"], "--report", REPORT, "--script", str(out)]) == 0
    text = out.read_text()
    assert text.startswith("#!/usr/bin/env python3") and "from verl.trainer.ppo.core_algos import agg_loss" in text
    compile(text, str(out), "exec")


@pytest.mark.cli
def test_script_flag_on_a_kind_without_template_is_exit_2(doc, tmp_path, capsys):
    d = _crash_defect(doc)
    assert main(["explain", d["id"], "--report", REPORT]) == 0  # explained, with the line in place of a script
    assert NO_SCRIPT in capsys.readouterr().out
    assert main(["explain", d["id"], "--report", REPORT, "--script", str(tmp_path / "x.py")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and NO_SCRIPT in err
    assert not (tmp_path / "x.py").exists()


@pytest.mark.cli
def test_ambiguous_prefix_and_a_case_path_leaving_the_folder_are_exit_2(doc, tmp_path, capsys):
    assert main(["explain", "verl.", "--report", REPORT]) == 2
    assert "ambiguous" in capsys.readouterr().err
    d = dict(_defect(doc, "geo_mean"), reproducer={"case_file": "../../etc/passwd"})
    with pytest.raises(ValueError, match="not a path inside the report folder"):
        read_case(REPORT, d)


def _small_doc(doc, name):
    d = _defect(doc, name)
    members = set(d["members"])
    return dict(doc, defects=[d], findings=[f for f in doc["findings"] if f["id"] in members])


def test_report_pages_carry_the_explain_text_and_line(doc):
    import base64
    import gzip
    import re

    from rlconform.harness.report.html_report import render_html
    from rlconform.harness.report.writer import render_markdown

    small = _small_doc(doc, "geo_mean")
    html = render_html(small, REPORT)
    blob = re.search(r'id="explain-data">([^<]*)</script>', html).group(1)
    texts = json.loads(gzip.decompress(base64.b64decode(blob)))
    assert list(texts) == ["D1"] and 'id="explain-D1"' in html and "and standalone script" in html
    assert "```python" in texts["D1"] and "compute_policy_loss_geo_mean" in texts["D1"]
    md = render_markdown(small)
    assert f"`rlconform explain {small['defects'][0]['id']} --report reports/verl-0.9.1`" in md


# The subprocess, in a venv of torch and verl only (:func:`engine_only_venv`; a meta-path blocker besides, should
# any rlconform folder be reachable): every script runs as __main__ against verl as installed, then FIXED ones
# again with the engine function replaced by a correct stand-in.
PRELUDE = r"""
import importlib.abc, json, os, runpy, sys
BLOCKED = ("rlconform", "harness", "reference", "properties", "distributed_tests")
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(name + " is blocked in this test")
sys.meta_path.insert(0, Block())
def run(name):
    path = os.path.join(sys.argv[1], name + ".py")
    sys.argv[1:] = [sys.argv[1]]  # the script's own argv: none
    print("=== " + name, flush=True)
    saved, sys.argv = sys.argv, [path]
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as exc:
        return exc.code
    finally:
        sys.argv = saved
    return None
names = json.loads(sys.argv[2])
codes = {n: run(n) for n in names["all"]}

import torch
from verl.trainer.ppo import core_algos
from verl.utils import torch_functional as verl_F
buggy_geo = core_algos.POLICY_LOSS_REGISTRY["geo_mean"]
def geo_mean(*args, **kw):
    # the fix: a micro-batch's mean over its rows, weighted by its share of the mini-batch's rows
    loss, metrics = buggy_geo(*args, **kw)
    return loss * kw["response_mask"].shape[0] / kw["config"].global_batch_info["global_batch_size"], metrics
def entropy(logits):
    # float32, a -inf logit contributes 0 (log p taken where p > 0 only)
    x = logits.float()
    p, logp = torch.softmax(x, -1), torch.log_softmax(x, -1)
    return -(p * torch.where(p > 0, logp, torch.zeros_like(logp))).sum(-1).to(logits.dtype)
buggy_mean = verl_F.distributed_masked_mean
def masked_mean(t, m):
    return buggy_mean(torch.where(m.bool(), t, torch.zeros_like(t)), m)
core_algos.POLICY_LOSS_REGISTRY["geo_mean"] = geo_mean
core_algos.ADV_ESTIMATOR_REGISTRY["rloo_vectorized"] = core_algos.compute_rloo_outcome_advantage
verl_F.entropy_from_logits = entropy
verl_F.distributed_masked_mean = masked_mean
fixed = {n: run(n) for n in names["fixed"]}
assert not any(m.split(".")[0] in BLOCKED for m in sys.modules), "rlconform was imported"
print("CODES " + json.dumps({"engine": codes, "fixed": fixed}))
"""


#: the distributions the engine-only venv starts from: torch, the engine, and what the project's install recipe
#: installs for it (install/verl.txt, install/megatron.txt: what verl imports on CPU, omegaconf included, which
#: verl does not declare); their declared dependencies are added
ENGINE_ROOTS = ("torch", "verl", "megatron-core")
RECIPES = ("verl.txt", "megatron.txt")


def engine_only_venv(dest) -> str:
    """A venv at ``dest`` whose site-packages holds torch, verl, megatron-core and their dependencies only
    (symlinks to their installed top-level entries, dist-info included; no .pth file, so no editable finder:
    rlconform cannot be imported there). Returns its python."""
    import importlib.metadata as md

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(dest)], check=True)
    site = os.path.join(str(dest), "lib", f"python{sys.version_info[0]}.{sys.version_info[1]}", "site-packages")
    todo = list(ENGINE_ROOTS)
    for recipe in RECIPES:
        with open(os.path.join(ROOT, "install", recipe)) as f:
            todo += [Requirement(line.split("#")[0].strip()).name for line in f if line.split("#")[0].strip()]
    seen = {}
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen:
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:  # an optional dependency not installed here
            continue
        seen[name] = dist
        for r in dist.requires or ():
            req = Requirement(r)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    assert "rlconform" not in seen
    for dist in seen.values():
        for top in {f.parts[0] for f in dist.files or ()}:
            if top in ("..", "__pycache__") or top.endswith(".pth"):
                continue
            target = os.path.join(site, top)
            if not os.path.lexists(target):
                os.symlink(str(dist.locate_file(top)), target)
    return os.path.join(str(dest), "bin", "python")


@pytest.mark.engines
@pytest.mark.slow
def test_scripts_exit_1_in_a_venv_of_torch_and_verl_only_and_0_once_fixed(scripts, tmp_path, doc):
    scripts_doc = doc
    pytest.importorskip("verl")
    python = engine_only_venv(tmp_path / "venv")
    probe = subprocess.run([python, "-c", "import rlconform"], capture_output=True, text=True)
    assert probe.returncode == 1 and "No module named 'rlconform'" in probe.stderr, probe.stderr
    for name, text in scripts.items():
        (tmp_path / f"{name}.py").write_text(text)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    names = json.dumps({"all": list(scripts), "fixed": list(FIXED)})
    proc = subprocess.run([python, "-I", "-c", PRELUDE, str(tmp_path), names], capture_output=True,
                          text=True, env=env, cwd=tmp_path, timeout=600)
    out = proc.stdout
    assert proc.returncode == 0, (out[-3000:], proc.stderr[-3000:])
    codes = json.loads(out.rsplit("CODES ", 1)[1])
    assert codes["engine"] == {n: 1 for n in scripts}, out
    assert codes["fixed"] == {n: 0 for n in FIXED}, out
    runs = out.split("=== ")[1:]
    broken = {r.split("\n", 1)[0]: r for r in runs[:len(scripts)]}
    repaired = {r.split("\n", 1)[0]: r for r in runs[len(scripts):]}
    for name, text in broken.items():
        assert "DEFECT: " in text, (name, text)
        assert " vs exact " in text, (name, text)  # both numbers, on one line
    assert "engine -1.66606292" in broken["geo_mean"] and "vs exact -0.83303146" in broken["geo_mean"]
    # the bf16 entropy script's numbers are its member's, as the report's finding states them
    import re

    member = next(f for f in scripts_doc["findings"] if f["id"] == script_member_id(scripts["entropy_bf16"]))
    e, r = re.search(r"value: engine (\S+) vs reference (\S+) at flat index", member["message"]).groups()
    got_e, got_r = re.search(r"value: engine (\S+) vs exact (\S+)", broken["entropy_bf16"]).groups()
    # the engine's value bit for bit; the script's float64 formula and rlconform's reference agree to 1e-12
    assert float(got_e) == float(e) and abs(float(got_r) - float(r)) <= 1e-12 * abs(float(r)), (member["message"],
                                                                                              broken["entropy_bf16"])
    assert "value: engine nan vs exact 0.0" in broken["entropy_neg_inf"]
    assert "advantages: engine 0.0 vs exact 0.5" in broken["rloo_vectorized_singleton"]
    assert "kept mask: engine 1.0 vs exact 0.0" in broken["rejection_mask_bounds"]
    for name, text in repaired.items():
        assert "fixed: " in text and "DEFECT" not in text, (name, text)


@pytest.mark.cli
def test_a_folder_without_report_or_with_a_malformed_one_is_one_line(tmp_path, capsys):
    assert main(["explain", "x", "--report", str(tmp_path)]) == 2
    (tmp_path / "report.json").write_text("[" * 200_000)
    assert main(["explain", "x", "--report", str(tmp_path)]) == 2
    (tmp_path / "report.json").write_text(json.dumps({"findings": [], "defects": [{"id": "d", "reproducer": 7}]}))
    assert main(["explain", "d", "--report", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("rlconform: ") for line in err), err


def test_no_script_for_an_engine_the_templates_do_not_call(doc):
    d = _defect(doc, "agg_loss_wrong")
    other = dict(doc, engine=dict(doc["engine"], name="skyrl"))
    text, why = standalone_script(other, d, REPORT)
    assert text is None and "skyrl" in why


def test_the_script_shows_what_the_row_says(doc, scripts):
    """A member of the row's severity and trigger is scripted before a smaller one of another trigger (a verl
    the Dr. GRPO row's script showed a 1e-6 ε effect of a singleton-group member)."""
    by_id = {f["id"]: f for f in doc["findings"]}
    d = _defect(doc, "grpo_vectorized")
    others = [m for m in d["members"] if by_id[m].get("trigger") != d["trigger"]]
    assert others, "the row holds members of another trigger: the choice is not vacuous"
    member = by_id[script_member_id(scripts["grpo_vectorized"])]
    assert member["trigger"] == d["trigger"] and member["severity"] == d["severity"], member["id"]
