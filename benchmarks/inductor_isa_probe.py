"""Does torch.compile's on-disk cache hand one CPU ISA's kernels to another on this machine?

verl's ``_VocabParallelEntropy.forward`` (verl/utils/megatron/tensor_parallel.py) compiles
``(a * b).sum(dim=-1, keepdim=True)`` with ``torch.compile(dynamic=True)``. Inductor keeps the CPU kernels it
generates in an on-disk cache and, with torch 2.13.0+cpu, reuses a kernel generated under one vector ISA in a
process that ``ATEN_CPU_CAPABILITY`` forces to another. Measured on an AVX-512 Xeon: float64 ones, 16 elements
summing to 8 under avx2 after a native run had filled the cache; every sum right with a cache per ISA. rlconform
gives a forced ISA its own cache (harness/core/compile_cache.py; README, "One verdict on every machine").

    python benchmarks/inductor_isa_probe.py

Runs the compiled sum of ones in child processes, one after another, under the native ISA, ``avx2`` and
``default``, first all sharing one fresh cache folder, then each with a folder of its own; prints each run's
wrong sums. Exits 1 when the shared cache gives a wrong sum (the hazard is on this machine), 0 otherwise. Needs
only torch.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

CHILD = r"""
import torch
@torch.compile(dynamic=True)
def mul_reduce(a, b):
    return (a * b).sum(dim=-1, keepdim=True)
wrong = []
for rows, first in ((1, 1), (1, 4), (2, 4)):
    torch._dynamo.reset()
    for n in (first, 8, 9, 16, 33):
        a = torch.ones(rows, n, dtype=torch.float64)
        got = mul_reduce(a, a)[0].item()
        if got != n:
            wrong.append(f"[{rows}, {n}] after [{rows}, {first}]: {got:g}")
print(torch.backends.cpu.get_cpu_capability(), "; ".join(wrong) or "right")
"""


def run(isa: str | None, cache: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    env["TORCHINDUCTOR_CACHE_DIR"] = cache
    if isa:
        env["ATEN_CPU_CAPABILITY"] = isa
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, timeout=900)
    return proc.stdout.strip().splitlines()[-1] if proc.returncode == 0 else f"failed: {proc.stderr[-300:]}"


def main() -> int:
    import torch

    print(f"torch {torch.__version__}")
    bad = False
    with tempfile.TemporaryDirectory() as shared:
        for isa in (None, "avx2", "default"):
            line = run(isa, shared)
            bad |= not line.endswith(" right")
            print(f"  shared cache:  {line}")
    for isa in (None, "avx2", "default"):
        with tempfile.TemporaryDirectory() as own:
            print(f"  own cache:     {run(isa, own)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
