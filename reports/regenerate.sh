#!/usr/bin/env bash
# Regenerate the published reports of the real engines, and their xfails ledgers.
#   bash reports/regenerate.sh [VENV]        (default .venv; run `make engines` first)
# Each engine is checked under the derandomized CI profile, so the same code gives the same report.
# A check exits 1 when it finds discrepancies: that is the expected outcome here, not an error.
set -uo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-.venv}
RL="$VENV/bin/rlconform"
status=0
for spec in "verl verl-0.9.1" "skyrl skyrl-0.4.0" "megatron megatron-core-0.19.2"; do
  set -- $spec
  engine=$1; dir=reports/$2
  rm -rf "$dir/cases" "$dir/report.json" "$dir/report.md" "$dir/report.html"
  "$RL" check --engine "$engine" --out "$dir" --profile ci -q
  rc=$?
  if [ "$rc" -ge 2 ]; then echo "[reports] $engine: check failed to run (exit $rc)" >&2; status=2; continue; fi
  "$RL" ledger "$dir/report.json" > "$dir/xfails.txt"
  "$RL" coverage --engine "$engine" --format md > "$dir/coverage.md" \
    || { echo "[reports] $engine: coverage table failed" >&2; status=2; }
  echo "[reports] $engine: $dir (exit $rc)"
done
exit $status
