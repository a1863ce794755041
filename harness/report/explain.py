"""``rlconform explain DEFECT_ID --report DIR``: a defect as a maintainer pastes it upstream.

Reads a report folder (``report.json`` and its ``cases/``) and writes, as Markdown: the cause in one paragraph
(from the defect's failure kind, trigger, engine function and the property that failed), why it happens, how to
fix it and its impact on training (the binding's remedy, ``defects[].remedy``), the engine function
and ``file:line``, the smallest input (the case file of the defect's smallest reproducer), engine vs exact
numbers, the ``rlconform replay`` command, and a standalone script.

The standalone script reproduces the defect with plain PyTorch and the engine only (no rlconform import): it
embeds the smallest input bit for bit (floats as ``float.hex`` strings), calls the engine function as the
binding does (``harness/bindings/verl.py``), computes the exact value in float64 (the reference formula written
out, citing ``reference/``), prints both and exits 1 while the defect is there, 0 once it is gone. Scripts come
from jinja2 templates under ``templates/``: one per op family (the engine call and the exact value: agg_loss,
policy_loss geo_mean, metric_pipeline, entropy / Σπ², outcome_advantage grpo / drgrpo / rloo and their
vectorized implementations, gae, cp_masked_mean on a gloo world of one, the token_k1 rejection mask) and one per
failure kind (wrong value or NaN against the exact value, partition dependence: every partition run, NaN:
garbage at masked positions, mutation: digests and tensor versions before / after, on gloo TP ranks, one in
process unless the trigger needs TP > 1).

A defect groups member findings (however triage groups them); its script reproduces one member:
:func:`scripted_member` picks, among the members whose case a template is written for (chosen by the member's
op, property, failure kind and regime, never by the id's text), the smallest input. A defect none of whose
members has a template says so in one line ("no standalone script for this kind yet (none of its N member
findings is a case a template is written for; e.g. …)") instead of getting a wrong one: ``explain`` prints
that line in place of the script (exit 0), ``explain --script`` exits 2 with it.

The command itself is :mod:`rlconform.harness.report.explain_cmd`. Errors (:class:`ExplainError`, one line,
exit 2 there): no report, no ``defects`` in it, an unknown or ambiguous id
(with the closest ids), a case file outside the report folder or unreadable.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import re

from rlconform.harness.report import failure_fields as F

__all__ = ["ExplainError", "find_defect", "read_case", "explain_markdown", "standalone_script", "script_support",
           "scripted_member", "script_member_id",
           "explain_command", "explain_blob", "markdown_lines"]

TEMPLATES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "templates")
NO_SCRIPT = "no standalone script for this kind yet"

class ExplainError(ValueError):
    """A defect cannot be explained; the message is one line."""


# ------------------------------------------------------------------------------------------- lookup
def _defects(doc: dict, where: str) -> list[dict]:
    defects = doc.get("defects")
    if not isinstance(defects, list) or not defects:
        raise ExplainError(f"{where} lists no defects")
    return [d for d in defects if isinstance(d, dict) and isinstance(d.get("id"), str)]


def declared_card(doc: dict, key: str) -> str | None:
    """The card of a declared write named ``key`` (``engine.declared``: no defect, but a fork's caller
    needs the hazard): what the engine writes and why, its source and the caller that keeps it, whether it held
    in the engine the report ran and the findings that showed it; None when ``key`` names none."""
    for d in (doc.get("engine") or {}).get("declared") or ():
        if isinstance(d, dict) and d.get("name") == key and d.get("writes"):
            seen = sorted(f["id"] for f in doc.get("findings", []) if f.get("declared_write") == key)
            lines = [f"## Declared {d['kind']} `{key}` (not a defect)", "", d["what"], "",
                     f"**Why:** {d['reason']}", "", f"**Source:** `{d['source']}`"
                     + (f"; caller `{d['caller']}`" if d.get("caller") else ""), "",
                     f"**Hazard for a caller that does not keep it (a fork's):** {d.get('hazard') or d['what']}", "",
                     ("**Checked as declared:** " if d.get("holds") else "**Does NOT hold in the engine the report "
                      "ran; its findings are defects:** ") + str(d.get("evidence") or ""), ""]
            if seen:
                lines += [f"{len(seen)} finding(s) showed only this write ({', '.join(d['writes'])}, {d['phase']}, by "
                          f"{d['writer']}), e.g. `{seen[0]}`", ""]
            return "\n".join(lines)
    return None


def find_defect(doc: dict, key: str, where: str = "the report") -> dict:
    """The defect whose id is ``key``, or the only one whose id starts with ``key``. Raises
    :class:`ExplainError` naming the closest ids when there is none, or the candidates when several match."""
    defects = _defects(doc, where)
    ids = [d["id"] for d in defects]
    for d in defects:
        if d["id"] == key:
            return d
    starts = [d for d in defects if d["id"].startswith(key)] if key else []
    if len(starts) == 1:
        return starts[0]
    if len(starts) > 1:
        shown = ", ".join(d["id"] for d in starts[:3])
        raise ExplainError(f"defect id {key!r} is ambiguous in {where}: {len(starts)} ids start with it ({shown}"
                           f"{', …' if len(starts) > 3 else ''})")
    close = difflib.get_close_matches(key, ids, n=3, cutoff=0.0)
    raise ExplainError(f"no defect {key!r} in {where}; closest: {', '.join(close)}")


def read_case(folder: str, defect: dict) -> dict | None:
    """The case file of the defect's smallest reproducer (relative to the report folder), or None when the
    defect names none. Raises :class:`ExplainError` for a path that leaves the folder or a file that cannot
    be read as a case."""
    from rlconform.harness.core.safe_json import JsonFileError, load_object

    rep = defect.get("reproducer") or {}
    if not isinstance(rep, dict):
        raise ExplainError(f"defect {defect['id']}: reproducer is a {type(rep).__name__}, not an object")
    rel = rep.get("case_file")
    if not rel:
        return None
    if not isinstance(rel, str) or os.path.isabs(rel) or ".." in rel.replace("\\", "/").split("/"):
        raise ExplainError(f"defect {defect['id']}: case file {rel!r} is not a path inside the report folder")
    path = os.path.join(folder, rel)
    try:
        case = load_object(path)
    except JsonFileError as exc:
        raise ExplainError(f"defect {defect['id']}: {exc}") from None
    if not isinstance(case.get("inputs"), dict):
        raise ExplainError(f"defect {defect['id']}: {path} is not an rlconform case (no inputs)")
    return case


# ------------------------------------------------------------------------------------------- text
_KIND_WORDS = {
    "wrong value": "returns a value that differs from the exact (float64) value of the same input by more than "
                   "the dtype's rounding",
    "inexact value": "returns a value off the exact one by more than the dtype's rounding allows",
    "partition dependence": "gives a different result for the same rows depending on how they are split "
                            "(micro-batches, DP ranks, TP / CP shards), so the trained model depends on the "
                            "parallel layout",
    "masked-value dependence": "lets what the loss mask hides (a NaN or a large value at a masked position) "
                               "change its result at valid positions, so padding or a rejected token's garbage "
                               "reaches the loss or the metric",
    "mutation": "writes into a tensor its caller owns: afterwards the tensor no longer holds the bits it held "
                "(autograd's version counter moved), so a producer that saved it for its own backward fails or "
                "reads wrong values",
    "NaN": "returns NaN where the exact value is finite",
    "inf": "returns inf where the exact value is finite",
    "implementations disagree": "disagrees with the engine's other implementation of the same computation",
}

_PROPERTY_WORDS = {
    "matches_reference": "the float64 exact value of the same input",
    "partition_invariant": "the same batch computed in one piece",
    "mask_invariant": "the same input with other values at masked positions (padding must not change the result)",
    "non_destructive": "the caller's tensors, which must hold the same bits after the forward and the backward",
    "finite_where_reference_finite": "the exact value, which is finite here",
    "implementations_agree": "the engine's other implementation of the same op",
}


def _site(d: dict) -> str:
    site = d.get("crash_frame") or d.get("engine_function") or {}
    if not site:
        return f"op {d.get('op')}"
    if not d.get("crash_frame") and isinstance(site.get("fault"), dict) and site["fault"].get("line"):
        # the faulty line(s), then the function
        from rlconform.harness.report.triage import cited_text

        return cited_text(dict(site, function=f"{site.get('module', '')}.{site.get('function')}".lstrip(".")))
    return f"{site.get('module', '')}.{site.get('function')} ({site.get('file')}:{site.get('line')})".lstrip(".")


def _evidence(d: dict) -> str:
    """Why the Where line cites its line (:mod:`rlconform.harness.core.fault_lines`): `` — the line its
    failing example ran and a passing one went past (Ochiai 1 over 1 failing, 2 passing runs): `text` ``,
    the binding's declared line, or no single line; ``""`` for a crash frame or a site recorded without."""
    f = (d.get("engine_function") or {}).get("fault") if not d.get("crash_frame") else None
    if not isinstance(f, dict):
        return ""
    runs = f.get("runs") or {}
    text = f": `{f['text']}`" if f.get("text") else ""
    if f.get("evidence") == "spectrum":
        return (f" — the line its failing example ran and a passing one went past without (Ochiai {f.get('score')} "
                f"over {runs.get('failing', 0)} failing, {runs.get('passing', 0)} passing traced runs){text}")
    if f.get("evidence") == "anchor":
        return f" — the faulty line the binding declares (a pattern resolved in the installed source){text}"
    if not runs.get("failing") or not runs.get("passing"):
        why = ("no line was traced (its engine runs out of this process, or its code has no branch)"
               if not runs.get("failing") else "no passing example of the finding was drawn to contrast with")
    else:
        why = f"the traced examples ({runs['failing']} failing, {runs['passing']} passing) ran the same lines"
    return f" — no single line: {why}, and the binding declares none; the function is cited"


