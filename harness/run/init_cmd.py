"""``rlconform init``: adopt rlconform in a fork with one command and a commit.

Writes, in the fork's checkout (``--dir``, default ``.``):

* ``.github/workflows/rlconform.yml``: on every pull request, the composite action (CPU torch, rlconform and
  the fork without its dependencies; the head checked against its base, the diff as the PR comment), then
  ``rlconform coverage --strict`` (a numerics function the pull request adds fails until it is bound or
  justified);
* ``rlconform-xfails.txt``: an empty ledger saying how to fill it;
* ``rlconform_binding.py``: the fork's binding, the stock one of ``--engine`` extended, never copied.

An existing file is never overwritten (exit 2 naming it) unless ``--force``. Exit 0 after writing.
"""

from __future__ import annotations

import argparse
import os
import sys

#: engines with a stock binding a fork extends
STOCK = {"verl": "rlconform.harness.bindings.verl", "skyrl": "rlconform.harness.bindings.skyrl",
         "megatron": "rlconform.harness.bindings.megatron"}
WORKFLOW = ".github/workflows/rlconform.yml"
LEDGER = "rlconform-xfails.txt"
BINDING = "rlconform_binding.py"


def add_parser(sub) -> None:
    """Add the ``init`` subcommand to the CLI's subparsers."""
    p = sub.add_parser("init", help="write a fork's rlconform workflow, an empty ledger and a binding skeleton")
    p.add_argument("--engine", choices=sorted(STOCK), default="verl", help="the engine the fork is a fork of "
                   "(default: verl)")
    p.add_argument("--dir", default=".", help="the fork's checkout (default: .)")
    p.add_argument("--action", default="<owner>/rlconform/.github/actions/rlconform@main",
                   help="the rlconform action the workflow uses (default: %(default)s; replace <owner>)")
    p.add_argument("--force", action="store_true", help="overwrite files that exist")


def workflow_text(action: str, engine: str) -> str:
    return f"""# rlconform on every pull request: the head checked against its base with the fork's ledger, the
# diff posted as the pull request's comment, and every numerics function bound or justified.
# Written by `rlconform init`; see rlconform's README, "Checking a fork in CI".
on: pull_request
jobs:
  rlconform:
    runs-on: ubuntu-latest
    permissions: {{contents: read, pull-requests: write}}
    steps:
      - uses: actions/checkout@v4
        with: {{fetch-depth: 0}}
      - uses: {action}
        with: {{engine: {BINDING}, requirements: {engine}, xfails: {LEDGER}}}
      - name: every numerics function bound or justified
        if: always()
        run: rlconform coverage --engine {BINDING} --engine-path . --strict --format md
"""


def ledger_text(engine: str) -> str:
    return f"""# rlconform's ledger of this fork: the discrepancies it accepts, one defect line each.
# A pull request that adds a failing finding not listed here fails; a line whose findings all pass fails
# too (remove it: the defect is fixed). Start it from a check of your main branch:
#   rlconform check --engine {BINDING} --engine-path . --out rlconform-report
#   rlconform ledger rlconform-report > {LEDGER}
# or begin with the released engine's, which rlconform ships:
#   rlconform ledger --stock {_stock_ledger_name(engine)} >> {LEDGER}
"""


def _stock_ledger_name(engine: str) -> str:
    from rlconform.harness.report import stock_ledgers

    prefix = "megatron-core" if engine == "megatron" else engine
    names = [n for n in stock_ledgers.names() if n.startswith(prefix + "-")]
    return names[-1] if names else f"{prefix}-<version>"


def binding_text(engine: str) -> str:
    return f'''"""This fork's rlconform binding: the stock {engine} binding, extended with what the fork adds.

rlconform checks the fork's own code through it (``--engine {BINDING} --engine-path .``). Bind a numerics
function the fork adds to a catalog op (``rlconform list-ops``), or say why it is not one; never copy the
stock binding: ``extend`` keeps it, so rlconform's updates reach the fork.
"""

from {STOCK[engine]} import binding as stock

binding = stock.extend(
    ops={{}},          # e.g. {{"masked_mean": my_fork.numerics.fast_masked_mean}}
    modules=(),       # the fork's own numerics modules, inventoried by `rlconform coverage`
    not_bound={{}},    # qualified name -> why it is not an op ("not numerics: ...", "no catalog op yet: ...")
)
'''


#: the folder ``ci/rlconform-pr.sh`` writes a pull request's reports to (its ``--out`` default)
PR_OUTPUT = "rlconform-ci"


def ignore_pr_output(root: str) -> bool:
    """Add ``rlconform-ci/`` to ``root``'s .gitignore (created if absent) unless a line already ignores it; returns
    whether it was added. Raises OSError when the file cannot be written."""
    path = os.path.join(root, ".gitignore")
    text = ""
    if os.path.exists(path):
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    if any(line.strip().strip("/") == PR_OUTPUT for line in text.splitlines()):
        return False
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(("" if not text or text.endswith("\n") else "\n") + f"{PR_OUTPUT}/\n")
    return True


def cmd_init(args: argparse.Namespace) -> int:
    root = os.path.abspath(args.dir)
    if not os.path.isdir(root):
        print(f"rlconform init: {args.dir} is not a folder", file=sys.stderr)
        return 2
    files = {WORKFLOW: workflow_text(args.action, args.engine), LEDGER: ledger_text(args.engine), BINDING: binding_text(args.engine)}
    existing = [name for name in files if os.path.exists(os.path.join(root, name))]
    if existing and not args.force:
        print(f"rlconform init: {', '.join(existing)} exist(s) in {root}; nothing written (--force overwrites)",
              file=sys.stderr)
        return 2
    for name, text in files.items():
        path = os.path.join(root, name)
        os.makedirs(os.path.dirname(path) or root, exist_ok=True)
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
        print(f"wrote {name}")
    if ignore_pr_output(root):
        print(f"added {PR_OUTPUT}/ to .gitignore (where ci/rlconform-pr.sh writes its reports)")
    owner = "<owner>" in args.action
    print("next: " + (f"replace <owner> in {WORKFLOW} with the GitHub owner of rlconform's repository (the workflow "
                      "cannot run until then; --action sets it), " if owner else "")
          + f"fill {LEDGER} from a check of your main branch (its header says how), bind what the fork adds in "
          f"{BINDING}, and commit the three files")
    return 0
