"""The adopter's ledger of known discrepancies (``--xfails FILE``): a maintainer's list of accepted defects.

Two kinds of line, ``#`` starts a comment (the reason), blank lines are ignored:

* a **defect line**, one per accepted root cause::

      defect verl.trainer.ppo.core_algos.agg_loss | wrong value | agg_loss.matches_reference  # a row with ...

  ``defect <where> | <kind> | <scope>``: *where* is the engine function (``module.function``; for a crash the
  deepest engine frame of its traceback; ``op <op>`` when the finding names no engine callable), *kind* the
  failure kind of :func:`rlconform.harness.report.triage.kind` (``wrong value``, ``NaN``, ``crash:ValueError``
  …), *scope* the comma-separated ``op.property`` pairs the defect's findings belong to. Every failing
  finding whose :func:`defect_key` is ``<where> | <kind>`` is expected (``xfail``), whatever its op,
  property, dtype or regime. A defect line none of whose findings fails, in a run that checks its whole
  scope (every ``op.property`` of it ran, and no ``--dtype`` / ``--regime`` narrowed the run), is
  ``xpass`` and fails the run (fixed: remove the line); in a narrower run it is ``not checked``.
  Findings in the scope shrink as unlisted ones do (:data:`rlconform.harness.core.profiles.MAX_SHRINKS`),
  so a check with the ledger reports the defects a check without it does.
* a **finding-id line** (``op.property.dtype.regime``, as printed in reports): that one finding is
  expected; one that now passes is ``xpass`` (array-api-tests style).

**By scope.** The kind of a failure (a rounding-sized error or a wrong value) and the engine output that
fails first are read from the example, and a ledger-listed finding stops at its first failing example where
the run that wrote the ledger shrank it: the same finding can read ``rounding`` there and ``wrong value``
here (verl's ``fused_linear_token_stats`` fp32 ``peaked``: 1.3e-7 relative after shrinking, 2.5 at the
first failing example). So a failing finding whose key no line lists, but whose ``op.property`` is in a
line's scope and whose engine function (or module, for a module-wide rounding line) is the line's, is that
line's ``xfail``, marked ``ledger_match: scope`` in report.json; a defect line is
``xpass`` only when no finding of its scope fails. Another engine function failing in a listed
``op.property`` stays red.

**Why the key has no trigger.** A defect of the report is keyed (where, kind, trigger), and its trigger is
read from the *shrunk* input; a ledger-listed finding is not shrunk, so the same finding's trigger differs
between the run that wrote the ledger and the runs that read it (and between runs whose examples differ:
another ``--seed`` or ``--max-examples``). Where and kind come from the engine's code and the failure
itself, not from the example, so the key is (where, kind) and the trigger goes into the reason, for the
reader.

**Members.** A line accepts the failures it was written for and no new ones: ``rlconform ledger`` writes,
indented under each defect line, the ids of its members (the findings failing when it was written, and the
marginal findings of its scope, which another CPU's last bits may take past the band). A failure of a
finding that is not a member — one that passed when the line was written, e.g. a pull request breaking
another branch of the same function — is red under that line. A line without member lines (written by
hand, or by an older rlconform) accepts any failure of its key and scope, as before.

**Magnitude.** A member line may carry the member's worst error over tolerance when the line was written
(``    <id>  max_ratio 5.55e+06``, the report's ``max_ratio``). A member failing now with an error more than
:data:`GROWTH` times that is red under the line, as a new failure would be: the defect it accepts grew (a
pull request that makes a known wrong value ten times worse). The factor is an order of magnitude, far
beyond what another CPU's last bits move, and it applies from the margin band's top at least: a member
recorded marginal or rounding-sized grows only past 40× its tolerance. A member line without it accepts any
error.

The file is UTF-8 (a byte-order mark, as some editors write, is accepted); a file that is not UTF-8 is an
:class:`XfailsError` naming the line, as is a malformed line. A line listed twice is accepted with one
warning (``warnings``) naming both lines of the first duplicate and counting the others (a million
duplicate lines give one warning, not a million).

A listed finding that is ``marginal`` (inside the margin band of
:func:`rlconform.harness.core.tolerance.verdict`) stays ``marginal``: a line matches it marginal or failing
alike, so a verdict that CPUs' last bits move is never red either way. (The ``# flaky`` marker of earlier
ledgers is retired: the band covers what it was for, and such a comment is now a comment like any other.)
"""

