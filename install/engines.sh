#!/usr/bin/env bash
# Install the real engines that rlconform binds, at their tested versions, into an existing venv,
# keeping torch the CPU 2.13.0 build.
#
#   install/engines.sh PYTHON [verl|skyrl|megatron|all]     (default: all)
#   e.g. install/engines.sh .venv/bin/python all
#
# Each engine is installed without its declared dependencies (they pin CUDA torch, vllm, wandb,
# jax[cuda], ...); what its numerics modules import is installed from install/<engine>.txt, fully
# pinned, under install/constraints.txt (torch==2.13.0, numpy<2.5). Idempotent: when the engine and
# every pin in its file are already installed, nothing is run (an offline check, < 1 s).
# Afterwards the script fails if torch changed or any nvidia-* / triton package appeared.
#
# Needs only PyPI. Measured on a 2-core machine: into the rlconform venv 29 s, +728 MB; into a bare
# venv holding only torch 2.13.0+cpu, with no pip cache, 45 s, +746 MB; a second run is a ~0.3 s no-op.
#
# Expected noise: pip's "dependency conflicts" notice lists what verl/skyrl declare but do not need for
# the modules we bind (accelerate, hydra-core, peft, wandb, hf_transfer, zstandard, ...), and
# "skyrl requires tokenizers>=0.23.1": verl 0.9.1 needs transformers<5.11, whose tokenizers cap is
# 0.23.0, so the two engines' declared ranges cannot both hold in one venv; no bound op uses
# tokenizers.
set -euo pipefail

usage() { echo "usage: $0 PYTHON [verl|skyrl|megatron|all]" >&2; exit 2; }
[[ $# -ge 1 && $# -le 2 ]] || usage
PY=$1
WHAT=${2:-all}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CONSTRAINTS="$HERE/constraints.txt"
[[ -x "$PY" ]] || { echo "not an executable python: $PY" >&2; exit 2; }

# engine -> (pin, extra pip flags for the engine itself)
declare -A PIN=([verl]="verl==0.9.1" [skyrl]="skyrl==0.4.0" [megatron]="megatron-core==0.19.2")
# verl declares python <3.13 (fine on 3.11); skyrl and megatron-core declare >=3.12 but their code
# paths we bind run on 3.11 (see harness/bindings/_compat.py for the two shims they need).
declare -A FLAGS=([verl]="--no-deps" [skyrl]="--no-deps --ignore-requires-python"
                  [megatron]="--no-deps --ignore-requires-python")

case "$WHAT" in
  all) ENGINES=(verl skyrl megatron) ;;
  verl|skyrl|megatron) ENGINES=("$WHAT") ;;
  *) usage ;;
esac

# pip's output goes to a log, not the terminal: on success it holds only resolver notices (see above),
# which read like failures ("ERROR: pip's dependency resolver ..."); on failure its tail is shown.
LOG=${RLCONFORM_INSTALL_LOG:-$(dirname "$PY")/../rlconform-engines-install.log}
pip_() {
  if ! "$PY" -m pip --disable-pip-version-check "$@" >>"$LOG" 2>&1; then
    echo "[engines] pip failed; the last lines of $LOG:" >&2
    tail -n 30 "$LOG" >&2
    exit 1
  fi
}

# Offline check: are the engine pin and every `name==version` line of its requirement file installed?
satisfied() {
  "$PY" - "${PIN[$1]}" "$HERE/$1.txt" <<'PYEOF'
import re, sys
from importlib.metadata import version, PackageNotFoundError
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
lines = [sys.argv[1]] + [l.split("#")[0].strip() for l in open(sys.argv[2])]
for line in filter(None, lines):
    m = re.fullmatch(r"([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?==([^;\s]+)", line)
    if not m:
        continue  # a range (e.g. numpy<2.5) is left to pip on a real install
    name, want = m.groups()
    try:
        have = version(norm(name))
    except PackageNotFoundError:
        sys.exit(1)
    if have.split("+")[0] != want:
        sys.exit(1)
PYEOF
}

torch_before=$("$PY" -c 'import importlib.metadata as m; print(m.version("torch"))')

for e in "${ENGINES[@]}"; do
  if satisfied "$e"; then
    echo "[engines] $e: ${PIN[$e]} and install/$e.txt already installed"
    continue
  fi
  echo "[engines] $e: installing ${PIN[$e]} (${FLAGS[$e]}) and install/$e.txt"
  # shellcheck disable=SC2086
  pip_ install -q -c "$CONSTRAINTS" ${FLAGS[$e]} "${PIN[$e]}"
  # The requirement files are fully pinned; --no-deps would also be correct, resolving keeps pip's
  # own consistency check.
  pip_ install -q -c "$CONSTRAINTS" -r "$HERE/$e.txt"
  if grep -q "dependency conflicts\|requires tokenizers" "$LOG" 2>/dev/null; then
    echo "[engines] $e: pip's dependency-conflict notices were ignored on purpose (what the engine declares but the"
    echo "          bound modules do not import; see install/engines.sh); full pip output in $LOG"
  fi
done

# Guard: torch must be the same CPU build, and no GPU stack may have come in.
"$PY" - "$torch_before" <<'PYEOF'
import sys
from importlib.metadata import distributions, version
before = sys.argv[1]
after = version("torch")
bad = sorted(d.metadata["Name"] for d in distributions()
             if d.metadata["Name"] and (d.metadata["Name"].lower().startswith(("nvidia-", "nvidia_"))
                                       or d.metadata["Name"].lower() in ("triton", "pytorch-triton")))
if after != before or bad:
    sys.exit(f"[engines] GPU stack leaked in: torch {before} -> {after}; packages: {bad}")
print(f"[engines] ok: torch {after}, no nvidia-*/triton packages")
PYEOF
