#!/usr/bin/env bash
# Regenerate the published reports of the real engines, and their xfails ledgers.
#   bash reports/regenerate.sh [VENV [ENGINE...]]   (default .venv and all three; run `make engines` first)
#   e.g. bash reports/regenerate.sh .venv skyrl megatron
# Each engine is checked under the derandomized CI profile, so the same code gives the same report.
# A check exits 1 when it finds discrepancies: that is the expected outcome here, not an error.
set -uo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-.venv}
shift $(( $# > 0 ? 1 : 0 ))
ONLY=" $* "
for e in "$@"; do
  case $e in verl|skyrl|megatron) ;; *) echo "[reports] unknown engine '$e' (verl, skyrl, megatron)" >&2; exit 2;; esac
done
# CHECK_ARGS: extra arguments of each check (default two engine workers, as make check-verl)
CHECK_ARGS=${CHECK_ARGS:--n 2}
RL="$VENV/bin/rlconform"
status=0
for spec in "verl verl-0.9.1" "skyrl skyrl-0.4.0" "megatron megatron-core-0.19.2"; do
  set -- $spec
  engine=$1; dir=reports/$2
  if [ "$ONLY" != "  " ] && [[ "$ONLY" != *" $engine "* ]]; then continue; fi
  rm -rf "$dir/cases" "$dir/report.json" "$dir/report.md" "$dir/report.html"
  "$RL" check --engine "$engine" --out "$dir" --profile ci -q $CHECK_ARGS
  rc=$?
  if [ "$rc" -ge 2 ]; then echo "[reports] $engine: check failed to run (exit $rc)" >&2; status=2; continue; fi
  # the new ledger: every failing finding, and every marginal one above the band's centre (see
  # harness/core/tolerance.py: a verdict that another CPU's last bits could move past the band stays green)
  "$RL" ledger "$dir/report.json" > "$dir/xfails.txt.new" && mv "$dir/xfails.txt.new" "$dir/xfails.txt"
  "$RL" coverage --engine "$engine" --format md > "$dir/coverage.md" \
    || { echo "[reports] $engine: coverage table failed" >&2; status=2; }
  "$RL" audit --engine "$engine" --report "$dir" > "$dir/audit.md" \
    || { echo "[reports] $engine: audit failed" >&2; status=2; }
  echo "[reports] $engine: $dir (exit $rc)"
done
exit $status
