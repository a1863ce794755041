"""Speed and peak memory of the float64 reference softmax statistics on LLM-sized logits.

Times logsumexp, token_logprobs, entropy, sum_pi_squared on ``[T, V]`` float32 logits (V = 151936,
Qwen's vocab) for each T in --sizes, and their closed-form gradients for T in --grad-sizes. Each op
runs in a fresh subprocess: it allocates the inputs (in place, no float64 temporaries), reads
``ru_maxrss`` as the baseline, runs the op once, and reads ``ru_maxrss`` again. The extra-memory ratio
is (peak − baseline − output bytes) / input bytes; the design target is ≤ 0.25 for the statistics
(their output is ``[T]``); a gradient's own ``[T, V]`` float64 output (2× the fp32 input) is reported
separately and not counted as "extra".

    python benchmarks/bench_reference.py                      # T in 256, 1024, 4096; grads at 256
    python benchmarks/bench_reference.py --sizes 256 --out /tmp/r.json

Writes JSON to --out (default benchmarks/results/reference.json) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

STATS = ("logsumexp", "token_logprobs", "entropy", "sum_pi_squared")
TARGET_RATIO = 0.25
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "reference.json"


def _maxrss_bytes() -> int:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss if sys.platform == "darwin" else rss * 1024  # Linux reports KiB


def worker(op: str, rows: int, vocab: int, seed: int) -> dict:
    import numpy as np

    import rlconform.reference as R

    rng = np.random.default_rng(seed)
    x = np.empty((rows, vocab), dtype=np.float32)
    step = max(1, (64 << 20) // (vocab * 4))
    for r0 in range(0, rows, step):
        rng.standard_normal(out=x[r0:r0 + step], dtype=np.float32)
    x *= 3.0
    labels = rng.integers(0, vocab, size=rows)
    fn = getattr(R, op)
    args = (x, labels) if op.startswith("token_logprobs") else (x,)
    baseline = _maxrss_bytes()
    t0 = time.perf_counter()
    out = fn(*args)
    wall = time.perf_counter() - t0
    peak = _maxrss_bytes()
    assert np.isfinite(out).all()
    return {"op": op, "T": rows, "V": vocab, "dtype": "float32", "wall_s": wall, "input_bytes": int(x.nbytes),
            "output_bytes": int(out.nbytes), "baseline_rss_bytes": baseline, "peak_rss_bytes": peak}


def run_one(op: str, rows: int, vocab: int, seed: int) -> dict:
    cmd = [sys.executable, __file__, "--worker", op, "--rows", str(rows), "--vocab", str(vocab), "--seed", str(seed)]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"{op} T={rows} failed:\n{res.stderr}")
    rec = json.loads(res.stdout.strip().splitlines()[-1])
    extra = rec["peak_rss_bytes"] - rec["baseline_rss_bytes"] - rec["output_bytes"]
    rec["extra_bytes"] = max(extra, 0)
    rec["extra_ratio"] = rec["extra_bytes"] / rec["input_bytes"]
    rec["is_grad"] = op.endswith("_grad")
    rec["meets_target"] = rec["extra_ratio"] <= TARGET_RATIO
    return rec


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="256,1024,4096", help="comma-separated T values for the statistics")
    ap.add_argument("--grad-sizes", default="256", help="comma-separated T values for the gradients ('' = none)")
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--ops", default=",".join(STATS), help="comma-separated statistics to time")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--rows", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        print(json.dumps(worker(a.worker, a.rows, a.vocab, a.seed)))
        return 0

    from rlconform.reference import softmax_stats as S

    ops = [o for o in a.ops.split(",") if o]
    plan = [(op, int(t)) for t in a.sizes.split(",") if t for op in ops]
    plan += [(op + "_grad", int(t)) for t in a.grad_sizes.split(",") if t for op in ops]
    results = []
    print(f"{'op':<22}{'T':>6}{'wall s':>9}{'input MB':>10}{'extra MB':>10}{'ratio':>8}  target")
    for op, rows in plan:
        rec = run_one(op, rows, a.vocab, a.seed)
        results.append(rec)
        print(f"{op:<22}{rows:>6}{rec['wall_s']:>9.2f}{rec['input_bytes'] / 1e6:>10.1f}"
              f"{rec['extra_bytes'] / 1e6:>10.1f}{rec['extra_ratio']:>8.3f}  {'ok' if rec['meets_target'] else 'MISS'}",
              flush=True)
    import numpy

    doc = {
        "benchmark": "rlconform.reference softmax statistics, float32 logits [T, V]",
        "target_extra_ratio": TARGET_RATIO,
        "chunking": {"work_arrays": S._WORK_ARRAYS, "max_chunk_bytes": S._MAX_CHUNK_BYTES,
                     "input_fraction": S._INPUT_FRACTION},
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "numpy": numpy.__version__,
                    "cpus": os.cpu_count()},
        "all_meet_target": all(r["meets_target"] for r in results),
        "results": results,
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {a.out}")
    return 0 if doc["all_meet_target"] else 1


if __name__ == "__main__":
    sys.exit(main())
