"""Time to detect: for every mutant, how many examples the CI profile runs before the first failing one,
per failing finding of the property that must catch it (median and max), and the wall time.

    python benchmarks/bench_time_to_detect.py [--profile ci] [--out benchmarks/results/time_to_detect.json]
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import subprocess
import sys
import tempfile
import time

from rlconform.harness.bindings.load import mutant_names


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--profile", default="ci")
    ap.add_argument("--out", default="benchmarks/results/time_to_detect.json")
    ap.add_argument("--mutant", action="append", default=[])
    args = ap.parse_args()
    results = {}
    for name in args.mutant or mutant_names():
        pairs = importlib.import_module(f"rlconform.harness.mutants.{name}").EXPECTED
        with tempfile.TemporaryDirectory() as out:
            cmd = [sys.executable, "-m", "rlconform.harness.cli", "check", "--engine", f"mutants.{name}",
                   "--profile", args.profile, "--out", out, "-q"]
            for op in sorted({op for op, _ in pairs}):
                cmd += ["--op", op]
            for prop in sorted({p for _, p in pairs}):
                cmd += ["--property", prop]
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True)
            wall = time.perf_counter() - t0
            with open(f"{out}/report.json") as fh:
                doc = json.load(fh)
        firsts = [f["examples_to_first_failure"] for f in doc["findings"]
                  if (f["op"], f["property"]) in set(map(tuple, pairs)) and f["status"] in ("discrepancy", "crash")
                  and f.get("examples_to_first_failure")]
        checked = [f for f in doc["findings"] if (f["op"], f["property"]) in set(map(tuple, pairs))]
        results[name] = {
            "expected": [list(p) for p in pairs], "exit_code": proc.returncode, "wall_s": round(wall, 2),
            "findings_checked": len(checked), "findings_failing": len(firsts),
            "examples_to_first_failure_median": statistics.median(firsts) if firsts else None,
            "examples_to_first_failure_max": max(firsts) if firsts else None,
        }
        print(name, results[name], flush=True)
    with open(args.out, "w") as fh:
        json.dump({"profile": args.profile, "mutants": results}, fh, indent=1)


if __name__ == "__main__":
    main()
