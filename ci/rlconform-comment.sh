#!/usr/bin/env bash
# Post a Markdown file (default rlconform-ci/comment.md) as the pull request's rlconform comment
# (issue 12 §5): edits the last comment of this account if there is one, else adds one.
#
#   ci/rlconform-comment.sh [FILE]
#
# Needs `gh`, GH_TOKEN and the PR number (PR_NUMBER, or read from $GITHUB_EVENT_PATH). Without any of
# them (a local run) it only says where the file is. Exit code 0 unless gh fails.
set -uo pipefail
file="${1:-rlconform-ci/comment.md}"
[ -f "$file" ] || { echo "rlconform-comment: no $file (the check did not get that far); nothing to post"; exit 0; }
pr="${PR_NUMBER:-}"
if [ -z "$pr" ] && [ -n "${GITHUB_EVENT_PATH:-}" ] && [ -f "$GITHUB_EVENT_PATH" ]; then
  pr="$(python3 -c 'import json, sys; print((json.load(open(sys.argv[1])).get("pull_request") or {}).get("number") or "")' "$GITHUB_EVENT_PATH")"
fi
if ! command -v gh >/dev/null || [ -z "${GH_TOKEN:-}" ] || [ -z "$pr" ]; then
  echo "rlconform-comment: not posting (needs gh, GH_TOKEN and a pull request); the comment is $file"
  exit 0
fi
gh pr comment "$pr" --body-file "$file" --edit-last 2>/dev/null || gh pr comment "$pr" --body-file "$file"
