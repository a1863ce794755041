"""Does my configuration reach it? The configuration keys and values under which a trainer runs each defect row,
and a report read against one trainer configuration (``rlconform report DIR --config my_trainer.yaml``).

A binding declares, as data (``Binding.configs``, written into ``report.json`` as ``engine.configs``):

* ``defaults``: the engine's default of every key its conditions read (``follows``: a key whose default is another
  key's value, verl's ``critic.loss_agg_mode``);
* ``ops``: op -> catalog variant (``""`` the op's own, ``"*"`` any) -> alternatives, each a list of conditions
  ``[key, op, value]`` (op ``==``, ``!=``, ``in``, ``~`` a regular expression over the value as text, ``asym`` a
  ``lower_upper`` pair whose bounds are not reciprocal; a fourth field may put it in words), any one of which
  reaches the variant; an op or variant not listed runs under any configuration;
* ``triggers``: ``[regular expression over a row's trigger, conditions]``: a trigger that is itself a
  configuration (verl: rollout rejection) adds its conditions to every alternative;
* ``sites``: ``"module.qualname"`` (``[row]`` for an output that is a row of its own) -> ``{regular expression
  over the row's class: alternatives}``: where the
  engine function itself runs only under some configuration (verl's ``compute_is_metrics`` only with
  ``rollout_is``), its row's alternatives are these, whatever op found it;
* ``derived``: key -> ``[other key, {its value: this key's value}]``: a key a configuration sets through another
  (verl's ``model_engine=megatron`` selects ``actor_rollout_ref.actor.strategy=megatron``);
* ``twins``: op -> variant -> ``[twin variant, key]``: two variants drawn alike but for ``key`` (the step's rollout
  rejection on token-mean and on seq-mean-token-mean; :func:`rlconform.harness.catalog.binding.twins`): each keeps
  its ``key`` condition, which a row holding both (the same property and dtype) drops: it holds whatever ``key`` is.

A row's alternatives are those of its members (an alternative that implies another left out) (``reached_by``: a list of condition lists; ``[[]]``: any
configuration; None: the binding declares nothing). A configuration is a YAML file in the engine's own format:
a nested mapping (a trainer's config, Hydra's ``.hydra/config.yaml``), dotted keys, or a list of Hydra overrides
``key=value`` (``.hydra/overrides.yaml``); a key it does not set takes the engine's default.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["ConfigError", "alternatives", "describe", "load_config", "reaches", "render"]

OPS = ("==", "!=", "in", "~", "asym")


class ConfigError(ValueError):
    """A configuration file that cannot be read as the engine's config (a usage error)."""


def _cond(c) -> tuple:
    """A condition as a hashable tuple (an ``in`` value read back from JSON is a list)."""
    return tuple(tuple(x) if isinstance(x, list) else x for x in c)


def _conds(alts) -> list[list[tuple]]:
    return [[_cond(c) for c in alt] for alt in alts]


def alternatives(defect: dict, findings: dict, table: dict | None) -> list[list[tuple]] | None:
    """The alternatives that reach ``defect`` (module doc): the union over its members (``findings``: id ->
    finding) of their op's and variant's alternatives, each with the conditions of the row's trigger; ``[[]]``
    when some member runs under any configuration; None without a ``table``."""
    if not table:
        return None
    from rlconform.harness.core.opinfo import split_regime

    extra: list[tuple] = []
    for pattern, conds in table.get("triggers") or ():
        if re.search(pattern, defect.get("trigger") or ""):
            extra += [_cond(c) for c in conds]
    cls = (defect.get("signature") or {}).get("kind") or ""
    for s in () if cls.startswith("rounding") else (defect.get("crash_frame"), defect.get("engine_function")):
        place = f"{(s or {}).get('module')}.{(s or {}).get('function')}"
        row = (s or {}).get("output_row")
        by_kind = (table.get("sites") or {}).get(f"{place}[{row}]" if row else place) or \
            (table.get("sites") or {}).get(place) or {}
        for pattern, alts in by_kind.items():
            if re.search(pattern, cls):
                out = [j for j in (_joined(alt, extra) for alt in _conds(alts)) if j is not None]
                return [[]] if any(not alt for alt in out) else out
    out: list[list[tuple]] = []
    members = [findings.get(fid) or {} for fid in defect.get("members") or ()]
    for f in members:
        by_variant = (table.get("ops") or {}).get(f.get("op"))
        variant, data = split_regime(str(f.get("regime") or ""))
        variant = variant or ""
        alts = [[]]
        if by_variant:
            for key in (variant, variant.split("+", 1)[0], "*", ""):
                if key in by_variant:
                    alts = _conds(by_variant[key])
                    break
        twin, twin_key = ((table.get("twins") or {}).get(f.get("op")) or {}).get(variant) or (None, None)
        if twin and any(g.get("op") == f.get("op") and g.get("property") == f.get("property")
                        and g.get("dtype") == f.get("dtype") and g.get("regime") == f"{twin}@{data}" for g in members):
            alts = [[c for c in alt if c[0] != twin_key] for alt in alts]  # the row holds on both: any value
        for alt in alts:
            full = _joined(alt, extra)
            if full is not None and full not in out:
                out.append(full)
    if any(not alt for alt in out):
        return [[]]
    return [alt for i, alt in enumerate(out)
            if not any(j != i and _implies(alt, other) and not (_implies(other, alt) and j > i)
                       for j, other in enumerate(out))]