def _effect(d: dict) -> str:
    n = d.get("numbers") or {}
    e, x = n.get("engine"), n.get("exact")
    if not isinstance(x, (int, float)) or isinstance(x, bool):
        return ""
    text = f" On the smallest input the engine gives {_fmt(e)} where the exact value is {_fmt(x)}"
    if isinstance(e, (int, float)) and x and math.isfinite(e) and math.isfinite(x):
        text += f" ({e / x:.3g}× the exact value)"
    return text + "."


def _when(trig: str) -> str:
    """The trigger as a clause of the cause: ``on every input rlconform drew``, ``in a backward pass``, ``on
    fp32 input``, ``when the input has a −inf logit``."""
    if trig == "any input":
        return "on every input rlconform drew"
    if trig == "a backward pass":
        return "in a backward pass, on any input"
    if re.match(r"^(?:bf16|fp16|fp32|fp64)(?: or \w+)* input", trig):
        return f"on {trig}"
    return f"when the input has {trig}"


def cause(d: dict) -> str:
    """The cause in one paragraph, from the defect's kind, trigger, engine function, failed property and
    numbers."""
    kind = _kind(d) or "failure"
    fn = (d.get("engine_function") or {}).get("function") or f"op {d.get('op')}"
    trig = d.get("trigger") or (d.get("signature") or {}).get("feature") or "any input"
    if kind.startswith("crash"):
        exc = kind.split(":", 1)[1] if ":" in kind else "an exception"
        frame = d.get("crash_frame") or {}
        what = f"raises {exc}" + (f" in `{frame.get('function')}` ({frame.get('file')}:{frame.get('line')})"
                                  if frame else "") + " on an input its docstring allows"
    else:
        what = _KIND_WORDS.get(kind, kind)
    when = _when(trig)
    props = d.get("properties") or [d.get("property")]
    against = "; ".join(_PROPERTY_WORDS.get(p, p) for p in props if p)
    dtypes = ", ".join(d.get("dtypes") or [])
    n = len(d.get("members") or [])
    return (f"`{fn}` {what}, {when}.{_effect(d)} rlconform compared it with {against}. Severity "
            f"**{d.get('severity')}**: {n} finding{'s' if n != 1 else ''} ({', '.join(d.get('ops') or [d.get('op')])}; "
            f"{dtypes}) share this cause.")


