#!/usr/bin/env bash
# rlconform on a pull request: check the PR's head and its base with the fork's ledger,
# diff the two reports, and write the pull-request comment. Plain bash: runs the same locally and in CI
# (.github/actions/rlconform/action.yml calls it).
#
#   ci/rlconform-pr.sh --engine SPEC (--base DIR | --base-ref REV) [--head DIR] [--xfails FILE]
#                      [--out DIR] [--fail-on SEVERITY] [--all] [-- more `rlconform check` options]
#
#   --engine   verl | skyrl | megatron | module:attr (imported from the checkout) | file.py (a path
#              inside the checkout); the checkout is the --engine-path of each check
#   --head     the PR head's checkout (default: .)
#   --base     the base's checkout; or --base-ref REV: a temporary `git worktree` of REV from --head's
#              repository (needs the full history: actions/checkout with fetch-depth: 0)
#   --xfails   the fork's ledger, a path inside --head (or an absolute path); the same file is used for both checks
#   --out      where the reports go (default: rlconform-ci): OUT/base/, OUT/head/ (report.json, .md,
#              .html, cases/), OUT/comment.md (the PR comment), OUT/diff.json, OUT/rlconform.sarif (the new
#              and changed defects for code scanning)
#   --fail-on  passed to `rlconform diff` (default: robustness)
#   --base-report DIR
#              the report folder of the fork's main workflow at the base commit (its artifact; never one
#              the pull request supplies): the base's verdicts of the head's selection are read from it
#              instead of checked (`rlconform report DIR --subset`); when it is of another commit, engine
#              or rlconform version, incomplete, or lacks a selected finding, the base is checked as usual
#   --all      check the whole catalog on both sides; by default the head is checked with
#              `--changed-since <base commit>` (the findings whose engine functions, or what they call in
#              the engine's package, changed, and those of ledger lines the PR edits) and the base with `--findings` of the head's
#              selection (OUT/head/selection.txt): the same findings on both sides
#
# Environment: RLCONFORM_SKIP_INSTALL=1 uses the `rlconform` already on PATH (the fork installed it);
# otherwise rlconform is installed from this repository with
# `$PYTHON -m pip install -c install/constraints.txt $RLCONFORM_PIP_ARGS <repo>` (PYTHON defaults to
# python3): the constraints pin torch, so the install never resolves another torch than the CPU one.
# Exit code: that of `rlconform diff` (0 nothing new at or above --fail-on; 1 something new is), or 2 when a
# check could not run (bad engine spec, engine does not import, missing ledger) or a usage error.
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
engine="" head="." base="" base_ref="" xfails="" out="rlconform-ci" fail_on="robustness" all=0 base_report=""
while [ $# -gt 0 ]; do
  case "$1" in
    --engine) engine="$2"; shift 2 ;;
    --head) head="$2"; shift 2 ;;
    --base) base="$2"; shift 2 ;;
    --base-ref) base_ref="$2"; shift 2 ;;
    --xfails) xfails="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --fail-on) fail_on="$2"; shift 2 ;;
    --base-report) base_report="$2"; shift 2 ;;
    --all) all=1; shift ;;
    --) shift; break ;;
    *) echo "rlconform-pr: unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
die() { echo "rlconform-pr: error: $*" >&2; exit 2; }
[ -n "$engine" ] || die "--engine SPEC is required"
[ -n "$base" ] || [ -n "$base_ref" ] || die "give --base DIR or --base-ref REV"
[ -d "$head" ] || die "--head $head is not a directory"
head="$(cd "$head" && pwd)"
mkdir -p "$out" && out="$(cd "$out" && pwd)"
rm -rf "$out/base" "$out/head" "$out/comment.md" "$out/diff.json" "$out/rlconform.sarif"
repo_root="$(dirname "$here")"

if [ "${RLCONFORM_SKIP_INSTALL:-0}" != 1 ]; then
  echo "rlconform-pr: installing rlconform from $repo_root (pinned by install/constraints.txt)"
  # shellcheck disable=SC2086  # RLCONFORM_PIP_ARGS is a list of pip options
  "${PYTHON:-python3}" -m pip install -q -c "$repo_root/install/constraints.txt" ${RLCONFORM_PIP_ARGS:-} \
    "$repo_root" || die "pip install failed"
