"""Benchmark of the persistent worker pool (rlconform.harness.workers.pool).

Measures, for world 2 and 4 on gloo/CPU:
* start-up time of a pool (spawn + torch import + TCPStore rendezvous + gloo init + barrier);
* cases/s of a small all_reduce case on the persistent pool;
* cases/s when every case gets a fresh process group instead (spawn + init + one collective + teardown);
* failure detection latency: hang (time past the deadline), SIGKILL, raise; and the rebuild time after;
* a case that raises on every rank (an engine rejecting its input): the group is kept after a health
  check, so the next case costs a round trip, not a respawn (which in a real run also re-imports the
  engine and recompiles its kernels: 15–40 s for verl's vocab-parallel entropy on 2 busy cores).

    .venv/bin/python benchmarks/bench_pool.py [--cases 200] [--fresh 3]

Writes benchmarks/results/pool.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch

from rlconform.harness.workers import pool_cases as pc
from rlconform.harness.workers.pool import RankFailure, WorkerPool

CASE = {"dtype": "float32", "values": [1.0, 2.0, 3.0, 4.0]}


def bench_world(world: int, n_cases: int, n_fresh: int) -> dict:
    out: dict = {"world_size": world}
    with WorkerPool(world, timeout_s=30.0) as pool:
        t0 = time.perf_counter()
        pool.start()
        out["startup_s"] = time.perf_counter() - t0
        pool.run(pc.allreduce_sum, CASE)  # warm-up
        t0 = time.perf_counter()
        for _ in range(n_cases):
            pool.run(pc.allreduce_sum, CASE)
        dt = time.perf_counter() - t0
        out["persistent"] = {"cases": n_cases, "seconds": dt, "cases_per_s": n_cases / dt, "ms_per_case": 1e3 * dt / n_cases}

    fresh = []
    for _ in range(n_fresh):
        t0 = time.perf_counter()
        with WorkerPool(world, timeout_s=30.0) as p:
            p.run(pc.allreduce_sum, CASE)
        fresh.append(time.perf_counter() - t0)
    out["fresh_group_per_case"] = {
        "cases": n_fresh,
        "seconds_each": fresh,
        "cases_per_s": n_fresh / sum(fresh),
        "ms_per_case": 1e3 * statistics.mean(fresh),
    }
    out["speedup"] = out["persistent"]["cases_per_s"] / out["fresh_group_per_case"]["cases_per_s"]
    return out


def bench_failures(world: int = 2, hang_deadline_s: float = 2.0) -> dict:
    res = {"world_size": world, "hang_deadline_s": hang_deadline_s}
    with WorkerPool(world, timeout_s=30.0) as pool:
        pool.start()
        for name, fn, payload, timeout in [
            ("hang", pc.hang_on, {"rank": 1}, hang_deadline_s),
            ("sigkill", pc.sigkill_on, {"rank": 0}, 30.0),
            ("raise", pc.raise_on, {"rank": 1, "msg": "bench"}, 30.0),
        ]:
            t0 = time.perf_counter()
            try:
                pool.run(fn, payload, timeout_s=timeout)
            except RankFailure as e:
                kind = e.kind
            else:
                raise AssertionError(f"{name} did not fail")
            total = time.perf_counter() - t0
            t1 = time.perf_counter()
            pool.run(pc.allreduce_sum, CASE)  # rebuild + one case
            rebuild = time.perf_counter() - t1
            entry = {"kind": kind, "raise_after_s": total, "rebuild_plus_case_s": rebuild}
            if name == "hang":
                entry["past_deadline_s"] = total - hang_deadline_s
            res[name] = entry
        kept = pool.groups_kept
        t0 = time.perf_counter()
        try:
            pool.run(pc.raise_everywhere, {"msg": "bench"}, timeout_s=30.0)
        except RankFailure:
            pass
        total = time.perf_counter() - t0
        t1 = time.perf_counter()
        pool.run(pc.allreduce_sum, CASE)
        res["raise_on_every_rank"] = {"raise_after_s": total, "next_case_s": time.perf_counter() - t1,
                                      "group_kept": pool.groups_kept == kept + 1}
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", type=int, default=200)
    ap.add_argument("--fresh", type=int, default=3)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "pool.json"))
    args = ap.parse_args()

    result = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__,
                    "backend": "gloo"},
        "worlds": [bench_world(w, args.cases, args.fresh) for w in (2, 4)],
        "failures": bench_failures(),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    for w in result["worlds"]:
        print(
            f"world {w['world_size']}: start-up {w['startup_s']:.2f} s | persistent "
            f"{w['persistent']['cases_per_s']:.0f} cases/s ({w['persistent']['ms_per_case']:.2f} ms) | fresh group "
            f"{w['fresh_group_per_case']['cases_per_s']:.2f} cases/s ({w['fresh_group_per_case']['ms_per_case']:.0f} ms)"
            f" | x{w['speedup']:.0f}"
        )
    f = result["failures"]
    print(
        f"failures (world 2): hang {f['hang']['past_deadline_s']:.2f} s past a {f['hang_deadline_s']:.0f} s deadline, "
        f"sigkill {f['sigkill']['raise_after_s']:.3f} s, raise {f['raise']['raise_after_s']:.2f} s; "
        f"rebuild+case {statistics.mean(f[k]['rebuild_plus_case_s'] for k in ('hang', 'sigkill', 'raise')):.2f} s"
    )
    every = f["raise_on_every_rank"]
    print(f"raise on every rank: {every['raise_after_s'] * 1e3:.1f} ms incl. the health check, group kept: "
          f"{every['group_kept']}, next case {every['next_case_s'] * 1e3:.1f} ms")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