def _remedy(d: dict) -> list[str]:
    """The binding's (or the idiom's) cause, fix and impact sentences (:mod:`rlconform.harness.report.remedies`),
    as lines; none for a report that records none."""
    r = d.get("remedy") or {}
    if not r.get("cause"):
        return []
    from rlconform.harness.report.remedies import changed_words

    warn = changed_words(r)
    return [*([f"**{warn[0].upper()}{warn[1:]}.**", ""] if warn else []), f"**Why:** {r['cause']}.", "",
            f"**Fix:** {r['fix']}.", "",
            *([f"**Impact on training:** {r['impact']}.", ""] if r.get("impact") else [])]


def _fmt(x) -> str:
    return f"{x:.9g}" if isinstance(x, float) else str(x)


def _numbers(d: dict) -> str:
    n = d.get("numbers")
    if not n:
        from rlconform.harness.report.triage_md import numbers_cell

        return numbers_cell(d) or "(the report records no numbers)"
    if n.get("sides"):  # two runs of the engine compared: each labelled
        (la, a), (lb, b) = n["sides"]
        comp = f"{n['component']}: " if n.get("component") else ""
        return f"{comp}{la} {_fmt(a)} vs {lb} {_fmt(b)}, exact {_fmt(n.get('exact'))} ({n.get('clause', '')})"
    comp = f"{n['component']}: " if n.get("component") else ""
    return f"{comp}engine {_fmt(n.get('engine'))} vs exact {_fmt(n.get('exact'))} ({n.get('clause', '')})"


