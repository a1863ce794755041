"""``explain``'s standalone scripts embed report and case values as text or literals, never as source: a
report string that would close a docstring, open an f-string field or start a new line of code leaves the
script's syntax tree as it is with plain values (:func:`rlconform.harness.report.explain.script_text`)."""

from __future__ import annotations

import ast
import pathlib

import markupsafe
import pytest

from rlconform.harness.report import explain

TEMPLATES = pathlib.Path(explain.TEMPLATES)
HOSTILE = ('x"""\nimport os; os.system("touch /tmp/pwned")\n"""'
           "{__import__('os').system('touch /tmp/pwned')}\\\r\u2028#")
#: each kind template with every family template it is rendered with (explain._template)
PAIRS = [("vp_mutation.py.j2", None)] + [
    (kind, fam.name) for kind in ("kind_wrong_value.py.j2", "kind_partition.py.j2", "kind_nan.py.j2")
    for fam in sorted(TEMPLATES.glob("fam_*.py.j2"))]
#: values rlconform itself computes for the code contexts (not from a report)
OWN = {"tp": 2, "case_tp": 2, "norm": True, "chunked": False, "engine_fn": "entropy_from_logits",
       "stat": "entropy"}


def _context(text: str) -> dict:
    ctx = {k: text for k in ("engine", "version", "defect_id", "function", "site", "kind", "trigger", "prop", "op",
                             "dtype", "finding", "regime", "reference_src", "reference_doc", "partition_words",
                             "garbage", "estimator", "registry_name", "rs_option", "rs_threshold", "vp_function")}
    ctx["inputs"] = markupsafe.Markup(explain._literal({"logits": text, "mask": [1, 0]}))
    return {**ctx, **OWN}


def _shape(source: str) -> str:
    """The script's syntax tree with every constant's value blanked (what the values may change)."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant):
            node.value = None
    return ast.dump(tree)


@pytest.mark.parametrize("kind,family", PAIRS)
def test_hostile_report_strings_leave_every_scripts_syntax_tree_unchanged(kind, family):
    env = explain._environment()
    extra = {} if family is None else {"family_template": family}
    plain = env.get_template(kind).render(**_context("plain"), **extra)
    hostile = env.get_template(kind).render(**_context(HOSTILE), **extra)
    assert _shape(hostile) == _shape(plain)


def test_script_text_removes_every_character_that_ends_a_string():
    out = explain.script_text(HOSTILE)
    assert not set(out) & set('"\\{}\r\n\u2028')
