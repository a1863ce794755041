"""Peak memory and wall time of one ``real_shapes`` finding, against the engine's own.

Each measurement runs in a fresh subprocess (``ru_maxrss`` is a process's high-water mark):

* ``engine``: what the engine needs on its own for the case: the logits materialised in the dtype under
  test (:meth:`~rlconform.harness.core.generated.LogitsGen.materialise`), the engine's forward, its
  backward for a float64 ``grad_output`` (as the harness drives it under both properties) and the
  gradient kept;
* ``finding``: the whole check of the same case (:func:`rlconform.properties.checks.run_check` on a
  :class:`~rlconform.properties.case.Case` of regime ``real_shapes``): the engine, the chunked float64
  reference, the chunked dtype-faithful path, the comparison (``matches_reference``) or the digest input
  guard (``non_destructive``).

Reported per measurement: ``ru_maxrss`` after the imports (``base``), at the end (``peak``), and wall time;
and, sampled from ``/proc`` every 0.1 s by this process while the measurement runs, every process of the
measurement's tree (the engine's process and, with the referee, the referee's) with its ``VmHWM`` (its
own peak RSS), the highest sum of their RSS at one moment, the highest size of the tape's spill files in
``/dev/shm`` (tmpfs: memory no process's RSS shows; a folder of its own, ``RLCONFORM_SPILL_DIR``) and the highest sum of both (``total_peak``), and the
spill files left behind at the end. The harness's extra memory is ``total_peak(finding) −
total_peak(engine)`` (every process and ``/dev/shm`` together), also as a multiple of the logits' bytes
(the target: ≤ 2×); ``extra_max_process`` is the older measure, the larger process peak minus the
engine's. The case is the generator's ``peaked_tail`` logits with seed 0, peak 20, tail 2,
decay 0.5, offset 0, 2 head tokens (the distribution of every real_shapes case; the memory does not depend
on the values).

    python benchmarks/bench_real_shape_memory.py --rows 1024                 # verl entropy fp32, refereed
    python benchmarks/bench_real_shape_memory.py --rows 4096 --label after   # appends to the results
    python benchmarks/bench_real_shape_memory.py --rows 256 --property non_destructive
    python benchmarks/bench_real_shape_memory.py --rows 1024 --no-referee    # the whole check in one process

Writes (merges into) ``--out`` (default benchmarks/results/real_shape_memory.json): one record per run,
keyed by ``label``, engine, op, property, dtype and shape. Never run two of these at once on a shared
machine: at ``[4096, 151936]`` fp32 one measurement needs many GB.
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

SHM = Path("/dev/shm") / f"rlconform-bench-{os.getpid()}"  # this benchmark's spill files only (RLCONFORM_SPILL_DIR)

VOCAB = 151936
TARGET_EXTRA = 2.0
KEY = ("label", "referee", "engine", "op", "property", "dtype", "shape")
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "real_shape_memory.json"


def _maxrss() -> int:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss if sys.platform == "darwin" else rss * 1024  # Linux: KiB


def _loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"


def _inputs(rows: int, vocab: int):
    import numpy as np

    from rlconform.harness.core.generated import LogitsGen

    gen = LogitsGen(0, (rows, vocab), peak=20.0, tail_scale=2.0, decay=0.5, offset=0.0, head_tokens=2)
    rng = np.random.default_rng(0x5EED)
    labels = np.where(rng.random(rows) < 0.5, gen.head()[:, 0], rng.integers(0, vocab, size=rows)).astype(np.int64)
    return {"logits": gen, "labels": labels, "grad_output": rng.uniform(-1.0, 1.0, size=rows)}


def child(args) -> dict:
    ref = None
    if args.referee and args.what == "finding":  # started before any engine import, as `rlconform check` does
        from rlconform.harness.run.dispatch import referee_judge
        from rlconform.harness.workers import referee as referee_process
        from rlconform.properties import referee

        ref = referee_process.start(referee_judge, referee.check_clean)
        referee.connect(ref.address, ref.authkey)
    import torch

    from rlconform.harness.bindings.load import load_engine
    from rlconform.harness.families.token_stats import OPS, engine_args
    from rlconform.properties.case import Case
    from rlconform.properties.checks import run_check

    binding = load_engine(args.engine, None)
    fn = binding.resolve(args.op)
    inputs = _inputs(args.rows, args.vocab)
    base = _maxrss()
    t0 = time.perf_counter()
    result = {}
    if args.what == "engine":
        op = next(o for o in OPS if o.name == args.op)
        leaf = inputs["logits"].materialise(args.dtype).requires_grad_(True)
        out = fn(*engine_args(op, leaf, inputs))
        (out.to(torch.float64) * torch.from_numpy(inputs["grad_output"])).sum().backward()  # both properties do
        del out
        result["grad_bytes"] = leaf.grad.numel() * leaf.grad.element_size()
    else:
        outcome = run_check(binding, Case(args.op, args.property, args.dtype, "real_shapes", inputs))
        result.update(ok=bool(outcome.ok), message=str(outcome.message)[:300])
    result.update(base=base, peak=_maxrss(), wall_s=round(time.perf_counter() - t0, 2))
    if ref is not None:
        ref.close()  # reaped: its high-water mark is in RUSAGE_CHILDREN
        kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        result["referee_peak"] = kib if sys.platform == "darwin" else kib * 1024
    return result


def _tree(root: int) -> list[int]:
    """``root`` and its descendants, from /proc."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, ()))
    return out