def _implies(alt: list[tuple], other: list[tuple]) -> bool:
    """Whether every configuration ``alt`` reaches also meets ``other`` (each condition of ``other`` follows from
    one of ``alt``): ``mode=seq-mean-token-mean and rollout_rs=seq_mean_k1`` implies ``mode ∈ {seq-mean-…}``,
    so the row's reach need not list it. Patterns (``~``, ``asym``) follow only from themselves."""
    def follows(c: tuple) -> bool:
        key, op, value = c[:3]
        for a in alt:
            if a[0] != key:
                continue
            if a[:3] == c[:3]:
                return True
            if a[1] == "==" and (op == "in" and any(_same(a[2], v) for v in value)
                                 or op == "!=" and not _same(a[2], value)):
                return True
            if a[1] == "in" and (op == "in" and all(any(_same(x, v) for v in value) for x in a[2])
                                 or op == "!=" and not any(_same(x, value) for x in a[2])):
                return True
        return False

    return all(follows(c) for c in other)


def _joined(alt: list[tuple], extra: list[tuple]) -> list[tuple] | None:
    """An alternative with the trigger's conditions, in a stable order, a ``key≠null`` that a ``key=value`` of the
    same key implies left out; None when the two contradict each other (``key=a`` beside ``key=b``, ``key≠a`` or
    ``key ∈ S`` without a: no configuration sets both, e.g. SkyRL's use_kl_loss and use_kl_in_reward)."""
    full = sorted(set(alt) | set(extra), key=lambda c: (c[0], c[1], repr(c[2])))
    pinned = {c[0]: c[2] for c in full if c[1] == "==" and c[2] is not None}
    for key, op, value, *_ in full:
        if key in pinned and (op == "==" and value is not None and not _same(value, pinned[key])
                              or op == "!=" and _same(value, pinned[key])
                              or op == "in" and not any(_same(v, pinned[key]) for v in value)):
            return None
    return [c for c in full if not (c[1] == "!=" and c[2] is None and c[0] in pinned)]


def _text(c: tuple) -> str:
    key, op, value = c[:3]
    if len(c) > 3 and c[3]:  # the binding's words for a pattern (``rollout_rs_threshold: an asymmetric pair``)
        return f"{key}: {c[3]}"
    shown = "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
    if op == "in":
        return f"{key} ∈ {{{', '.join(map(str, value))}}}"
    if op == "asym":
        return f"{key}: a lower_upper pair with lower ≠ 1/upper"
    return {"==": f"{key}={shown}", "!=": f"{key}≠{shown}", "~": f"{key} ~ /{value}/"}[op]