#: characters of the smallest input shown in the Markdown (an upstream issue body holds 65 536); the script
#: and the case file hold all of it
INPUT_CHARS = 4000


def _case_input(case: dict | None, d: dict) -> str:
    if case is None:
        return (d.get("reproducer") or {}).get("input") or "(no case file)"
    text = json.dumps({"op": case.get("op"), "property": case.get("property"), "dtype": case.get("dtype"),
                       "regime": case.get("regime"), "inputs": case["inputs"]})
    if len(text) > INPUT_CHARS:
        rel = (d.get("reproducer") or {}).get("case_file")
        text = text[:INPUT_CHARS] + f" … ({len(text) - INPUT_CHARS} more characters in the report's {rel})"
    return text


def explain_command(d: dict) -> str:
    """``rlconform explain ID --report DIR``, DIR read from the reproducer command (``DIR/cases/…``)."""
    cmd = (d.get("reproducer") or {}).get("command") or ""
    m = re.search(r"replay (\S+?)/cases/", cmd)
    return f"rlconform explain {d['id']} --report {m.group(1) if m else 'DIR'}"


def explain_markdown(doc: dict, d: dict, case: dict | None, folder: str | None = None) -> str:
    """The Markdown a maintainer pastes into an upstream issue (``case``: the case of the defect's reproducer;
    ``folder``: the report folder, where the script's member case is read; None: no script)."""
    return _explain(doc, d, case, folder)[0]


def _explain(doc: dict, d: dict, case: dict | None, folder: str | None) -> tuple[str, bool]:
    """(:func:`explain_markdown`'s text, whether it holds a standalone script)."""
    eng = doc.get("engine") or {}
    script, why = standalone_script(doc, d, folder) if folder is not None else (None, "no report folder")
    rep = d.get("reproducer") or {}
    lines = [f"### {eng.get('name', 'engine')} {eng.get('version') or ''}: `{(d.get('engine_function') or {}).get('function') or d.get('op')}`"
             f" — {(d.get('signature') or {}).get('kind')} · {d.get('trigger')}", "",
             cause(d), "", *_remedy(d),
             f"**Where:** `{_site(d)}`" + (f" — the deepest frame is {d['upstream']}'s: the fix belongs upstream"
                                           if d.get("upstream") else "") + _evidence(d), "",
             f"**Numbers (smallest input):** {_numbers(d)}", "",
             *([f"**Variant** `{d['variant'].get('name')}`: {d['variant'].get('parameters')}", ""]
               if isinstance(d.get("variant"), dict) and d["variant"].get("parameters") else []),
             f"**Smallest input** (`{rep.get('finding')}`; floats as float64 hex):", "",
             "```json", _case_input(case, d), "```", ""]
    if rep.get("command"):
        lines += ["**Replay with rlconform:**", "", "```", rep["command"], "```", ""]
    if script is None:
        lines += [f"**Standalone script:** {NO_SCRIPT} ({why})."]
    else:
        member = script_member_id(script)
        of = "" if member == rep.get("finding") else (
            f" of member `{member}`, the smallest member whose case a template is written for")
        lines += [f"**Standalone script**{of} (torch and the engine only; exits 1 while the defect is there):", "",
                  "```python", script.rstrip("\n"), "```"]
    return "\n".join(lines) + "\n", script is not None


def script_member_id(script: str) -> str | None:
    """The finding id a standalone script reproduces (its docstring's ``finding:`` line)."""
    m = re.search(r"^finding:\s+(\S+)$", script, re.M)
    return m.group(1) if m else None


# ------------------------------------------------------------------------------------------- scripts
_TP = re.compile(r"^tp(\d+)_")


#: engines whose call paths the templates write out (each template calls that engine as its binding does)
SCRIPT_ENGINES = ("verl",)


#: the report's failure classes (:func:`rlconform.harness.report.triage.failure_class`) and the kinds of a finding
#: (:func:`rlconform.harness.report.triage.kind`) -> the kinds the texts and templates are written for
_KIND_OF_CLASS = {"changes a tensor": "mutation", "in-place on saved": "mutation", "NaN / inf": "NaN",
                  "implementations disagree": "wrong value"}