def _status(pid: int) -> dict:
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return {}
    return {k: int(v.split()[0]) * 1024 for k, _, v in (ln.partition(":") for ln in lines) if k in ("VmRSS", "VmHWM")}


def _spilled() -> int:
    try:
        return sum(f.stat().st_size for f in SHM.glob("rlconform-tape-*"))
    except OSError:
        return 0


def _sample(proc: subprocess.Popen, period_s: float = 0.1) -> dict:
    """Poll the tree of ``proc`` until it exits (see the module docstring)."""
    hwm: dict[int, int] = {}
    rss_peak = shm_peak = total_peak = 0
    while proc.poll() is None:
        rss = 0
        for pid in _tree(proc.pid):
            st = _status(pid)
            rss += st.get("VmRSS", 0)
            if "VmHWM" in st:
                hwm[pid] = max(hwm.get(pid, 0), st["VmHWM"])
        shm = _spilled()
        rss_peak, shm_peak, total_peak = max(rss_peak, rss), max(shm_peak, shm), max(total_peak, rss + shm)
        time.sleep(period_s)
    return {"processes_hwm": sorted(hwm.values(), reverse=True), "rss_sum_peak": rss_peak, "shm_peak": shm_peak,
            "total_peak": total_peak}


def measure(args, what: str) -> dict:
    cmd = [sys.executable, "-P", __file__, "--child", what, "--engine", args.engine, "--op", args.op,
           "--property", args.property, "--dtype", args.dtype, "--rows", str(args.rows), "--vocab", str(args.vocab)] + (["--referee"] if args.referee else ["--no-referee"])
    load0 = _loadavg()
    SHM.mkdir(exist_ok=True)
    spill0 = {f.name for f in SHM.glob("rlconform-tape-*")}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONSAFEPATH="1", RLCONFORM_SPILL_DIR=str(SHM)))
    import threading

    sampled: dict = {}
    sampler = threading.Thread(target=lambda: sampled.update(_sample(proc)), daemon=True)
    sampler.start()
    stdout, stderr = proc.communicate()
    sampler.join()
    if proc.returncode != 0:
        sys.exit(f"bench_real_shape_memory: the {what} measurement failed (exit {proc.returncode}): "
                 f"{stderr.strip().splitlines()[-1] if stderr.strip() else 'no output'}")
    rec = json.loads(stdout.strip().splitlines()[-1])
    rec.update(sampled)
    left = [f for f in SHM.glob("rlconform-tape-*") if f.name not in spill0]
    rec["spill_files_left"] = len(left)
    rec["spill_bytes_left"] = sum(f.stat().st_size for f in left)
    for f in left:
        f.unlink()
    SHM.rmdir()
    rec["loadavg"] = f"{load0} -> {_loadavg()}"
    return rec


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--engine", default="verl")
    p.add_argument("--op", default="entropy")
    p.add_argument("--property", default="matches_reference", choices=("matches_reference", "non_destructive"))
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--rows", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=VOCAB)
    p.add_argument("--referee", action=argparse.BooleanOptionalAction, default=True,
                   help="judge in a referee process (the default, as in `rlconform check`): its "
                        "peak is reported apart (referee_peak); --no-referee: the whole check in one process")
    p.add_argument("--label", default="current", help="what is measured (e.g. before / after a change)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--child", choices=("engine", "finding"), dest="what", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.rows <= 0 or args.vocab <= 0:
        sys.exit("bench_real_shape_memory: --rows and --vocab must be positive")
    if args.what:
        print(json.dumps(child(args)))
        return 0
    elem = {"float32": 4, "bfloat16": 2}[args.dtype]
    logits_bytes = args.rows * args.vocab * elem
    engine = measure(args, "engine")
    finding = measure(args, "finding")
    extra_max = max(finding["peak"], finding.get("referee_peak", 0)) - engine["peak"]
    extra = finding["total_peak"] - engine["total_peak"]
    rec = {
        "label": args.label, "referee": args.referee, "engine": args.engine, "op": args.op, "property": args.property, "dtype": args.dtype,
        "shape": [args.rows, args.vocab], "logits_bytes": logits_bytes,
        "engine_run": engine, "finding_run": finding,
        "extra_bytes": extra, "extra_over_logits": round(extra / logits_bytes, 3),
        "extra_max_process_bytes": extra_max, "extra_max_process_over_logits": round(extra_max / logits_bytes, 3),
        "finding_peak_over_logits": round((finding["peak"] - finding["base"]) / logits_bytes, 3),
        "engine_peak_over_logits": round((engine["peak"] - engine["base"]) / logits_bytes, 3),
        # the referee's own high-water mark (its imports included) over the logits' bytes: target <= 2x
        "referee_peak_over_logits": (round(finding["referee_peak"] / logits_bytes, 3)
                                     if finding.get("referee_peak") else None),
        "target_extra_over_logits": TARGET_EXTRA, "within_target": extra <= TARGET_EXTRA * logits_bytes,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, torch threads default",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    records = []
    if args.out.exists():
        records = [r for r in json.loads(args.out.read_text())["runs"]
                   if [r.get(k) for k in KEY] != [rec.get(k) for k in KEY]]
    records.append(rec)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"target": "total_peak(finding) - total_peak(engine alone) <= 2 x logits bytes "
                                              "(total: every process's RSS and the spill files in "
                                              "/dev/shm, at one moment)", "runs": records}, indent=1) + "\n")
    gb = 1e9
    print(f"{args.label}: {args.engine} {args.op} {args.property} {args.dtype} {[args.rows, args.vocab]} "
          f"(logits {logits_bytes / gb:.2f} GB): engine alone peak {engine['peak'] / gb:.2f} GB "
          f"({engine['wall_s']} s), finding peak {finding['peak'] / gb:.2f} GB ({finding['wall_s']} s, "
          f"ok={finding['ok']})" + (f", referee peak {finding['referee_peak'] / gb:.2f} GB = {rec['referee_peak_over_logits']}x the logits"
             if args.referee else "")
          + f"; all processes + /dev/shm at one moment: engine alone {engine['total_peak'] / gb:.2f} GB, finding "
          f"{finding['total_peak'] / gb:.2f} GB (/dev/shm peak {finding['shm_peak'] / gb:.2f} GB, "
          f"{finding['spill_files_left']} spill file(s) left); extra {extra / gb:.2f} GB = "
          f"{rec['extra_over_logits']}x the logits (target <= {TARGET_EXTRA}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
