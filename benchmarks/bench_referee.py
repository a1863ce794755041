"""Benchmark of the referee: the cost of judging a case in a referee process instead of the
engine's worker, per example, for a CI-sized entropy case and one at real vocabulary size.

For each case: ``off`` = the whole check in this process (``run_check_here``); ``on`` = the same judged by
a referee process (spawned here before the engine is loaded, as ``rlconform check`` does): the referee runs
the evaluation and sends each engine call back to this process, which makes it and answers with its
record. Off and on runs alternate (a load that changes during the run hits both); the medians are kept.
The engine is verl's ``entropy_from_logits`` when verl is installed, else the reference binding.

    .venv/bin/python benchmarks/bench_referee.py [--repeat 5] [--repeat-ci 30] [--rows 64] [--only ci|real]

Writes benchmarks/results/referee.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5, help="runs of each mode, real-vocabulary case")
    ap.add_argument("--repeat-ci", type=int, default=30, help="runs of each mode, CI-sized case")
    ap.add_argument("--only", choices=("ci", "real"), help="one case only (the results file is not written)")
    ap.add_argument("--rows", type=int, default=64, help="rows T of the real-vocabulary case [T, 151936]")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "referee.json"))
    args = ap.parse_args()

    from rlconform.harness.run.dispatch import referee_judge
    from rlconform.harness.workers import referee as referee_process
    from rlconform.properties import referee

    load_start = os.getloadavg()
    t0 = time.perf_counter()
    ref = referee_process.start(referee_judge, referee.check_clean)  # before any engine import
    startup = time.perf_counter() - t0

    import torch

    from rlconform.harness.bindings.load import load_engine
    from rlconform.properties.case import Case
    from rlconform.properties.checks import run_check, run_check_here

    try:
        binding = load_engine("verl", None)
        binding.resolve("entropy")
    except Exception:  # noqa: BLE001 - verl not installed
        binding = load_engine("reference", None)
    rng = np.random.default_rng(0)
    cases = {
        "ci [4, 8] fp32": Case("entropy", "matches_reference", "float32", "moderate",
                               {"logits": rng.standard_normal((4, 8)) * 3}),
        f"real vocab [{args.rows}, 151936] fp32": Case(
            "entropy", "matches_reference", "float32", "moderate",
            {"logits": torch.randn(args.rows, 151936, dtype=torch.float32).double().numpy() * 2}),
    }
    verdicts: dict = {}
    result = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__},
              "engine": binding.spec, "referee_startup_s": startup, "cases": {},
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load_average_start": load_start}
    for name, case in cases.items():
        if args.only and not name.startswith(args.only):
            continue
        runs = {"off": [], "on": []}
        for _ in range(args.repeat_ci if name.startswith("ci") else args.repeat):
            for mode in ("off", "on"):  # interleaved: a load that changes during the run hits both
                if mode == "on":
                    referee.connect(ref.address, ref.authkey)
                t = time.perf_counter()
                outcome = (run_check if mode == "on" else run_check_here)(binding, case)
                runs[mode].append(time.perf_counter() - t)
                referee.disconnect()
                verdicts[mode] = outcome.verdict
        timings = {mode: {"median_s": statistics.median(r), "runs": len(r), "verdict": verdicts[mode]}
                   for mode, r in runs.items()}
        timings["ratio"] = timings["on"]["median_s"] / timings["off"]["median_s"]
        result["cases"][name] = timings
        print(f"{name}: off {timings['off']['median_s'] * 1e3:.1f} ms, on {timings['on']['median_s'] * 1e3:.1f} ms "
              f"(x{timings['ratio']:.2f}), verdicts {timings['off']['verdict']} / {timings['on']['verdict']}")
    ref.close()
    print(f"referee start-up {startup:.2f} s")
    if args.only:
        return
    result["load_average"] = os.getloadavg()  # at the end (1, 5, 15 min)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
