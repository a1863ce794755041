"""A run's findings do not depend on where the engine lives, the --out folder or the working directory. The same binding file, copied to two folders, checked from two working directories into two
report folders, gives the same findings: same examples, same numbers, same verdicts.

Hypothesis mixes the literals of "local" modules (outside site-packages, and not under a folder named
``tests``) into generation; a binding under ``…/tests/`` contributes none, the same file under
``…/fork/`` does. :func:`rlconform.harness.core.determinism.pin_generation` makes both draw the same examples.
"""

from __future__ import annotations

import json

import forked_cli
import pytest

pytestmark = pytest.mark.slow

# a naive fp32 entropy (cancellation at large offsets: fails near_uniform_offset) with many literals, the
# kind hypothesis would pick up as local constants
BINDING = '''
import torch
from rlconform.harness.catalog.binding import Binding

TABLE = [11, 97, 1013, 40961, 65537, 123457, 7654321, 2147483647, 3.25, 17.5, 1e4, -5e3, 0.001]


def entropy(logits):
    x = logits.float()
    p = torch.softmax(x, dim=-1)
    return (torch.logsumexp(x, dim=-1) - (p * x).sum(dim=-1)).to(logits.dtype)


binding = Binding(name="naive", ops={"entropy": entropy})
'''

#: what may differ between two places: where the reproducer was written, the traceback's paths, and the
#: seconds the finding took (``cost_s``, what ``--shard`` balances: a measurement, not a verdict)
LOCATION_FIELDS = ("reproducer", "traceback", "cost_s")


def _run(binding, out, cwd):
    args = ["check", "--engine", str(binding), "--op", "entropy",
            "--dtype", "float32", "--property", "matches_reference", "--max-examples", "12", "--out", str(out), "-q"]
    return forked_cli.run(args, timeout=900, cwd=cwd)  # the engine's examples are drawn in a fresh worker


def _findings(out):
    doc = json.loads((out / "report.json").read_text())
    return {f["id"]: {k: v for k, v in f.items() if k not in LOCATION_FIELDS} for f in doc["findings"]}


@pytest.mark.cli
def test_same_binding_in_two_folders_gives_the_same_findings(tmp_path):
    places = {}
    for name, folder in (("a", tmp_path / "tests" / "engine"), ("b", tmp_path / "fork" / "engine")):
        folder.mkdir(parents=True)
        (folder / "naive_binding.py").write_text(BINDING)
        cwd = tmp_path / f"cwd-{name}"
        cwd.mkdir()
        r = _run(folder / "naive_binding.py", tmp_path / f"out-{name}" / "report", cwd)
        assert r.returncode in (0, 1), r.stdout[-2000:] + r.stderr[-2000:]
        places[name] = _findings(tmp_path / f"out-{name}" / "report")
    a, b = places["a"], places["b"]
    assert a.keys() == b.keys() and len(a) >= 4
    assert any(f["status"] == "discrepancy" for f in a.values()), "the naive entropy should fail somewhere"
    for fid in a:
        assert a[fid] == b[fid], f"{fid} differs between the two folders"


@pytest.mark.cli
@pytest.mark.engines
def test_byte_identical_copy_of_verl_gives_the_same_findings(tmp_path):
    """The issue's reproduction: verl checked as installed and from a byte-identical copy on
    ``--engine-path``. Without the pin, ``token_logprobs.matches_reference.float32.neg_inf_padded`` drew
    other examples from the 8th on (worst error / tolerance 0.535 vs 0.760)."""
    import importlib.util
    import shutil

    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("verl is not installed (bash install/engines.sh .venv/bin/python verl)")
    copy = tmp_path / "copy"
    shutil.copytree(list(spec.submodule_search_locations)[0], copy / "verl",
                    ignore=shutil.ignore_patterns("__pycache__"))
    found = {}
    for name, extra in (("installed", []), ("copy", ["--engine-path", str(copy)])):
        # the regime that drew other examples (its implementations' findings too), with the CI profile's examples
        args = ["check", "--engine", "verl", "--op", "token_logprobs",
                "--dtype", "float32", "--property", "matches_reference", "--regime", "neg_inf_padded",
                "--out", str(tmp_path / name), "-q", *extra]
        r = forked_cli.run(args, timeout=900, cwd=tmp_path)
        assert r.returncode in (0, 1), r.stdout[-2000:] + r.stderr[-2000:]
        found[name] = _findings(tmp_path / name)
    assert len(found["installed"]) >= 3 and found["installed"] == found["copy"]