fi
command -v rlconform >/dev/null || die "no rlconform on PATH"

# git with the checkout's own programs switched off (hooks, fsmonitor, clean/smudge/process filters,
# external diff), as rlconform's own git calls run (harness/core/safe_git.py): a pull request's checkout
# is not ours to trust.
safe_git() {
  local repo=$1 key name
  shift
  local opts=(-c core.hooksPath=/dev/null -c core.fsmonitor=false -c diff.external= -c core.pager=cat)
  while IFS= read -r key; do
    name=${key#filter.}
    name=${name%.*}
    [ -n "$name" ] && opts+=(-c "filter.$name.clean=" -c "filter.$name.smudge=" -c "filter.$name.process="
                             -c "filter.$name.required=false")
  done < <(git "${opts[@]}" -C "$repo" config --name-only --get-regexp '^filter\.' 2>/dev/null)
  GIT_TERMINAL_PROMPT=0 git "${opts[@]}" -C "$repo" "$@"
}

cleanup=""
if [ -z "$base" ]; then
  base="$(mktemp -d "${RUNNER_TEMP:-${TMPDIR:-/tmp}}/rlconform-base.XXXXXX")"
  cleanup="$base"
  # the worktree if it was added, else the empty folder (a --base-ref that does not resolve)
  trap 'safe_git "$head" worktree remove --force "$cleanup" >/dev/null 2>&1; rm -rf "$cleanup"' EXIT
  safe_git "$head" worktree add -q --detach "$base" "$base_ref" \
    || die "cannot check out --base-ref $base_ref (a revision of --head's repository: e.g. main, or origin/main once the remote is fetched)"
fi
[ -d "$base" ] || die "--base $base is not a directory"
base="$(cd "$base" && pwd)"

ledger=()
if [ -n "$xfails" ]; then
  case $xfails in
    /*) [ -f "$xfails" ] || die "--xfails $xfails: no such file"; ledger=(--xfails "$xfails") ;;
    *) [ -f "$head/$xfails" ] || die "--xfails $xfails: no such file in $head"; ledger=(--xfails "$head/$xfails") ;;
  esac
fi

# check SIDE CHECKOUT [check options]: a report in OUT/SIDE; returns check's exit code (0/1 are results,
# 2+ errors). Both sides run from the same directory, so they replay the same ./rlconform-corpus if any.
check() {
  local side="$1" checkout="$2" spec="$engine"
  shift 2
  case "$spec" in *.py) spec="$checkout/$spec" ;; esac
  echo "rlconform-pr: checking the $side ($checkout, $(safe_git "$checkout" rev-parse --short HEAD 2>/dev/null || echo 'not git'))"
  rlconform check --engine "$spec" --engine-path "$checkout" --out "$out/$side" "${ledger[@]}" -q "$@"
}

# coverage_note: the numerics functions the PR adds or edits that no op checks and no justification covers
# (`rlconform coverage --changed-since`), appended to the comment; nothing when there is none
coverage_note() {
  local spec="$engine" cov rc
  case "$spec" in *.py) spec="$head/$spec" ;; esac
  cov="$(rlconform coverage --engine "$spec" --engine-path "$head" --changed-since "$since" --format json --strict \
           2>/dev/null)"
  rc=$?
  if [ "$rc" -eq 1 ]; then  # the unbound functions' names and sites, read from the JSON's fields
    { echo; echo "### Numerics this PR adds or edits that no op checks"; echo
      echo "Bind them (or justify them in the binding's NOT_BOUND table); the workflow's \`rlconform coverage --strict\`"
      echo "step fails until then:"; echo
      printf '%s' "$cov" | "${PYTHON:-python3}" -c '
import json, sys
for item in json.load(sys.stdin).get("items") or ():
    if item.get("status") == "unbound":
        name, kind, site = item.get("name"), item.get("kind"), item.get("site") or "?"
        print(f"- `{name}` ({kind}, {site})")' \
        || echo "(the coverage report could not be read: see the job's log)"; } >> "$out/comment.md"
  fi
}

since="$base_ref"
[ -n "$since" ] || since="$(safe_git "$base" rev-parse HEAD 2>/dev/null)" || since=""
if [ "$all" = 1 ] || [ -z "$since" ]; then
  [ "$all" = 1 ] || echo "rlconform-pr: the base is not a git checkout: checking the whole catalog (--all)"
  check head "$head" "$@"; head_rc=$?
  [ "$head_rc" -ge 2 ] || { check base "$base" "$@"; base_rc=$?; }
else
  check head "$head" --changed-since "$since" "$@"; head_rc=$?
  if [ "$head_rc" -eq 0 ] && [ ! -f "$out/head/report.json" ] && [ -f "$out/head/selection.txt" ]; then
    { echo "<!-- rlconform -->"; echo "## rlconform: nothing to check"; echo
      echo "No engine function bound to the catalog (nor one it calls) changed since \`$since\`, and no ledger line"
      echo "the PR edits lists one: no verdict can have changed. (\`--all\` checks the whole catalog.)"; } > "$out/comment.md"
    coverage_note
    echo "rlconform-pr: nothing to check; comment in $out/comment.md"
    exit 0
  fi
  base_rc=2
  if [ "$head_rc" -lt 2 ] && [ -n "$base_report" ]; then
    base_commit="$(safe_git "$base" rev-parse "HEAD^{commit}" 2>/dev/null)" || base_commit="$since"
    if rlconform report "$base_report" --subset "$out/head/selection.json" --to "$out/base" \
         --expect-revision "$base_commit" --expect-engine "$engine"; then
      base_rc=0
    else
      echo "rlconform-pr: checking the base instead"
      rm -rf "$out/base"
    fi
  fi
  [ "$head_rc" -ge 2 ] || [ "$base_rc" -eq 0 ] || { check base "$base" --findings "$out/head/selection.txt" "$@"; base_rc=$?; }
fi
for side in head base; do
  rc_var="${side}_rc"
  if [ "${!rc_var:-2}" -ge 2 ] || [ ! -f "$out/$side/report.json" ]; then
    { echo "<!-- rlconform -->"; echo "## rlconform: the $side could not be checked"; echo
      echo "\`rlconform check\` exited ${!rc_var:-2} on the $side; see the job's log."; } > "$out/comment.md"
    die "the check of the $side exited ${!rc_var:-2}"
  fi
done

attribution=()
[ -f "$out/head/selection.json" ] && attribution=(--selection "$out/head/selection.json")
rlconform diff "$out/base" "$out/head" --fail-on "$fail_on" --markdown "$out/comment.md" --json "$out/diff.json" \
  --sarif "$out/rlconform.sarif" \
  --max-lines "${RLCONFORM_COMMENT_LINES:-60}" "${attribution[@]}"
rc=$?
[ -z "$since" ] || coverage_note
# every command of the comment must work pasted in the fork's checkout with the uploaded reports in $out
#: the checkouts' absolute paths become `.` (the head) and the base commit
"${PYTHON:-python3}" - "$out/comment.md" "$head" "$base" "$out" "$since" "${GITHUB_SERVER_URL:-}" \
    "${GITHUB_REPOSITORY:-}" "${GITHUB_RUN_ID:-}" <<'PY' || die "cannot rewrite $out/comment.md"
import os, sys
path, head, base, out, since, server, repo, run = sys.argv[1:9]
text = open(path).read()
rel = os.path.relpath(out, head) if out.startswith(head.rstrip("/") + "/") else out
fixed = f"--engine-path {base}" in text
text = text.replace(f"--engine-path {base}", "--engine-path .").replace(f"--engine-path {head}", "--engine-path .")
text = text.replace(out + "/", rel + "/")
if fixed:
    text += f"\nA fixed defect's command reproduces at the base: `git checkout {since or 'BASE'}` first.\n"
if server and repo and run:  # in CI: the report is the run's artifact
    text += (f"\nThe full report: `head/report.html` in the `rlconform-report` artifact of "
             f"[this run]({server}/{repo}/actions/runs/{run}); download it into `{rel}/` of your checkout and every "
             f"command above runs as printed.\n")
else:  # a local run: the report is already beside the comment
    text += f"\nThe full report: `{rel}/head/report.html`; every command above runs as printed from the checkout.\n"
open(path, "w").write("<!-- rlconform -->\n" + text if "<!-- rlconform -->" not in text else text)
PY
echo "rlconform-pr: comment in $out/comment.md, report in $out/head/report.html (diff exit $rc)"
exit "$rc"
