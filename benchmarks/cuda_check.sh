#!/usr/bin/env bash
# verl's token statistics, fused kernels (the torch FusedLinearForPPO and the Triton
# linear_cross_entropy) and agg_loss checked on CUDA, plus one real-shape finding ([4096, 151936] bf16, wall
# time and peak GPU memory). Fits one device call of at most 8 minutes; needs no network. See docs/cuda.md.
#
#   benchmarks/cuda_check.sh prepare        here, on the machine with .venv (and network for the wheels):
#                                           fills $CARRY with verl's source tree and its import dependencies
#   benchmarks/cuda_check.sh [run] [OUTDIR] on the GPU machine, from the repository root, with $CARRY carried:
#                                           writes OUTDIR (default reports/verl-0.9.1-cuda): report.json,
#                                           report.md, report.html, xfails.txt (its ledger), real_shape.json,
#                                           device_checks.txt; copies them to $OUT too when $OUT is set
#
# Environment: CARRY (default build/cuda-carry), PY (default python3), DEVICE (default cuda), WORKERS (engine
# worker processes, default 4), CHECK_S / SHAPE_S / MUTANT_S (time limits of the three steps, default
# 300 / 120 / 60 seconds: 8 minutes in all).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
CARRY=${CARRY:-build/cuda-carry}
PY=${PY:-python3}
DEVICE=${DEVICE:-cuda}
WORKERS=${WORKERS:-4}
CHECK_S=${CHECK_S:-300}
SHAPE_S=${SHAPE_S:-120}
MUTANT_S=${MUTANT_S:-60}
MODE=run
if [ "${1:-}" = prepare ] || [ "${1:-}" = run ]; then MODE=$1; shift; fi

# pure-Python packages verl imports on `import verl` (copied as source) and the compiled ones (wheels for the
# GPU machine's Python, downloaded by `prepare`; see docs/cuda.md for the size limit)
PURE="verl omegaconf antlr4 codetiming pyvers dill jsonschema jsonschema_specifications referencing"
WHEELS="tensordict orjson rpds-py ray"

if [ "$MODE" = prepare ]; then
  VENV=${VENV:-.venv}
  SITE=$(ls -d "$VENV"/lib/python3*/site-packages | head -n1)
  rm -rf "$CARRY"; mkdir -p "$CARRY/site" "$CARRY/wheels"
  for p in $PURE; do
    if [ -d "$SITE/$p" ]; then cp -r "$SITE/$p" "$CARRY/site/"; else echo "[cuda] prepare: $p not in $SITE" >&2; fi
  done
  find "$CARRY/site" -name __pycache__ -prune -exec rm -rf {} +
  for w in $WHEELS; do
    v=$("$VENV/bin/python" -m pip show "$w" 2>/dev/null | sed -n 's/^Version: //p')
    "$VENV/bin/python" -m pip download -q --no-deps --only-binary=:all: --python-version "${GPU_PYTHON:-3.12}" \
      --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 -d "$CARRY/wheels" "$w${v:+==$v}" \
      || echo "[cuda] prepare: no wheel of $w${v:+==$v} for the GPU machine's Python" >&2
  done
  du -sh "$CARRY" "$CARRY"/* >&2
  echo "[cuda] prepare: $CARRY ready; carry it (and nothing over 64 MiB in all) to the GPU machine" >&2
  exit 0
fi

OUTDIR=${1:-reports/verl-0.9.1-cuda}
"$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 2)" \
  || { echo "[cuda] no CUDA device here (torch.cuda.is_available() is False)" >&2; exit 2; }
# rlconform from this checkout (a namespace package mapped folder by folder, as pyproject.toml maps it)
NS=$(mktemp -d /tmp/rlconform-ns.XXXXXX)
mkdir -p "$NS/rlconform"
for d in harness properties reference distributed_tests; do ln -s "$ROOT/$d" "$NS/rlconform/$d"; done
SITE_W=$NS/site
if ls "$CARRY"/wheels/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE_W" "$CARRY"/wheels/*.whl \
    || { echo "[cuda] the carried wheels did not install" >&2; exit 2; }
fi
export PYTHONPATH="$NS:$ROOT/$CARRY/site:$SITE_W${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 RLCONFORM_DEVICE=$DEVICE
RL=("$PY" -m rlconform.harness.cli)
"$PY" -c "import verl, rlconform.harness.cli" || { echo "[cuda] verl or rlconform does not import" >&2; exit 2; }
mkdir -p "$OUTDIR"
rm -rf "$OUTDIR/cases" "$OUTDIR/report.json" "$OUTDIR/report.md" "$OUTDIR/report.html"
t0=$(date +%s)

# 1. the CI-profile check on the GPU, narrowed to the token statistics, the fused kernels and agg_loss
timeout -k 10 "$CHECK_S" "${RL[@]}" check --engine verl --device "$DEVICE" --profile ci -q -n "$WORKERS" \
  --op entropy --op token_logprobs --op sum_pi_squared --op fused_linear_token_stats --op agg_loss \
  --timeout 120 --out "$OUTDIR"
rc_check=$?
"${RL[@]}" ledger "$OUTDIR/report.json" > "$OUTDIR/xfails.txt" || echo "[cuda] ledger failed" >&2
t1=$(date +%s)

# 2. the guards on device tensors: a mutant that writes into its input must still fail non_destructive
{
  echo "device checks, $(date -u +%FT%TZ), device $DEVICE"
  timeout -k 5 "$MUTANT_S" "${RL[@]}" check --engine mutants.forward_inplace --device "$DEVICE" -q \
    --op token_logprobs --property non_destructive --dtype float32 --max-examples 5 --out "$NS/mutant" >/dev/null 2>&1
  rc_m=$?
  echo "mutants.forward_inplace token_logprobs non_destructive on $DEVICE: exit $rc_m (1 expected: the mutation is found)"
  "$PY" - "$NS/mutant/report.json" <<'EOF'
import json, sys
try:
    doc = json.load(open(sys.argv[1]))
except OSError as exc:
    print(f"  no report: {exc}"); sys.exit(0)
for f in doc["findings"]:
    print(f"  {f['id']}: {f['status']}: {(f.get('message') or '').splitlines()[0][:200] if f.get('message') else ''}")
EOF
} > "$OUTDIR/device_checks.txt" 2>&1
t2=$(date +%s)

# 3. one real-shape finding: [4096, 151936] bf16, wall time and peak GPU memory
timeout -k 5 "$SHAPE_S" "$PY" benchmarks/cuda_real_shape.py --out "$OUTDIR/real_shape.json"
rc_shape=$?
t3=$(date +%s)
{
  echo "check: exit $rc_check, $((t1 - t0)) s (limit $CHECK_S)"
  echo "device checks: $((t2 - t1)) s (limit $MUTANT_S)"
  echo "real shape: exit $rc_shape, $((t3 - t2)) s (limit $SHAPE_S)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /'
} | tee -a "$OUTDIR/device_checks.txt"
if [ -n "${OUT:-}" ] && [ -d "${OUT:-}" ]; then
  for f in report.json report.md report.html xfails.txt real_shape.json device_checks.txt; do
    [ -f "$OUTDIR/$f" ] && cp "$OUTDIR/$f" "$OUT/"
  done
fi
rm -rf "$NS"
[ "$rc_check" -ge 2 ] && exit 2
exit 0
