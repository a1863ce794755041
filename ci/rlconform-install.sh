#!/usr/bin/env bash
# Install what a fork's rlconform check needs on a CI runner, without a CUDA torch:
#   1. CPU torch, the version install/constraints.txt pins, from the CPU wheel index (skipped when that
#      version is already installed);
#   2. rlconform from this repository, with install/constraints.txt, and what the engine's bound modules
#      import (install/<engine>.txt for verl, skyrl, megatron);
#   3. the fork itself, editable and without its declared dependencies (they pin a CUDA torch and serving
#      stacks the numerics modules never import).
#
#   ci/rlconform-install.sh [--engine verl|skyrl|megatron|SPEC] [--requirements ENGINE] [--fork DIR]
#                           [--torch-index URL] [--dry-run]
#
#   --engine       picks install/<engine>.txt; any other spec (module:attr, file.py) installs none
#   --requirements the stock engine whose install/<engine>.txt a binding file of a fork needs (verl, ...)
#   --fork         the fork's checkout (default: .); `none`, or a folder without pyproject.toml / setup.py,
#                  installs no fork
#   --torch-index  default https://download.pytorch.org/whl/cpu
#   --dry-run      print the commands instead of running them
# Environment: PYTHON (default python3). Exit code: 0 installed, 2 usage, else pip's.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo_root="$(cd "$here/.." && pwd)"
engine="" requirements="" fork="." torch_index="https://download.pytorch.org/whl/cpu" dry=0
while [ $# -gt 0 ]; do
  case "$1" in
    --engine) engine="$2"; shift 2 ;;
    --requirements) requirements="$2"; shift 2 ;;
    --fork) fork="$2"; shift 2 ;;
    --torch-index) torch_index="$2"; shift 2 ;;
    --dry-run) dry=1; shift ;;
    *) echo "rlconform-install: unknown argument $1" >&2; exit 2 ;;
  esac
done
py="${PYTHON:-python3}"
constraints="$repo_root/install/constraints.txt"
torch_pin="$(grep -E '^torch==' "$constraints" | head -n 1)"
[ -n "$torch_pin" ] || { echo "rlconform-install: no torch pin in $constraints" >&2; exit 2; }
torch_version="${torch_pin#torch==}"

run() {
  echo "+ $*"
  [ "$dry" = 1 ] || "$@"
}

installed="$("$py" -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null || true)"
if [ "$installed" = "$torch_version" ]; then
  echo "rlconform-install: torch $torch_version already installed"
else
  run "$py" -m pip install "$torch_pin" --index-url "$torch_index"
fi

reqs=()
case "${requirements:-$engine}" in
  verl|skyrl|megatron) reqs=(-r "$repo_root/install/${requirements:-$engine}.txt") ;;
  "") ;;
  *) [ -z "$requirements" ] || { echo "rlconform-install: no install/$requirements.txt" >&2; exit 2; } ;;
esac
run "$py" -m pip install -c "$constraints" "$repo_root" "${reqs[@]}"

if [ "$fork" = none ]; then
  echo "rlconform-install: no fork installed (--fork none)"
elif [ -f "$fork/pyproject.toml" ] || [ -f "$fork/setup.py" ]; then
  run "$py" -m pip install --no-deps -e "$fork"
else
  echo "rlconform-install: $fork has no pyproject.toml or setup.py; the check imports it from --engine-path"
fi