from __future__ import annotations

import dataclasses
import re

from rlconform.harness.catalog.binding import BindingError
from rlconform.harness.catalog.ops import FLOAT_DTYPES, OPS, PROPERTIES
from rlconform.harness.core.opinfo import FINDING_ID

_ID = re.compile(f"^{FINDING_ID}$")
#: ``defect <where> | <kind> | <op.property>[, <op.property> ...]``
_DEFECT = re.compile(r"^defect\s+(?P<where>[^|]+?)\s*\|\s*(?P<kind>[^|]+?)\s*\|\s*(?P<scope>[^|]+?)$")
_SCOPE = re.compile(r"^([A-Za-z0-9_]+)\.([a-z_]+)$")
#: the finding statuses a defect line matches (a finding the worker recorded as failing)
FAILING = ("discrepancy", "crash", "xfail")
#: a member failing with an error over tolerance more than this many times its recorded one is red (an order of
#: magnitude: the margin band, what CPUs' last bits move, is far inside it)
GROWTH = 10.0
#: ``<finding id>`` or ``<finding id>  max_ratio <number>``: a member line (indented under its defect line)
_MEMBER = re.compile(r"^(?P<id>\S+)(?:\s+max_ratio\s+(?P<ratio>\S+))?$")


class XfailsError(BindingError):
    """The ledger is malformed; the message names the file and line."""


@dataclasses.dataclass(frozen=True)
class DefectLine:
    """One defect line: ``key`` (``where | kind``, :func:`defect_key`), ``scope`` (``(op, property)`` pairs),
    ``reason`` (the comment), ``line`` (its line number in the file), ``members``: the finding ids the line
    was written for (the indented id lines under it; empty for a line written without them, which accepts
    any failure of its key and scope); ``magnitudes``: ``(finding id, max_ratio)`` of the members whose line
    records their worst error over tolerance; ``member_lines``: ``(finding id, line number)`` of every member."""

    key: str
    scope: tuple[tuple[str, str], ...]
    reason: str
    line: int
    members: frozenset = frozenset()
    magnitudes: tuple = ()
    member_lines: tuple = ()

    def grown(self, finding: dict) -> dict | None:
        """``{"line", "recorded", "max_ratio"}`` (``line``: the member's own line number, else the defect
        line's) when ``finding``, a member of this line, fails with an error
        over tolerance more than :data:`GROWTH` times the one its member line records (or than the margin band's
        top, :data:`~rlconform.harness.core.tolerance.FAIL_ABOVE`, when that is larger); else None."""
        recorded = dict(self.magnitudes).get(finding.get("id"))
        ratio = finding.get("max_ratio")
        if recorded is None or isinstance(ratio, bool) or not isinstance(ratio, (int, float)):
            return None
        from rlconform.harness.core.tolerance import FAIL_ABOVE

        # from the margin band's top at least: a member recorded marginal or rounding-sized is not "grown" by a
        # rounding-sized failure, whatever the last bits of another CPU
        if ratio > GROWTH * max(recorded, FAIL_ABOVE):
            line = dict(self.member_lines).get(finding.get("id"), self.line)
            return {"line": line, "recorded": recorded, "max_ratio": float(ratio)}
        return None

    def accepts(self, finding_id) -> bool:
        """Whether this line accepts a failure of ``finding_id``: one of its members (any id when it lists
        none). A finding that did not fail when the line was written is red under it."""
        return not self.members or finding_id in self.members


