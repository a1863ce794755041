"""Every finding id of the catalog is understood by every parser of finding ids (the xfails ledger, the
pytest plugin's node ids, case file names), and the ledgers committed under reports/ parse. A regime
``variant@data`` (e.g. ``seq-mean-token-mean@imbalanced_partitions``) once made the committed verl ledger
"malformed", so `make check-verl` stopped at exit 2, and left variant findings out of the completeness
check of a run."""

from __future__ import annotations

import glob
import os
import re

import pytest

from rlconform.harness.catalog.ops import OPS
from rlconform.harness.core.opinfo import FINDING_ID
from rlconform.harness.report.xfails import parse_ledger, parse_xfails
from rlconform.harness.run import outdir, pytest_plugin

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALL_IDS = [f"{op.name}.{prop}.{dtype}.{regime}" for op in OPS.values() for prop, dtype, regime in op.findings()]


def test_catalog_has_variant_findings():
    assert any("@" in fid for fid in ALL_IDS) and any("-" in fid.split(".")[3] for fid in ALL_IDS)


def test_every_parser_reads_every_finding_id():
    pattern = re.compile(FINDING_ID)
    for fid in ALL_IDS:
        m = pattern.fullmatch(fid)
        assert m and ".".join(m.groups()) == fid, fid
        node = f"tests/test_generic.py::test_property[{fid}]"
        assert pytest_plugin._FID.search(node).group(1) == fid, fid
        assert outdir._CASE_FILE.match(fid + ".json"), fid


def test_a_ledger_of_every_finding_parses(tmp_path):
    ledger = tmp_path / "xfails.txt"
    ledger.write_text("".join(f"{fid}  # listed\n" for fid in ALL_IDS))
    assert len(parse_xfails(str(ledger))) == len(ALL_IDS)


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(ROOT, "reports", "*", "xfails.txt"))))
def test_committed_ledgers_parse(path):
    assert parse_ledger(path), f"{path} lists nothing"  # defect lines and finding ids
