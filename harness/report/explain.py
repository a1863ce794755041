"""``rlconform explain DEFECT_ID --report DIR``: a defect as a maintainer pastes it upstream (issue 20 §5).

Reads a report folder (``report.json`` and its ``cases/``) and writes, as Markdown: the cause in one paragraph
(from the defect's failure kind, trigger, engine function and the property that failed), the engine function
and ``file:line``, the smallest input (the case file of the defect's smallest reproducer), engine vs exact
numbers, the ``rlconform replay`` command, and a standalone script.

The standalone script reproduces the defect with plain PyTorch and the engine only (no rlconform import): it
embeds the smallest input bit for bit (floats as ``float.hex`` strings), calls the engine function as the
binding does (``harness/bindings/verl.py``), computes the exact value in float64 (the reference formula written
out, citing ``reference/``), prints both and exits 1 while the defect is there, 0 once it is gone. Scripts come
from jinja2 templates under ``templates/``: one per op family (the engine call and the exact value) and one per
failure kind (wrong value, partition dependence: every partition run, NaN: garbage at masked positions,
mutation: digests and tensor versions before / after, on gloo TP ranks it spawns). A template is chosen by the
op, property and failure kind of the defect's reproducer finding (never by the id's text); a defect with no
template says so ("no standalone script for this kind yet") instead of getting a wrong one.

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

__all__ = ["ExplainError", "find_defect", "read_case", "explain_markdown", "standalone_script", "script_support",
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
    return f"{site.get('module', '')}.{site.get('function')} ({site.get('file')}:{site.get('line')})".lstrip(".")


def _effect(d: dict) -> str:
    n = d.get("numbers") or {}
    e, x = n.get("engine"), n.get("exact")
    if not isinstance(x, (int, float)) or isinstance(x, bool):
        return ""
    text = f" On the smallest input the engine gives {_fmt(e)} where the exact value is {_fmt(x)}"
    if isinstance(e, (int, float)) and x and math.isfinite(e) and math.isfinite(x):
        text += f" ({e / x:.3g}× the exact value)"
    return text + "."


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
    when = "on every input rlconform drew" if trig == "any input" else f"when the input has {trig}"
    props = d.get("properties") or [d.get("property")]
    against = "; ".join(_PROPERTY_WORDS.get(p, p) for p in props if p)
    dtypes = ", ".join(d.get("dtypes") or [])
    n = len(d.get("members") or [])
    return (f"`{fn}` {what}, {when}.{_effect(d)} rlconform compared it with {against}. Severity "
            f"**{d.get('severity')}**: {n} finding{'s' if n != 1 else ''} ({', '.join(d.get('ops') or [d.get('op')])}; "
            f"{dtypes}) share this cause.")


def _fmt(x) -> str:
    return f"{x:.9g}" if isinstance(x, float) else str(x)


def _numbers(d: dict) -> str:
    n = d.get("numbers")
    if not n:
        return d.get("message", "").splitlines()[0] if d.get("message") else "(the report records no numbers)"
    return f"engine {_fmt(n.get('engine'))} vs exact {_fmt(n.get('exact'))} ({n.get('clause', '')})"


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


def explain_markdown(doc: dict, d: dict, case: dict | None) -> str:
    """The Markdown a maintainer pastes into an upstream issue."""
    eng = doc.get("engine") or {}
    script, why = standalone_script(doc, d, case)
    rep = d.get("reproducer") or {}
    lines = [f"### {eng.get('name', 'engine')} {eng.get('version') or ''}: `{(d.get('engine_function') or {}).get('function') or d.get('op')}`"
             f" — {(d.get('signature') or {}).get('kind')} · {d.get('trigger')}", "",
             cause(d), "",
             f"**Where:** `{_site(d)}`", "",
             f"**Numbers (smallest input):** {_numbers(d)}", "",
             f"**Smallest input** (`{rep.get('finding')}`; floats as float64 hex):", "",
             "```json", _case_input(case, d), "```", ""]
    if rep.get("command"):
        lines += ["**Replay with rlconform:**", "", "```", rep["command"], "```", ""]
    if script is None:
        lines += [f"**Standalone script:** {NO_SCRIPT} ({why})."]
    else:
        lines += ["**Standalone script** (torch and the engine only; exits 1 while the defect is there):", "",
                  "```python", script.rstrip("\n"), "```"]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------- scripts
_TP = re.compile(r"^tp(\d+)_")


#: engines whose call paths the templates write out (each template calls that engine as its binding does)
SCRIPT_ENGINES = ("verl",)


#: the report's failure classes (:func:`rlconform.harness.report.triage.failure_class`) -> the kinds the texts
#: and templates are written for
_KIND_OF_CLASS = {"changes a tensor": "mutation", "NaN / inf": "NaN"}


def _kind(d: dict) -> str | None:
    """The failure kind of defect ``d`` in the templates' words (its signature's class, mapped)."""
    k = (d.get("signature") or {}).get("kind")
    return _KIND_OF_CLASS.get(k, k)


def _supported(d: dict, case: dict, engine: str = "verl") -> tuple[str, dict] | str:
    """(kind template, extra context) for the reproducer finding of ``d`` (its op, property, failure kind and
    regime) on ``engine``, or the reason there is none."""
    if engine not in SCRIPT_ENGINES:
        return f"engine {engine}: the templates call {', '.join(SCRIPT_ENGINES)} only"
    op, prop = case.get("op"), case.get("property")
    kind = _kind(d)
    inputs = case["inputs"]
    fam = {"agg_loss": "fam_agg_loss.py.j2", "policy_loss": "fam_policy_loss.py.j2",
           "metric_pipeline": "fam_metric_pipeline.py.j2"}.get(op)
    if op == "vocab_parallel_entropy" and prop == "non_destructive" and kind == "mutation":
        m = _TP.match(case.get("regime") or "")
        if not m or "@" in (case.get("regime") or ""):
            return f"op {op} regime {case.get('regime')!r}: only the unchunked function on TP-only layouts"
        return "vp_mutation.py.j2", {"tp": int(m.group(1)), "vp_function": "vocab_parallel_entropy"}
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
    if kind in ("NaN", "inf") and prop == "mask_invariant" and op == "agg_loss":
        garbage = inputs.get("garbage")
        value = garbage.get("float") if isinstance(garbage, dict) else garbage
        return "kind_nan.py.j2", dict(ctx, garbage=str(value))
    return f"failure kind {kind!r} of property {prop} on op {op}"


def script_support(d: dict, case: dict | None, engine: str = "verl") -> str | None:
    """None when :func:`standalone_script` can write a script for ``d`` of ``engine``, else the reason."""
    if case is None:
        return "the defect has no case file"
    got = _supported(d, case, engine)
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


def _environment():
    import jinja2

    return jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), keep_trailing_newline=True,
                              undefined=jinja2.StrictUndefined, autoescape=False)


def standalone_script(doc: dict, d: dict, case: dict | None) -> tuple[str | None, str | None]:
    """(script text, None), or (None, the reason there is no template for this defect)."""
    if case is None:
        return None, "the defect has no case file"
    got = _supported(d, case, (doc.get("engine") or {}).get("name") or "")
    if isinstance(got, str):
        return None, got
    template, extra = got
    eng = doc.get("engine") or {}
    fn = d.get("engine_function") or {}
    dtype = case.get("dtype") or "float32"
    inputs = dict(case["inputs"])
    mask = inputs.get("mask")
    if case.get("property") == "mask_invariant" and isinstance(mask, dict) and all(mask.get("data") or [0]):
        # the family clears the last mask bit of an all-valid mask (garbage needs a masked position)
        inputs["mask"] = dict(mask, data=list(mask["data"][:-1]) + [0])
    embedded = {k: _embed(v, dtype) for k, v in inputs.items()}
    ref_src = {"agg_loss": "reference/loss_agg.py agg_loss, agg_loss_grad",
               "policy_loss": "reference/policy_loss.py policy_loss, policy_loss_grad (geo_mean)",
               "metric_pipeline": "reference/metrics.py token_metrics",
               "vocab_parallel_entropy": "non_destructive: inputs hold the same bits after forward and backward"
               }.get(case.get("op"), "reference/")
    ref_doc = {"vocab_parallel_entropy": "the caller's logits unchanged (bits and autograd version)"}.get(
        case.get("op"), "the reference formula written out in run_exact below")
    ctx = dict(extra, engine=eng.get("name", "verl"), version=eng.get("version") or "", defect_id=d["id"],
               function=fn.get("function") or d.get("op"), site=f"{fn.get('file')}:{fn.get('line')}",
               kind=_kind(d), trigger=d.get("trigger"), prop=case.get("property"),
               op=case.get("op"), dtype=dtype, finding=(d.get("reproducer") or {}).get("finding"),
               inputs=_literal(embedded), reference_src=ref_src, reference_doc=ref_doc)
    return _environment().get_template(template).render(**ctx), None


# ------------------------------------------------------------------------------------------- report pages
def explain_texts(doc: dict, folder: str) -> list[tuple[str, bool]]:
    """(the explain Markdown, has a script) of every defect of ``doc``, in order; a defect whose case file
    cannot be read gets a one-line note instead (a page is still written)."""
    out = []
    for d in doc.get("defects") or []:
        try:
            case = read_case(folder, d)
            script, _ = standalone_script(doc, d, case)
            out.append((f"$ {explain_command(d)}\n\n{explain_markdown(doc, d, case)}", script is not None))
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
