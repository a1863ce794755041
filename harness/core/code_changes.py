"""Which engine functions a change touched: ``git diff -U0 REV HEAD`` hunks of a checkout,
mapped onto the line ranges of its functions (read with :mod:`ast`, never imported), and a static call
graph inside the engine's package.

A *function* is ``(file, qualname)``: ``file`` relative to the checkout (``verl/trainer/ppo/core_algos.py``),
``qualname`` as Python writes it (``agg_loss``, ``_VocabParallelEntropy.backward``). Its range runs from
its first decorator to its last line, so a changed decorator changes the function. A function *changed*
when a hunk's new-side lines overlap its range (a pure deletion, ``+a,0``, counts for the line after
``a``); a class changed when any of its lines did. A hunk that lies wholly inside functions or classes whose
code is the same on both sides (their syntax trees equal once docstrings are left out: an edited comment,
docstring, blank line or line break) changes nothing and is dropped.

The call graph is static and conservative within one package: in a function's body every name called
(``f(…)``), every attribute of an imported module called (``core_algos.f(…)``) and every ``self.m(…)``
of its class is resolved to a function of the package when the name is defined at module level of the
same file or imported from a module of the package (``from verl.utils import torch_functional as F``,
relative imports included). Names it cannot resolve (arguments, attributes of objects, ``getattr``)
are not followed. No code of the checkout runs.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess

from rlconform.harness.core.safe_git import git as safe_git

__all__ = ["ChangeError", "changed_file_lines", "changed_lines", "function_ranges", "callees", "changed_functions"]

_HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+(\d+)(?:,(\d+))? @@")


class ChangeError(Exception):
    """The change cannot be read (not a git checkout, unknown revision); the message says which."""


def changed_lines(checkout: str, rev: str) -> dict[str, list[tuple[int, int]]]:
    """``file -> [(first, last), …]``: the new-side line ranges (1-based, inclusive) that ``git diff -U0 REV
    HEAD`` reports for the Python files under ``checkout`` (paths relative to ``checkout``). Raises
    :class:`ChangeError` when ``checkout`` is not in a git repository or ``rev`` names no commit."""
    def git(*args: str) -> subprocess.CompletedProcess:
        return safe_git(checkout, *args, env={"GIT_CONFIG_NOSYSTEM": "1"})

    if not os.path.isdir(checkout):
        raise ChangeError(f"--engine-path {checkout} is not a folder")
    if git("rev-parse", "--git-dir").returncode != 0:
        raise ChangeError(f"--changed-since needs a git checkout; {checkout} is not in a git repository")
    if git("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}").returncode != 0:
        raise ChangeError(f"--changed-since {rev}: no such commit in {checkout} (a shallow clone? fetch the "
                          f"history: actions/checkout with fetch-depth: 0)")
    out = git("diff", "-U0", "--no-color", "--no-ext-diff", "--no-textconv", "--relative", rev, "HEAD", "--", "*.py")
    if out.returncode != 0:
        raise ChangeError(f"git diff {rev} HEAD failed in {checkout}: {out.stderr.strip()[:300]}")
    hunks: dict[str, list[tuple[int, int]]] = {}
    path = None
    for line in out.stdout.splitlines():
        if line.startswith("+++ "):
            name = line[4:]
            path = None if name == "/dev/null" else name[2:] if name.startswith("b/") else name
        elif path and line.startswith("@@"):
            m = _HUNK.match(line)
            if m:
                start, count = int(m.group(1)), int(m.group(2) or 1)
                first, last = (start, start + count - 1) if count else (start + 1, start + 1)
                hunks.setdefault(path, []).append((max(first, 1), max(last, 1)))
    for path in list(hunks):
        same = _unchanged_spans(os.path.join(checkout, path), git("show", f"{rev}:./{path}"))
        hunks[path] = [(a, b) for a, b in hunks[path] if not any(lo <= a and b <= hi for lo, hi in same)]
        if not hunks[path]:
            del hunks[path]
    return hunks


class _NoDocstrings(ast.NodeTransformer):
    """A syntax tree without docstrings (a module's, class's or function's first string statement)."""

    def generic_visit(self, node):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and \
                isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]
        return super().generic_visit(node)


