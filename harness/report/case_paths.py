"""Where a report's reproducer case files are: paths relative to the report folder.

A report travels: committed to a repository, attached to a CI run, copied to another machine. Its
``reproducer.case_file`` fields are therefore written relative to the report folder
(``cases/<finding id>.json``), never as the absolute path of the machine that made it. Every reader
resolves them against the report folder with :func:`resolve`; reports written before this carry absolute
paths, which :func:`relative` maps back to ``cases/<name>`` and :func:`resolve` finds in the report's own
``cases/`` folder when the original path does not exist here. Report layer: imports nothing of the project.
"""

from __future__ import annotations

import os

#: the folder of a report that holds its case files
CASES = "cases"


def case_file_name(finding_id) -> str | None:
    """``<finding id>.json``, the name of a finding's case file under ``cases/``; None for an id that cannot
    be a file name of that folder (not a string, empty, a path separator, a NUL, ``.`` or ``..``, or longer
    than 200 characters)."""
    if not isinstance(finding_id, str) or not finding_id or len(finding_id) > 200 or finding_id in (".", ".."):
        return None
    if any(c in finding_id for c in ("/", "\\", "\0")) or finding_id.startswith("."):
        return None
    return f"{finding_id}.json"


def inside_cases(report_dir: str, path: str) -> bool:
    """Whether ``path`` (symbolic links resolved) lies in ``report_dir/cases``."""
    root = os.path.realpath(os.path.join(report_dir, CASES))
    real = os.path.realpath(path)
    return real != root and os.path.commonpath([root, real]) == root


def relative(report_dir: str, case_file: str | None) -> str | None:
    """``case_file`` as a path relative to ``report_dir`` (``/`` separated), or None for None.

    A relative path is kept (normalised); an absolute one inside ``report_dir`` is made relative to it; an
    absolute one elsewhere whose folder is named ``cases`` (an older report, written on another machine or
    moved since) becomes ``cases/<name>``; any other absolute path is kept as it is.
    """
    if not case_file:
        return case_file
    if not os.path.isabs(case_file):
        return os.path.normpath(case_file).replace(os.sep, "/")
    root = os.path.realpath(report_dir)
    real = os.path.realpath(case_file)
    if os.path.commonpath([root, real]) == root:
        return os.path.relpath(real, root).replace(os.sep, "/")
    if os.path.basename(os.path.dirname(case_file)) == CASES:
        return f"{CASES}/{os.path.basename(case_file)}"
    return case_file


def resolve(report_dir: str, case_file: str | None) -> str | None:
    """The path to open for a report's ``case_file``: a relative one joined to ``report_dir``; an absolute
    one as it is when it exists, else the file of that name in ``report_dir/cases`` when that exists (an
    older report from another machine), else as it is (the reader's error names it)."""
    if not case_file:
        return case_file
    if not os.path.isabs(case_file):
        return os.path.join(report_dir, case_file)
    if os.path.exists(case_file):
        return case_file
    local = os.path.join(report_dir, CASES, os.path.basename(case_file))
    return local if os.path.exists(local) else case_file


def relativise(doc: dict, report_dir: str) -> dict:
    """Rewrite, in place, every ``reproducer.case_file`` of ``doc``'s findings and defects with
    :func:`relative`; returns ``doc``."""
    for entry in list(doc.get("findings") or []) + list(doc.get("defects") or []):
        rep = entry.get("reproducer") if isinstance(entry, dict) else None
        if isinstance(rep, dict) and rep.get("case_file"):
            rep["case_file"] = relative(report_dir, rep["case_file"])
    return doc


def copy_case_files(src_dir: str, findings, out_dir: str) -> None:
    """Copy ``src_dir/cases/<id>.json`` of each finding (a regular file, not a link) to ``out_dir/cases``:
    a report folder written from another's findings keeps their reproducers."""
    import shutil

    os.makedirs(os.path.join(out_dir, CASES), exist_ok=True)
    for f in findings:
        name = case_file_name(f.get("id") if isinstance(f, dict) else None)
        src = os.path.join(src_dir, CASES, name) if name else None
        if src and os.path.isfile(src) and not os.path.islink(src):
            shutil.copyfile(src, os.path.join(out_dir, CASES, name))