def _kind(d: dict) -> str | None:
    """The failure kind of defect ``d`` in the templates' words (its signature's class, mapped)."""
    k = (d.get("signature") or {}).get("kind")
    return _KIND_OF_CLASS.get(k, k)


def _member_kind(f: dict) -> str:
    """The failure kind of a member finding ``f`` in the templates' words (triage's kind, mapped; inf is NaN's)."""
    from rlconform.harness.report.triage import kind

    k = kind(f)
    return _KIND_OF_CLASS.get(k, "NaN" if k == "inf" else k)


#: single-call families: op -> (family template, the engine function the template calls); the kind templates
#: run them without partitions
_TOKEN_STATS = {"entropy": "entropy_from_logits", "sum_pi_squared": "calculate_sum_pi_squared_from_logits"}
#: ``outcome_advantage`` variants the exact formula is written out for -> verl's registry name of the default
#: implementation (``+vectorized``: ``<name>_vectorized``), and whether the advantage is divided by the group std
_ESTIMATORS = {"grpo": ("grpo", True), "drgrpo": ("grpo", False), "rloo": ("rloo", None)}
#: ops whose family appends a masked time step to an all-valid mask under mask_invariant
#: (:func:`rlconform.harness.core.garbage.with_masked_column`); the others clear the mask's last bit
_APPENDS_MASKED_COLUMN = {"gae": "response_mask", "outcome_advantage": "response_mask"}
#: properties a wrong value / NaN of a single-call family is read from
_VALUE_PROPERTIES = ("matches_reference", "finite_where_reference_finite", "implementations_agree")


def _template(f: dict, case: dict, engine: str = "verl") -> tuple[str, dict] | str:
    """(kind template, extra context) for member finding ``f`` of a defect and its case (its op, property,
    failure kind and regime) on ``engine``, or the reason there is none."""
    if engine not in SCRIPT_ENGINES:
        return f"engine {engine}: the templates call {', '.join(SCRIPT_ENGINES)} only"
    op, prop, regime = case.get("op"), case.get("property"), case.get("regime") or ""
    kind = _member_kind(f)
    inputs = case["inputs"]
    variant = regime.split("@", 1)[0] if "@" in regime else None
    if op == "vocab_parallel_entropy" and prop == "non_destructive" and kind == "mutation":
        m = _TP.match(regime)
        if not m or variant is not None:
            return f"op {op} regime {regime!r}: only the unchunked function on TP-only layouts"
        from rlconform.harness.report.triage import trigger

        tp = int(m.group(1))  # the script runs one rank unless the failure needs TP > 1 (its trigger says so)
        return "vp_mutation.py.j2", {"case_tp": tp, "tp": tp if "TP > 1" in trigger(f) else 1,
                                     "vp_function": "vocab_parallel_entropy"}
    single = ""
    if op in _TOKEN_STATS and variant in (None, "chunked") and prop in _VALUE_PROPERTIES[:2]:
        if variant == "chunked" and op != "entropy":
            return f"op {op} has no chunked implementation in the templates"
        single = "fam_token_stats.py.j2"
    elif op == "outcome_advantage" and prop in _VALUE_PROPERTIES:
        est, _, impl = (variant or "").partition("+")
        if est not in _ESTIMATORS or impl not in ("", "vectorized"):
            return (f"outcome_advantage variant {variant!r} (the exact formula is written out for "
                    f"{', '.join(_ESTIMATORS)})")
        name, norm = _ESTIMATORS[est]
        return "kind_wrong_value.py.j2", {
            "family_template": "fam_outcome_advantage.py.j2", "partition_words": "", "estimator": est,
            "registry_name": name + ("_vectorized" if impl else ""), "norm": norm}
    elif op == "rollout_rejection_mask" and prop == "matches_reference" and variant == "token_k1_asym":
        if not any(c.label.startswith("kept mask") for c in F.numeric(f)[:1]):
            return "rollout_rejection_mask: the script checks the kept mask, and this finding's kept mask is right"
        return "kind_wrong_value.py.j2", {"family_template": "fam_rejection_mask.py.j2", "partition_words": "",
                                          "rs_option": "token_k1", "rs_threshold": "0.5_1.5"}
    elif op in ("gae", "cp_masked_mean") and prop == "mask_invariant" and kind == "NaN":
        garbage = inputs.get("garbage")
        value = garbage.get("float") if isinstance(garbage, dict) else garbage
        return "kind_nan.py.j2", {"family_template": f"fam_{op}.py.j2", "partition_words": "", "garbage": str(value)}
    if single:
        if kind not in ("wrong value", "NaN"):
            return f"failure kind {kind!r} of property {prop} on op {op}"
        chunked = variant == "chunked"  # verl's engine option entropy_from_logits_with_chunking (2-D logits)
        return "kind_wrong_value.py.j2", {"family_template": single, "partition_words": "", "stat": op,
                                          "engine_fn": "entropy_from_logits_with_chunking" if chunked
                                          else _TOKEN_STATS[op], "chunked": chunked}
    fam = {"agg_loss": "fam_agg_loss.py.j2", "policy_loss": "fam_policy_loss.py.j2",
           "metric_pipeline": "fam_metric_pipeline.py.j2"}.get(op)
    if fam is None:
        return f"failure kind {kind!r} of property {prop} on op {op}"
    if op == "policy_loss" and inputs.get("variant") != "geo_mean":
        return f"policy_loss variant {inputs.get('variant')!r} (the exact formula is written out for geo_mean only)"
    words = {"agg_loss": "DP ranks × micro-batches", "policy_loss": "micro-batches",
             "metric_pipeline": "mini-batches × DP ranks × micro-batches"}[op]
    ctx = {"family_template": fam, "partition_words": words}
    if kind == "wrong value" and prop == "matches_reference":
        return "kind_wrong_value.py.j2", ctx
    if kind == "partition dependence" and prop == "partition_invariant":
        return "kind_partition.py.j2", ctx
    if kind == "NaN" and prop == "mask_invariant" and op == "agg_loss":
        garbage = inputs.get("garbage")
        value = garbage.get("float") if isinstance(garbage, dict) else garbage
        return "kind_nan.py.j2", dict(ctx, garbage=str(value))
    return f"failure kind {kind!r} of property {prop} on op {op}"