def _code(tree: ast.Module) -> dict[str, tuple[tuple[int, int], str]]:
    """``qualname -> (line span, its code)`` of every function and class: the code its syntax tree without
    docstrings (comments, blank lines and line breaks are not in a tree)."""
    return {q: (_span(n), ast.dump(_NoDocstrings().visit(n))) for q, n, _ in _defs(tree)}


def _unchanged_spans(head_path: str, base: subprocess.CompletedProcess) -> list[tuple[int, int]]:
    """The head's line spans of the functions and classes whose code the base has unchanged (``base``: ``git
    show REV:file``; none when the file is new or either side does not parse)."""
    head = _parse(head_path)
    if head is None or base.returncode != 0:
        return []
    try:
        before = _code(ast.parse(base.stdout))
    except (SyntaxError, ValueError):
        return []
    return [span for q, (span, code) in _code(head).items() if q in before and before[q][1] == code]


def _parse(path: str) -> ast.Module | None:
    try:
        with open(path, encoding="utf-8") as fh:
            return ast.parse(fh.read(), filename=path)
    except (OSError, SyntaxError, ValueError):
        return None


def _defs(tree: ast.Module):
    """(qualname, node, enclosing class qualname or None) of every function and class, nested included."""
    stack = [(node, "", None) for node in tree.body]
    while stack:
        node, prefix, cls = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            qual = f"{prefix}{node.name}"
            yield qual, node, cls
            inner_cls = qual if isinstance(node, ast.ClassDef) else cls
            inner = f"{qual}." if isinstance(node, ast.ClassDef) else f"{qual}.<locals>."
            stack.extend((child, inner, inner_cls) for child in node.body)


def _span(node) -> tuple[int, int]:
    first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    return first, getattr(node, "end_lineno", node.lineno) or node.lineno


def changed_file_lines(path: str, rev: str) -> set[int] | None:
    """The new-side line numbers (1-based) that ``git diff -U0 REV HEAD -- FILE`` reports for the file at
    ``path``, read in the git repository that holds it (its hooks and filters switched off:
    :mod:`rlconform.harness.core.safe_git`); None when ``path`` is in no git repository or ``rev`` names no
    commit there (the caller then knows nothing changed)."""
    folder = os.path.dirname(os.path.abspath(path)) or "."
    top = safe_git(folder, "rev-parse", "--show-toplevel")
    if top.returncode != 0 or safe_git(folder, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}").returncode:
        return None
    root = top.stdout.strip()
    rel = os.path.relpath(os.path.realpath(os.path.abspath(path)), os.path.realpath(root))
    out = safe_git(root, "diff", "-U0", "--no-color", "--no-ext-diff", "--no-textconv", rev, "HEAD", "--", rel)
    if out.returncode != 0:
        return None
    lines: set[int] = set()
    for line in out.stdout.splitlines():
        m = _HUNK.match(line)
        if m:
            first, count = int(m.group(1)), int(m.group(2) if m.group(2) is not None else 1)
            lines.update(range(first, first + count))
    return lines


def function_ranges(path: str) -> dict[str, tuple[int, int]]:
    """``qualname -> (first, last)`` line range of every function and class in the Python file ``path``
    (empty when it cannot be read or parsed)."""
    tree = _parse(path)
    return {} if tree is None else {q: _span(n) for q, n, _ in _defs(tree)}


def _module_file(root: str, module: str) -> str | None:
    base = os.path.join(root, *module.split("."))
    for cand in (base + ".py", os.path.join(base, "__init__.py")):
        if os.path.isfile(cand):
            return cand
    return None


def _module_name(rel: str) -> str:
    parts = rel[:-3].split("/") if rel.endswith(".py") else rel.split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(tree: ast.Module, module: str, is_pkg: bool) -> tuple[dict, dict]:
    """(name -> (module, attr) for ``from m import attr [as name]``, name -> module for imported modules)."""
    names, mods = {}, {}
    pkg = module if is_pkg else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname:
                    mods[a.asname] = a.name
                else:
                    mods[a.name.split(".")[0]] = a.name.split(".")[0]
                    mods[a.name] = a.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = pkg.split(".")
                up = up[: len(up) - (node.level - 1)] if node.level > 1 else up
                base = ".".join(up + ([base] if base else []))
            for a in node.names:
                names[a.asname or a.name] = (base, a.name)
    return names, mods


