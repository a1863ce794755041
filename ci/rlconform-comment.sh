#!/usr/bin/env bash
# Post a Markdown file (default rlconform-ci/comment.md) as the pull request's rlconform comment
#. rlconform's own comment is found by the hidden marker `<!-- rlconform -->` (added
# to the file's first line when missing) and edited; without one a comment is added. Another workflow's
# comment of the same bot account is never touched.
#
#   ci/rlconform-comment.sh [FILE]
#
# Needs `gh`, GH_TOKEN, GITHUB_REPOSITORY (owner/name) and the PR number (PR_NUMBER, or read from
# $GITHUB_EVENT_PATH). Without them (a local run) it only says where the file is. When GitHub refuses the
# comment (a pull request from a fork runs with a read-only token), the comment goes to the job's summary
# ($GITHUB_STEP_SUMMARY) with a `::notice::` saying why. Exit code 0: the job's verdict is the diff's
# (ci/rlconform-pr.sh), never this step's.
set -uo pipefail
marker="<!-- rlconform -->"
file="${1:-rlconform-ci/comment.md}"
[ -f "$file" ] || { echo "rlconform-comment: no $file (the check did not get that far); nothing to post"; exit 0; }
if ! grep -qF "$marker" "$file"; then
  { echo "$marker"; cat "$file"; } > "$file.tmp" && mv "$file.tmp" "$file"
fi
pr="${PR_NUMBER:-}"
if [ -z "$pr" ] && [ -n "${GITHUB_EVENT_PATH:-}" ] && [ -f "$GITHUB_EVENT_PATH" ]; then
  pr="$(python3 -c 'import json, sys; print((json.load(open(sys.argv[1])).get("pull_request") or {}).get("number") or "")' "$GITHUB_EVENT_PATH")"
fi
repo="${GITHUB_REPOSITORY:-}"

summary() {  # the comment as the job summary, with a notice saying why it is not a PR comment
  echo "::notice title=rlconform::$1; the diff is in this job's summary"
  if [ -n "${GITHUB_STEP_SUMMARY:-}" ]; then
    cat "$file" >> "$GITHUB_STEP_SUMMARY"
  else
    echo "rlconform-comment: $1; the comment is $file"
  fi
  exit 0
}

if ! command -v gh >/dev/null || [ -z "${GH_TOKEN:-}" ] || [ -z "$pr" ] || [ -z "$repo" ]; then
  [ -n "${GITHUB_STEP_SUMMARY:-}" ] && summary "not posting (needs gh, GH_TOKEN, GITHUB_REPOSITORY and a pull request)"
  echo "rlconform-comment: not posting (needs gh, GH_TOKEN, GITHUB_REPOSITORY and a pull request); the comment is $file"
  exit 0
fi
# rlconform's own comment: the newest one holding the marker
own="$(gh api "repos/$repo/issues/$pr/comments" --paginate \
        --jq ".[] | select(.body | contains(\"$marker\")) | .id" 2>/dev/null | tail -n 1)"
if [ -n "$own" ]; then
  gh api -X PATCH "repos/$repo/issues/comments/$own" -F "body=@$file" >/dev/null 2>&1 && {
    echo "rlconform-comment: updated comment $own on pull request $pr"; exit 0; }
else
  gh pr comment "$pr" --repo "$repo" --body-file "$file" >/dev/null 2>&1 && {
    echo "rlconform-comment: commented on pull request $pr"; exit 0; }
fi
summary "GitHub refused the pull-request comment (a pull request from a fork has a read-only token)"