def describe(alts: list[list[tuple]] | None, limit: int = 3) -> str:
    """The alternatives in words: ``any configuration``; ``no configuration …`` (none left);
    ``key=value and key2≠null``; several joined by ``; or``
    (alternatives that differ in one key's value merged as ``key ∈ {…}``), at most ``limit`` then ``…``;
    ``not declared`` for None."""
    if alts is None:
        return "not declared by the binding"
    if alts == [[]]:
        return "any configuration"
    if not alts:
        return "no configuration the binding declares (its conditions contradict the row's trigger)"
    merged: list[list[tuple]] = []
    for alt in alts:
        for m in merged:
            diff = [i for i, (a, b) in enumerate(zip(m, alt)) if a != b]
            if len(m) == len(alt) and len(diff) == 1 and m[diff[0]][0] == alt[diff[0]][0] and \
                    m[diff[0]][1] in ("==", "in") and alt[diff[0]][1] == "==":
                key, _, v = m[diff[0]]
                values = tuple(v) if m[diff[0]][1] == "in" else (v,)
                m[diff[0]] = (key, "in", values + (alt[diff[0]][2],))
                break
        else:
            merged.append(list(alt))
    words = [" and ".join(f"`{_text(c)}`" for c in alt) for alt in merged]
    return "; or ".join(words[:limit]) + ("; or …" if len(words) > limit else "")


def load_config(path: str) -> dict[str, Any]:
    """A trainer configuration as ``{dotted key: value}`` (module doc). Raises ConfigError for a file that cannot
    be read or is neither a mapping nor a list of ``key=value`` overrides."""
    import yaml

    try:
        with open(path, encoding="utf-8") as fh:
            doc = yaml.safe_load(fh)
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not YAML: {exc}") from None
    out: dict[str, Any] = {}
    if isinstance(doc, list):
        for item in doc:
            key, sep, raw = str(item).lstrip("+~").partition("=")
            if not sep or not key:
                raise ConfigError(f"{path}: {item!r} is not a key=value override")
            out[key.strip()] = yaml.safe_load(raw) if raw.strip() else None
        return out
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: expected a mapping of config keys (or a list of key=value overrides), got "
                          f"{type(doc).__name__}")

    def flat(node, prefix=""):
        for k, v in node.items():
            key = f"{prefix}{k}"
            if isinstance(v, dict) and v:
                flat(v, key + ".")
            else:
                out[key] = v

    flat(doc)
    return out


def _value(key: str, user: dict, table: dict, seen=()):
    if key in user:
        return user[key], True
    other, mapping = (table.get("derived") or {}).get(key) or (None, {})
    if other in user and str(user[other]) in mapping:  # set through another key (model_engine=megatron)
        return mapping[str(user[other])], True
    follows = (table.get("follows") or {}).get(key)
    if follows and follows not in seen and follows in user:
        return _value(follows, user, table, (*seen, key))
    return (table.get("defaults") or {}).get(key), False


def _same(a, b) -> bool:
    if isinstance(a, bool) or isinstance(b, bool) or a is None or b is None:
        return a is b or (isinstance(a, bool) and isinstance(b, bool) and a == b)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return float(a) == float(b)
    return str(a) == str(b)


def holds(c: tuple, user: dict, table: dict) -> bool:
    """Whether condition ``c`` holds in the configuration ``user`` (the engine's defaults where it is silent)."""
    key, op, expected = c[:3]
    value, _ = _value(key, user, table)
    if op == "==":
        return _same(value, expected)
    if op == "!=":
        return not _same(value, expected)
    if op == "in":
        return any(_same(value, e) for e in expected)
    if op == "~":
        return value is not None and re.search(expected, str(value)) is not None
    if op == "asym":  # a "lower_upper" pair whose bounds are not reciprocal (lower · upper ≠ 1)
        lo, sep, hi = str(value).partition("_")
        try:
            return bool(sep) and abs(float(lo) * float(hi) - 1.0) > 1e-9
        except ValueError:
            return False
    raise ValueError(f"unknown condition op {op!r}; one of {', '.join(OPS)}")


def reaches(alts: list[list[tuple]] | None, user: dict, table: dict) -> tuple[bool | None, str]:
    """(whether the configuration reaches a row with these alternatives — None when the binding declares
    nothing —, why: the alternative it meets, or the condition of the nearest alternative it misses with the
    configuration's value)."""
    if alts is None:
        return None, "the binding declares no configurations"
    if alts == [[]] or not alts:
        return True, "any configuration"
    best = None
    for alt in alts:
        missed = [c for c in alt if not holds(c, user, table)]
        if not missed:
            return True, " and ".join(f"`{_text(c)}`" for c in alt)
        if best is None or len(missed) < len(best):
            best = missed
    key = best[0][0]
    value, set_ = _value(key, user, table)
    shown = "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
    needs = f"`{_text(best[0])}`" if len(alts) == 1 else f"one of: {describe(alts)}"
    return False, f"needs {needs}; this configuration has {key}={shown}" + ("" if set_ else " (default)")