def _called(node) -> list[list[str]]:
    """The dotted names called in ``node``'s body (``f`` -> ["f"], ``a.b.f`` -> ["a", "b", "f"])."""
    out = []
    for sub in ast.walk(node):
        target = sub.func if isinstance(sub, ast.Call) else None
        if isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Load) and isinstance(sub.value, ast.Name):
            target = sub  # an attribute read (a function passed on, `.apply`) is followed as a call would be
        chain = []
        while isinstance(target, ast.Attribute):
            chain.append(target.attr)
            target = target.value
        if isinstance(target, ast.Name):
            out.append([target.id] + chain[::-1])
    return out


def callees(root: str, file: str, qualname: str, top: str) -> set[tuple[str, str]]:
    """The functions of package ``top`` (files under ``root``) that ``qualname`` in ``root/file`` calls, one
    level (see the module docstring for what is resolved)."""
    tree = _parse(os.path.join(root, file))
    if tree is None:
        return set()
    defs = {q: (n, c) for q, n, c in _defs(tree)}
    if qualname not in defs:
        return set()
    node, cls = defs[qualname]
    module = _module_name(file)
    names, mods = _imports(tree, module, file.endswith("__init__.py"))
    out = set()

    def add(mod: str, attr: str) -> None:
        if mod.split(".")[0] != top:
            return
        path = _module_file(root, mod)
        if path is not None:
            out.add((os.path.relpath(path, root), attr))

    for chain in _called(node):
        head = chain[0]
        if head == "self" and cls and len(chain) > 1:
            out.add((file, f"{cls}.{chain[1]}"))
        elif head in defs:  # a module-level function or class of this file (`_X.apply`: the class)
            out.add((file, head))
            if len(chain) > 1 and f"{head}.{chain[1]}" in defs:
                out.add((file, f"{head}.{chain[1]}"))
        elif head in names:
            mod, attr = names[head]
            if _module_file(root, f"{mod}.{attr}") and len(chain) > 1:  # an imported submodule
                add(f"{mod}.{attr}", chain[1])
            else:
                add(mod, attr)
        elif head in mods and len(chain) > 1:
            dotted = chain[:-1]
            mod = ".".join([mods[head]] + dotted[1:])
            add(mod, chain[-1])
    out.discard((file, qualname))
    return out


def changed_functions(root: str, hunks: dict[str, list[tuple[int, int]]], functions, top: str,
                      *, transitive: bool = True) -> dict[tuple[str, str], list[tuple[str, str]]]:
    """For each ``(file, qualname)`` of ``functions`` whose own lines, or (``transitive``: within package
    ``top``, any depth; else one level) a callee's lines, changed: the path from it to the changed function
    (``[(file, qualname)]``: itself alone when its own lines changed). Functions not in a changed file are
    only reached through the call graph."""
    ranges: dict[str, dict[str, tuple[int, int]]] = {}

    def own_change(fn: tuple[str, str]) -> bool:
        file, qual = fn
        if file not in hunks:
            return False
        if file not in ranges:
            ranges[file] = function_ranges(os.path.join(root, file))
        span = ranges[file].get(qual)
        return span is not None and any(a <= span[1] and b >= span[0] for a, b in hunks[file])

    out = {}
    for fn in functions:
        fn = tuple(fn)
        seen, frontier = {fn}, [[fn]]
        while frontier:
            path = frontier.pop(0)
            if own_change(path[-1]):
                out[fn] = path
                break
            if len(path) > 1 and not transitive:
                continue
            for nxt in sorted(callees(root, path[-1][0], path[-1][1], top)):
                if nxt not in seen and len(seen) < 400:
                    seen.add(nxt)
                    frontier.append(path + [nxt])
    return out