@dataclasses.dataclass
class Ledger:
    """A parsed ledger: ``findings`` (finding id -> reason), ``defects`` (:func:`defect_key` ->
    :class:`DefectLine`) and ``finding_lines`` (finding id -> line number)."""

    findings: dict[str, str] = dataclasses.field(default_factory=dict)
    defects: dict[str, DefectLine] = dataclasses.field(default_factory=dict)
    #: finding id -> its line number in the file
    finding_lines: dict[str, int] = dataclasses.field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.findings or self.defects)

    def in_scope(self, op: str, prop: str) -> bool:
        """Whether findings of ``op.prop`` belong to a listed defect's scope (they get the listed shrink budget)."""
        return any((op, prop) in d.scope for d in self.defects.values())

    def match(self, finding: dict) -> DefectLine | None:
        """The defect line that accepts ``finding``, or None (see :meth:`line_of`): a line that lists its
        members accepts only those (:meth:`DefectLine.accepts`); a ``marginal`` finding is never red and is
        matched by scope whatever the members."""
        line = self.line_of(finding)
        if line is None and finding.get("status") not in FAILING:
            return None
        if line is not None and (finding.get("status") == "marginal" or line.accepts(finding.get("id"))):
            return line
        folded = self._folded(finding) if line is not None and finding.get("status") in FAILING else None
        if folded is not None and folded.accepts(finding.get("id")):
            # the function has a line of its own, but this member was folded into a callee's line (a step whose
            # seq-mean NaN is agg_loss's, while its token-mean NaN is the step's own)
            return folded
        # a member listed under another line of the same engine function (or module): the report's table, and so
        # the ledger written from it, folds some failures into a row of their own (a wrong value only in a dtype
        # the engine does not use, a module-wide rounding row) that the finding's own key does not name
        fid = finding.get("id")
        place = defect_key(finding).split(" | ")[0]
        site = finding.get("crash_frame") or finding.get("engine_function") or {}
        module = site.get("module") if isinstance(site, dict) else None
        function = f"{module}.{site.get('function')}" if module and site.get("function") else None
        listed = next((d for d in sorted(self.defects.values(), key=lambda d: d.line)
                       if fid in d.members and d.key.split(" | ")[0] in (place, module, function)), None)
        if listed is None:
            finding.pop("ledger_match", None)
        return listed

    def line_of(self, finding: dict) -> DefectLine | None:
        """The defect line a ``finding`` record falls under, or None: a failing one (with its root-cause
        fields) by :func:`defect_key`; a ``marginal`` one by scope (the first line whose ``op.property``
        pairs hold it), since its kind reads ``inexact value`` where another CPU's last bits make it a
        ``wrong value`` and it carries no root-cause fields — it is never red either way, and so a listed
        defect reads ``xfail`` on every machine."""
        if not self.defects:
            return None
        if finding.get("status") == "marginal":
            pair = (finding.get("op"), finding.get("property"))
            return next((d for d in sorted(self.defects.values(), key=lambda d: d.line) if pair in d.scope), None)
        if finding.get("status") not in FAILING:
            return None
        by_key = self.defects.get(defect_key(finding))
        if by_key is not None:
            return by_key
        folded = self._folded(finding)
        if folded is not None:
            return folded
        # the kind (rounding-sized or a wrong value) and even the site (which output failed first) are read
        # from the example, and a listed finding stops at its first failing one where the run that wrote the
        # ledger shrank it: a failing finding of a listed op.property is that line's (reported as by scope)
        # — provided the line is about the same engine code: the finding's function, or its module for a
        # module-wide rounding line
        pair = (finding.get("op"), finding.get("property"))
        place = defect_key(finding).split(" | ")[0]
        site = finding.get("crash_frame") or finding.get("engine_function") or {}
        module = site.get("module") if isinstance(site, dict) else None
        line = next((d for d in sorted(self.defects.values(), key=lambda d: d.line)
                     if pair in d.scope and d.key.split(" | ")[0] in (place, module)), None)
        if line is not None:
            finding["ledger_match"] = "scope"
        return line


    def _folded(self, finding: dict) -> DefectLine | None:
        """The line a finding's key folds into, as the report's table folds it
        (:func:`rlconform.harness.report.triage.folded_keys`), read from the finding alone: a callee its
        engine function calls (``calls``: directly or down the call chain) listed with the same class; the ``changes a tensor`` line of the
        op whose backward its ``mutation`` clause says wrote the tensor (``by_op``), a ``.backward`` place
        whose scope holds ``<op>.non_destructive``); a wrong value's place (a rounding-sized failure's
        function) listed as a partition dependence, or — under a specific trigger — as a wrong value; a
        masked-value dependence listed as a partition dependence (its kind in ledgers written before it had
        its own); an
        autograd version-check crash listed as its place's ``changes a tensor``. The trigger is not required
        to agree (see the module docstring)."""
        from rlconform.harness.report import failure_fields as F

        place, cls = defect_key(finding).split(" | ", 1)
        site = finding.get("engine_function") or {}
        tries = [f"{callee} | {cls}" for callee in (site.get("calls") or ()) if not cls.startswith("crash:")]
        if cls == "wrong value":
            from rlconform.harness.report.triage import DEPENDENCE_KINDS

            tries += [f"{place} | {dep}" for dep in DEPENDENCE_KINDS]
        if cls == "masked-value dependence":  # the kind of a ledger written before it had its own name
            tries.append(f"{place} | partition dependence")
        if cls == "rounding" and site.get("function"):  # a rounding-sized partition effect of its function
            tries.append(f"{site.get('module')}.{site.get('function')} | partition dependence")
            from rlconform.harness.report.triage import _GENERIC_TRIGGER, trigger

            if not _GENERIC_TRIGGER.match(trigger(finding)):  # that function's wrong value, small (its trigger)
                tries.append(f"{site.get('module')}.{site.get('function')} | wrong value")
        if cls.startswith("crash:") and F.version_check_crash(finding):
            tries.append(f"{place} | changes a tensor")  # autograd's version check: the write's effect
        for key in tries:
            if key in self.defects:
                return self.defects[key]
        after = next((c.by_op for c in F.clauses(finding) if c.kind == "mutation" and c.evidence == "saved"
                      and c.by_op), "")
        if cls == "changes a tensor" and after:
            for d in sorted(self.defects.values(), key=lambda d: d.line):
                if d.key.endswith(".backward | changes a tensor") and (after, "non_destructive") in d.scope:
                    return d
        return None