def _elements(case: dict) -> int:
    """Scalars in a case's inputs (tensor elements, partition bounds): the size of the input a script embeds."""
    def count(v):
        if isinstance(v, dict) and "shape" in v:
            return math.prod(v["shape"]) if v["shape"] else 1
        if isinstance(v, (list, tuple)):
            return sum(count(x) for x in v)
        return 1
    return sum(count(v) for v in (case.get("inputs") or {}).values())


#: the order in which equally small members are preferred: the exact value first, then another implementation
_PROPERTY_RANK = {"matches_reference": 0, "finite_where_reference_finite": 1, "partition_invariant": 1,
                  "mask_invariant": 1, "non_destructive": 1, "implementations_agree": 2}


def _members(doc: dict, d: dict) -> list[dict]:
    """The member findings of defect ``d`` (its reproducer's finding first), as the report holds them."""
    by_id = {f.get("id"): f for f in doc.get("findings") or [] if isinstance(f, dict)}
    first = (d.get("reproducer") or {}).get("finding")
    ids = ([first] if first else []) + [m for m in d.get("members") or [] if m != first]
    out = [by_id[i] for i in ids if i in by_id]
    if not out and first:  # a report without its findings: the defect's own reproducer
        out = [{"id": first, "reproducer": d.get("reproducer"), "status": "discrepancy",
                "property": d.get("property"), "op": d.get("op")}]
    return out


def scripted_member(doc: dict, d: dict, folder: str) -> tuple[dict, dict, tuple[str, dict]] | str:
    """(member finding, its case, (template, context)) of defect ``d`` that a standalone script is written
    for: among the members whose case a template is written for, those of the defect's severity and trigger
    first, then the smallest input (fewest scalars, then fewest processes, then the exact value before another
    implementation, then id); or, when no member has
    one, the reason in one line. Selects by the members' cases, never by the defect's id, so it holds
    whatever the grouping. Raises :class:`ExplainError` for a case path that leaves the folder."""
    engine = (doc.get("engine") or {}).get("name") or ""
    members = _members(doc, d)
    if engine not in SCRIPT_ENGINES:
        return f"engine {engine}: the templates call {', '.join(SCRIPT_ENGINES)} only"
    best, first_reason = None, None
    for f in members:
        try:
            case = read_case(folder, f)
        except ExplainError as exc:
            first_reason = first_reason or str(exc)
            continue
        if case is None:
            first_reason = first_reason or f"{f.get('id')} has no case file"
            continue
        got = _template(f, case, engine)
        if isinstance(got, str):
            first_reason = first_reason or got
            continue
        # a member of the row's own severity and trigger first: the script shows what the row says (a verl
        # the Dr. GRPO row's script showed a 1e-6 ε effect of another member, not 0.707 vs 1)
        key = (bool(d.get("severity")) and f.get("severity") != d.get("severity"),
               bool(d.get("trigger")) and f.get("trigger") != d.get("trigger"),
               _elements(case), got[1].get("tp", 1), _PROPERTY_RANK.get(case.get("property"), 3), f["id"])
        if best is None or key < best[0]:
            best = (key, f, case, got)
    if best is None:
        n = len(members)
        return (f"none of its {n} member finding{'s' if n != 1 else ''} is a case a template is written for"
                + (f"; e.g. {first_reason}" if first_reason else ""))
    return best[1:]


