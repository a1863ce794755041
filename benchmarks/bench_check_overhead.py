"""Benchmark of what a ``rlconform check`` costs before it checks anything: a check of one finding with
four examples of a trivial binding, run as the self-tests and a pull request's check run it, in three ways:

* ``in process``: the reference engine with ``-n 0`` (rlconform's own code, no engine worker, no referee);
* ``worker, no referee``: a binding file (``tests/bindings/scaled_error.py``) in one engine worker,
  ``--no-referee``;
* ``worker and referee``: the same binding judged by its referee, the default for any engine.

Each is a fresh ``python -m rlconform.harness.cli`` process; the modes alternate (a load that changes during
the run hits all of them) and the medians of wall and CPU seconds (user + system of the command and every
process it started) are kept. CPU seconds are the figure to compare: they do not move with the machine's
load. The difference between the modes is process start-up: interpreters importing torch, pytest and the
catalog, the engine's metadata probe.

    .venv/bin/python benchmarks/bench_check_overhead.py [--repeat 5]

Writes benchmarks/results/check_overhead.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BINDING = ROOT / "tests" / "bindings" / "scaled_error.py"
FINDING = ["--op", "masked_sum", "--property", "matches_reference", "--dtype", "float64", "--regime", "padded",
           "--max-examples", "4", "-q"]
MODES = {
    "in process": ["--engine", "reference", "-n", "0"],
    "worker, no referee": ["--engine", str(BINDING), "-n", "1", "--no-referee"],
    "worker and referee": ["--engine", str(BINDING), "-n", "1"],
}


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_once(extra: list[str]) -> tuple[float, float, int]:
    """(wall s, CPU s, exit code) of one check."""
    with tempfile.TemporaryDirectory() as out:
        cpu0, t0 = _children_cpu(), time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "rlconform.harness.cli", "check", *extra, *FINDING,
                               "--out", out], capture_output=True, text=True)
        wall, cpu = time.perf_counter() - t0, _children_cpu() - cpu0
    if proc.returncode not in (0, 1):
        raise SystemExit(f"check {' '.join(extra)} exited {proc.returncode}:\n{proc.stderr[-2000:]}")
    return wall, cpu, proc.returncode


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5, help="runs of each mode")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "check_overhead.json"))
    args = ap.parse_args()
    load_start = os.getloadavg()
    runs: dict[str, list] = {m: [] for m in MODES}
    for _ in range(args.repeat):
        for mode, extra in MODES.items():
            runs[mode].append(run_once(extra))
    import torch

    result = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__},
        "finding": " ".join(FINDING),
        "modes": {m: {"median_wall_s": statistics.median(w for w, _, _ in r),
                      "median_cpu_s": statistics.median(c for _, c, _ in r), "runs": len(r)}
                  for m, r in runs.items()},
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load_average_start": list(load_start),
        "load_average_end": list(os.getloadavg()),
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    for m, r in result["modes"].items():
        print(f"{m:20s} wall {r['median_wall_s']:6.2f} s   CPU {r['median_cpu_s']:6.2f} s")


if __name__ == "__main__":
    main()