def defect_key(finding: dict) -> str:
    """``"<where> | <kind>"`` of a failing finding record (a ``report.json`` finding, or the record the plugin
    builds): where = its crash frame (crash) or engine function as ``module.function``, else ``op <op>``;
    kind = :func:`rlconform.harness.report.triage.kind`. It is the root key of
    :func:`rlconform.harness.report.triage.root_key` (where, failure class), which holds no trigger: a
    trigger is read from the shrunk input and so differs between a shrunk and an unshrunk run of the same
    finding (see the module docstring). It is the key before the table's callee fold
    (:func:`rlconform.harness.report.triage.defects`), so that it is a function of the finding alone; a
    ledger's line holds the folded key, and :meth:`Ledger.match` follows the folds."""
    from rlconform.harness.report.triage import root_key

    place, kind = root_key(finding)[:2]  # (where, failure class): never the trigger
    return f"{place} | {kind}"


def defect_line(key: str, scope, reason: str) -> str:
    """The ledger text of a defect line (what :func:`parse_ledger` reads back as ``key``, ``scope``)."""
    pairs = ", ".join(f"{op}.{prop}" for op, prop in sorted(set(scope)))
    reason = " ".join(reason.split())
    return f"defect {key} | {pairs}" + (f"  # {reason}" if reason else "")


def parse_xfails(path: str, extra_ops: tuple[str, ...] = (), warnings: list[str] | None = None) -> dict[str, str]:
    """Return the finding-id lines ``{finding id: comment}`` (defect lines are checked, not returned: see
    :func:`parse_ledger`); raise :class:`XfailsError` naming ``path:line`` on a bad line."""
    return parse_ledger(path, extra_ops, warnings).findings


def _check_op(path: str, n: int, op: str, prop: str, text: str, extra_ops) -> None:
    if op not in OPS and op not in extra_ops:
        raise XfailsError(f"{path}:{n}: unknown op {op!r} in {text!r}")
    if prop not in PROPERTIES:
        raise XfailsError(f"{path}:{n}: unknown property {prop!r} in {text!r} (one of {', '.join(PROPERTIES)})")
    info = OPS.get(op)
    if info is not None and prop not in info.properties:
        raise XfailsError(f"{path}:{n}: property {prop!r} does not apply to {op!r} "
                          f"(it has {', '.join(info.properties)})")


def _parse_defect(path: str, n: int, text: str, extra_ops) -> tuple[str, tuple[tuple[str, str], ...]]:
    m = _DEFECT.match(text)
    if not m:
        raise XfailsError(f"{path}:{n}: malformed defect line {text!r} (expected "
                          f"'defect <module.function> | <kind> | <op.property>[, ...]')")
    scope = []
    for item in m.group("scope").split(","):
        sm = _SCOPE.match(item.strip())
        if not sm:
            raise XfailsError(f"{path}:{n}: malformed scope {item.strip()!r} in a defect line (expected op.property)")
        _check_op(path, n, sm.group(1), sm.group(2), text, extra_ops)
        scope.append((sm.group(1), sm.group(2)))
    return f"{m.group('where')} | {m.group('kind')}", tuple(scope)