def script_support(doc: dict, d: dict, folder: str) -> str | None:
    """None when :func:`standalone_script` can write a script for ``d``, else the reason (one line)."""
    got = scripted_member(doc, d, folder)
    return got if isinstance(got, str) else None


def _embed(value, dtype: str):
    """A case input as the script's literal: tensors as {"dtype", "shape", "values"} (floats as hex strings
    nested to the shape, bool / int as integers), special floats as their name, the rest as is."""
    import numpy as np

    if isinstance(value, dict) and "ndarray" in value:
        shape = list(value["shape"])
        if "hex" in value:
            flat, dt = list(value["hex"]), dtype
        else:
            flat, dt = [int(v) for v in value["data"]], value["ndarray"]
            if dt == "bool":
                flat = [bool(v) for v in flat]
        nested = np.array(flat, dtype=object).reshape(shape).tolist() if shape else flat[0]
        return {"dtype": dt, "shape": shape, "values": nested}
    if isinstance(value, dict) and "float" in value:
        return value["float"]
    if isinstance(value, list):
        return [_embed(v, dtype) for v in value]
    return value


def _literal(obj, indent: int = 0) -> str:
    """A Python literal of JSON-like data (strings, numbers, bools, None, lists, dicts), one key a line."""
    pad = " " * (indent + 4)
    if isinstance(obj, dict):
        if not obj:
            return "{}"
        items = [f"{pad}{k!r}: {_literal(v, indent + 4)}," for k, v in obj.items()]
        return "{\n" + "\n".join(items) + "\n" + " " * indent + "}"
    return repr(obj)


#: characters a report string may not bring into a script's text: each would end or escape the string,
#: docstring, f-string field or comment it is written in; mapped to a look-alike that cannot
_SCRIPT_TEXT = str.maketrans({'"': "'", "\\": "/", "{": "(", "}": ")"})


def script_text(value) -> str:
    """A report value as it may appear inside a script's strings, docstrings and comments: ``"``, ``\\``,
    ``{`` and ``}`` replaced by look-alikes, every control or line-breaking character by a space. The
    templates' only code contexts take values rlconform computes (numbers, its own names) or literals
    (:func:`_literal`, ``tojson``), marked safe."""
    text = str(value).translate(_SCRIPT_TEXT)
    return "".join(" " if (c < " " or c in "\x7f\x85\u2028\u2029") else c for c in text)


def _finalize(value):
    import markupsafe

    if isinstance(value, markupsafe.Markup) or isinstance(value, (bool, int, float)) or value is None:
        return value
    return script_text(value)


def _environment():
    import jinja2

    return jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), keep_trailing_newline=True,
                              undefined=jinja2.StrictUndefined, autoescape=False, finalize=_finalize)


def _with_masked_position(case: dict) -> dict:
    """The case's inputs as the family hands them to the engine under ``mask_invariant``: an all-valid mask
    gets a masked position, as the family gives it one (the advantage families append a masked time step to
    every ``[B, T]`` input, :func:`rlconform.harness.core.garbage.with_masked_column`, padding 0; the others
    clear the mask's last bit)."""
    inputs = dict(case["inputs"])
    key = _APPENDS_MASKED_COLUMN.get(case.get("op"), "mask")
    mask = inputs.get(key)
    if case.get("property") != "mask_invariant" or not isinstance(mask, dict) or not all(mask.get("data") or [0]):
        return inputs
    shape = list(mask["shape"])
    if key == "mask":
        inputs[key] = dict(mask, data=list(mask["data"][:-1]) + [0])
        return inputs
    b, t = shape[0], shape[-1]
    for k, v in list(inputs.items()):
        if isinstance(v, dict) and list(v.get("shape") or []) == shape:
            field = "hex" if "hex" in v else "data"
            pad = "0x0.0p+0" if field == "hex" else 0
            rows = [list(v[field][i * t:(i + 1) * t]) + [pad] for i in range(b)]
            inputs[k] = dict(v, shape=[b, t + 1], **{field: [x for r in rows for x in r]})
    return inputs


