"""One real-shape finding on CUDA: verl's ``entropy`` (``entropy_from_logits``) and
``token_logprobs`` on bf16 logits ``[T, V] = [4096, 151936]`` (Qwen2's vocabulary), checked against the float64
CPU reference exactly as ``rlconform check --device cuda`` checks them (inputs drawn on the CPU, moved to the
GPU for the engine call, outputs back), with the wall time of each check and the peak GPU memory
(``torch.cuda.max_memory_allocated``) of the engine's and the faithful path's device work.

    RLCONFORM_DEVICE=cuda python3 benchmarks/cuda_real_shape.py --out reports/verl-0.9.1-cuda/real_shape.json

Needs a CUDA device (exit 2 with one line otherwise) and verl importable. Writes one JSON object:
``{"device": ..., "cases": [{"finding", "shape", "verdict", "max_abs_err", "max_rel_err", "ratio", "wall_s",
"peak_gpu_bytes"}]}``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

T, V = 4096, 151936


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--engine", default="verl")
    ap.add_argument("--rows", type=int, default=T)
    ap.add_argument("--vocab", type=int, default=V)
    ap.add_argument("--smoke", action="store_true", help="allow a CPU run (a smoke test of this script, small --rows)")
    args = ap.parse_args()

    from rlconform.harness.core import device

    try:
        dev = device.check_available(os.environ.get(device.ENV) or "cuda")
    except device.DeviceError as exc:
        print(f"cuda_real_shape: error: {exc}", file=sys.stderr)
        return 2
    cuda = device.is_cuda(dev)
    if not cuda and not args.smoke:
        print("cuda_real_shape: error: set RLCONFORM_DEVICE=cuda[:N] (this benchmark is of a CUDA run)",
              file=sys.stderr)
        return 2
    os.environ[device.ENV] = dev
    import numpy as np
    import torch

    from rlconform.harness.bindings.load import load_engine
    from rlconform.harness.core.generated import LogitsGen
    from rlconform.properties.case import Case
    from rlconform.properties.checks import run_check_here

    binding = load_engine(args.engine, None)
    rng = np.random.default_rng(27)
    gen = LogitsGen(27, (args.rows, args.vocab), peak=20.0, tail_scale=2.0, decay=0.9, offset=0.0, head_tokens=4)
    labels = np.where(rng.random(args.rows) < 0.5, gen.head()[:, 0],
                      rng.integers(0, args.vocab, size=args.rows)).astype(np.int64)
    inputs = {"logits": gen, "labels": labels, "grad_output": rng.uniform(-1.0, 1.0, size=args.rows)}
    results = []
    for op in ("entropy", "token_logprobs"):
        case = Case(op, "matches_reference", "bfloat16", "real_shapes", dict(inputs))
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        outcome = run_check_here(binding, case)
        if cuda:
            torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        results.append({"finding": case.finding_id, "shape": [args.rows, args.vocab], "verdict": outcome.verdict,
                        "max_abs_err": outcome.max_abs_err, "max_rel_err": outcome.max_rel_err,
                        "ratio": outcome.ratio, "message": (outcome.message or "")[:2000], "wall_s": round(wall, 3),
                        "peak_gpu_bytes": int(torch.cuda.max_memory_allocated()) if cuda else None})
        peak = results[-1]["peak_gpu_bytes"]
        print(f"{case.finding_id}: {outcome.verdict}, {wall:.1f} s" + (
            f", peak GPU memory {peak / 2**30:.2f} GiB" if peak is not None else ""), flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump({"device": device.describe(dev), "engine": args.engine, "cases": results}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