def parse_ledger(path: str, extra_ops: tuple[str, ...] = (), warnings: list[str] | None = None) -> Ledger:
    """The :class:`Ledger` at ``path``; raise :class:`XfailsError` naming ``path:line`` on a bad line.
    Duplicate lines are summed up in one ``path:line: ...`` message appended to ``warnings`` (when given)."""
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise XfailsError(f"cannot read xfails file {path}: {exc.strerror or exc}") from exc
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise XfailsError(f"{path}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x}); save the ledger as "
                          f"UTF-8") from None
    lines = text.splitlines()
    ledger = Ledger()
    first_line: dict[str, int] = {}
    dup = {"first": None, "count": 0}

    def listed_again(key: str, n: int, label: str) -> bool:
        """Record line ``n`` (listing ``key``, shown as ``label``); True when an earlier line listed it."""
        if key not in first_line:
            first_line[key] = n
            return False
        if dup["first"] is None:
            dup["first"] = f"{path}:{n}: {label} is listed again (first on line {first_line[key]})"
        dup["count"] += 1
        return True

    block: str | None = None  # the defect line whose indented member lines may follow
    for n, raw in enumerate(lines, 1):
        text, _, comment = raw.partition("#")
        text = text.strip()
        if not text:
            continue
        if raw[:1] in (" ", "\t") and block is not None:  # a member of the defect line above
            member = _MEMBER.match(text)
            if member is None or not _ID.match(member["id"]):
                raise XfailsError(f"{path}:{n}: malformed member line {text!r} under the defect line "
                                  f"{ledger.defects[block].line} (expected op.property.dtype.regime, optionally "
                                  f"followed by max_ratio <number>)")
            d = ledger.defects[block]
            magnitudes = d.magnitudes
            if member["ratio"] is not None:
                try:
                    ratio = float(member["ratio"])
                except ValueError:
                    ratio = float("nan")
                if not ratio >= 0 or ratio == float("inf"):
                    raise XfailsError(f"{path}:{n}: max_ratio {member['ratio']!r} is not a finite number >= 0")
                magnitudes += ((member["id"], ratio),)
            ledger.defects[block] = dataclasses.replace(d, members=d.members | {member["id"]}, magnitudes=magnitudes,
                                                        member_lines=d.member_lines + ((member["id"], n),))
            continue
        block = None
        if text.startswith("defect ") or text == "defect":
            key, scope = _parse_defect(path, n, text, extra_ops)
            if listed_again(key, n, f"defect {key}"):
                continue
            ledger.defects[key] = DefectLine(key, scope, comment.strip(), n)
            block = key
            continue
        m = _ID.match(text)
        if not m:
            raise XfailsError(f"{path}:{n}: malformed finding id {text!r} (expected op.property.dtype.regime)")
        op, prop, dtype, regime = m.groups()
        if op not in OPS and op not in extra_ops:
            raise XfailsError(f"{path}:{n}: unknown op {op!r} in {text!r}")
        if prop not in PROPERTIES:
            raise XfailsError(f"{path}:{n}: unknown property {prop!r} in {text!r} (one of {', '.join(PROPERTIES)})")
        if dtype not in FLOAT_DTYPES:
            raise XfailsError(f"{path}:{n}: unknown dtype {dtype!r} in {text!r}")
        info = OPS.get(op)
        if info is not None:
            if prop not in info.properties:
                raise XfailsError(f"{path}:{n}: property {prop!r} does not apply to {op!r} "
                                  f"(it has {', '.join(info.properties)})")
            if regime not in info.regimes:
                raise XfailsError(f"{path}:{n}: unknown regime {regime!r} for {op!r} "
                                  f"(one of {', '.join(info.regimes)})")
            if dtype not in info.regimes[regime]:
                raise XfailsError(f"{path}:{n}: regime {regime!r} of {op!r} is not checked in {dtype}")
            only = info.property_regimes.get(prop)
            if only is not None and regime not in only:
                raise XfailsError(f"{path}:{n}: property {prop!r} of {op!r} is not checked under regime {regime!r} "
                                  f"(only {', '.join(only)})")
        if listed_again(text, n, text):
            continue
        ledger.findings[text] = comment.strip()
        ledger.finding_lines[text] = n
    dups = dup["count"]
    if dup["first"] is not None and warnings is not None:
        more = f", and {dups - 1} more duplicate line(s)" if dups > 1 else ""
        warnings.append(f"{dup['first']}{more}; the duplicate line{'s are' if dups > 1 else ' is'} ignored")
    return ledger