def standalone_script(doc: dict, d: dict, folder: str) -> tuple[str | None, str | None]:
    """(script text, None), or (None, the reason no member of defect ``d`` has a template). The script
    reproduces :func:`scripted_member`'s member finding, read from the report folder ``folder``."""
    got = scripted_member(doc, d, folder)
    if isinstance(got, str):
        return None, got
    import markupsafe

    from rlconform.harness.report.triage import narrowest, trigger

    f, case, (template, extra) = got
    eng = doc.get("engine") or {}
    fn = d.get("engine_function") or {}
    dtype = case.get("dtype") or "float32"
    embedded = {k: _embed(v, dtype) for k, v in _with_masked_position(case).items()}
    op = case.get("op")
    ref_src = {"agg_loss": "reference/loss_agg.py agg_loss, agg_loss_grad",
               "policy_loss": "reference/policy_loss.py policy_loss, policy_loss_grad (geo_mean)",
               "metric_pipeline": "reference/metrics.py token_metrics",
               "entropy": "reference/token_stats.py entropy and its gradient −p ⊙ (log p + H)",
               "sum_pi_squared": "reference/token_stats.py sum_pi_squared and its gradient 2p ⊙ (p − Σπ²)",
               "outcome_advantage": "reference/advantage_estimators.py, with verl's declared singleton convention",
               "gae": "reference/advantage_estimators.py gae, reference/whitening.py",
               "cp_masked_mean": "reference/reductions.py masked_mean",
               "rollout_rejection_mask": "reference/rejection_mask.py (token_k1: keep lower ≤ π/π_old ≤ upper)",
               "vocab_parallel_entropy": "non_destructive: inputs hold the same bits after forward and backward"
               }.get(op, "reference/")
    ref_doc = {"vocab_parallel_entropy": "the caller's logits unchanged (bits and autograd version)"}.get(
        op, "the reference formula written out in run_exact below")
    ctx = dict(extra, engine=eng.get("name", "verl"), version=eng.get("version") or "", defect_id=d["id"],
               function=fn.get("function") or d.get("op"), site=f"{fn.get('file')}:{fn.get('line')}",
               kind=_member_kind(f), trigger=narrowest(trigger(f), [f]), prop=case.get("property"),
               op=op, dtype=dtype, finding=f["id"], regime=case.get("regime") or "",
               inputs=markupsafe.Markup(_literal(embedded)), reference_src=ref_src, reference_doc=ref_doc)
    return _environment().get_template(template).render(**ctx), None


# ------------------------------------------------------------------------------------------- report pages
def explain_texts(doc: dict, folder: str) -> list[tuple[str, bool]]:
    """(the explain Markdown, has a script) of every defect of ``doc``, in order; a defect whose case file
    cannot be read gets a one-line note instead (a page is still written)."""
    out = []
    for d in doc.get("defects") or []:
        try:
            text, scripted = _explain(doc, d, read_case(folder, d), folder)
            out.append((f"$ {explain_command(d)}\n\n{text}", scripted))
        except (ExplainError, OSError, ValueError, KeyError) as exc:
            out.append((f"{explain_command(d)}: {exc}\n", False))
    return out


def explain_blob(doc: dict, folder: str, keys: list[str]) -> tuple[str | None, list[str]]:
    """The explain texts of the defects as the page embeds them: ``{key: text}`` JSON, gzip'd (mtime 0),
    base64 (report.html's script fills each card's collapsed section from it); and the keys with a script.
    (None, []) without defects."""
    import base64
    import gzip

    texts = explain_texts(doc, folder)
    if not texts:
        return None, []
    mapping = {k: t for k, (t, _) in zip(keys, texts)}
    raw = json.dumps(mapping, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    blob = base64.b64encode(gzip.compress(raw, compresslevel=9, mtime=0)).decode("ascii")
    return blob, [k for k, (_, s) in zip(keys, texts) if s]


def markdown_lines(doc: dict) -> list[str]:
    """report.md's lines after the defects table: ``rlconform explain ID --report DIR`` per defect row."""
    defects = doc.get("defects") or []
    if not defects:
        return []
    return ["Upstream-ready text and standalone script of a defect (row n of the defects tables, the precision table continuing the count):", "",
            *[f"{n}. `{explain_command(d)}`" for n, d in enumerate(defects, 1)], ""]