def unknown_keys(user: dict, table: dict) -> list[str]:
    """Warnings for the configuration's keys that look like a misspelt key the binding reads (``polcy_loss``
    for ``policy_loss``): a misspelling would silently leave the engine's default in force."""
    import difflib

    known = set(table.get("defaults") or {}) | set(table.get("derived") or {}) | \
        {v[0] for v in (table.get("derived") or {}).values()}
    out = []
    for key in user:
        if key in known:
            continue
        close = difflib.get_close_matches(key, known, n=1, cutoff=0.85)
        if close:
            out.append(f"`{key}` is not a key rlconform reads; did you mean `{close[0]}`? (the engine's default "
                       "is assumed for it)")
    return out


def regraded(d: dict, user: dict, table: dict) -> str:
    """The row's severity under this configuration: a training row whose impact depends on a knob
    (``depends_on``) that the configuration leaves at its default takes the severity it has there."""
    dep = d.get("depends_on") or {}
    if d.get("severity") != "training" or not dep.get("knob"):
        return d.get("severity") or ""
    value, _ = _value(dep["knob"], user, table)
    import yaml

    default = yaml.safe_load(str(dep.get("default")))
    if value is None or not _same(value, default):
        return "training"
    return (dep.get("otherwise") or "").split(",")[0].strip() or d["severity"]


def render(doc: dict, user: dict, path: str) -> tuple[str, list[dict]]:
    """(Markdown of the report's defect rows read against configuration ``user`` from ``path``: those it reaches
    first, ranked as in the report with severities regraded, then those it does not and why; the reached rows
    with their regraded ``severity``)."""
    table = (doc.get("engine") or {}).get("configs")
    eng = doc.get("engine") or {}
    rows = doc.get("defects") or []
    reached, missed, unknown = [], [], []
    for n, d in enumerate(rows, 1):
        ok, why = reaches(_conds(d["reached_by"]) if d.get("reached_by") is not None else None, user, table or {})
        entry = dict(d, row=n, why=why, severity=regraded(d, user, table or {}), report_severity=d.get("severity"))
        (reached if ok else unknown if ok is None else missed).append(entry)
    from rlconform.harness.report.severity import SEVERITIES

    reached.sort(key=lambda e: (SEVERITIES.index(e["severity"]) if e["severity"] in SEVERITIES else 9, e["row"]))
    lines = [f"## rlconform: {eng.get('name', 'engine')} {eng.get('version') or ''} against `{path}`", "",
             f"{len(reached)} of {len(rows)} defect rows are reached by this configuration"
             + (f"; {len(unknown)} cannot be told (the binding declares no configurations)" if unknown else "")
             + ". Keys it does not set take the engine's defaults.", "",
             *[f"- warning: {w}" for w in unknown_keys(user, table or {})], ""]
    if reached:
        lines += ["### Reached", "", "| # | severity here | engine function | failure · trigger | reached by |",
                  "|---|---|---|---|---|"]
        lines += [f"| {e['row']} | **{e['severity']}**{_regraded_note(e)} | {_where(e)} | "
                  f"{e['signature']['kind']} · {e.get('trigger')} | {e['why']} |" for e in reached]
        lines.append("")
    if missed:
        lines += ["### Not reached", "", "| # | engine function | failure | why not |", "|---|---|---|---|"]
        lines += [f"| {e['row']} | {_where(e)} | {e['signature']['kind']} | {e['why']} |" for e in missed]
        lines.append("")
    if unknown:
        lines += ["### Cannot be told", "", *[f"- row {e['row']}: {_where(e)} · {e['signature']['kind']}"
                                             for e in unknown], ""]
    return "\n".join(lines), reached


def _regraded_note(e: dict) -> str:
    if e["severity"] == e.get("report_severity"):
        return ""
    return f" (report: {e.get('report_severity')}; `{e['depends_on']['knob']}` at its default)"


def _where(d: dict) -> str:
    s = d.get("crash_frame") or d.get("engine_function") or {}
    return f"`{s.get('function')}`" if s.get("function") else f"op `{d.get('op')}`"
