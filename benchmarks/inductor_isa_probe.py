"""Does this machine's torch.compile (inductor, CPU) compute verl's ``mul_reduce`` right, per vector ISA?

verl's ``_VocabParallelEntropy.forward`` (verl/utils/megatron/tensor_parallel.py) compiles
``(a * b).sum(dim=-1, keepdim=True)`` with ``torch.compile(dynamic=True)``. Inductor's CPU code generation
targets the ISA torch's kernels dispatch to (``torch.backends.cpu.get_cpu_capability()``, forced by
``ATEN_CPU_CAPABILITY=default|avx2|avx512``). Measured with torch 2.13.0+cpu on an AVX-512 Xeon, float64
ones: with AVX512, first compiled for ``[1, 4]``, eight ones times eight ones sum to 16; with AVX2, first
compiled for ``[1, 1]``, sixteen sum to 8 — wrong sums whose shapes depend on the ISA and on the shape the
function was first compiled for, so rlconform's verl report can differ between two CPUs (and two orders of
findings) by more than last bits (README, "One verdict on every machine").

Run it under each ISA (each in a fresh process: the ISA is read once per process)::

    for isa in default avx2 avx512; do ATEN_CPU_CAPABILITY=$isa python benchmarks/inductor_isa_probe.py; done

Prints one line: the capability torch reports, then each ``[rows, n]`` whose compiled sum of ones is not n
(after which first compiled shape); exits 1 when any is wrong, 0 otherwise. Needs only torch.
"""

from __future__ import annotations

import sys


def main() -> int:
    import torch

    def mul_reduce(a, b):  # verl's, verbatim in shape: the product summed over the vocab shard
        return (a * b).sum(dim=-1, keepdim=True)

    wrong = []
    for rows, first in ((1, 1), (1, 4), (2, 1), (2, 4)):  # the shape the function is first compiled for
        torch._dynamo.reset()
        compiled = torch.compile(mul_reduce, dynamic=True)
        for n in (first, 8, 9, 16, 17, 33):
            a = torch.ones(rows, n, dtype=torch.float64)
            got = compiled(a, a)[0].item()
            if got != n:
                wrong.append(f"[{rows}, {n}] after [{rows}, {first}]: {got:g} for {n}")
    isa = torch.backends.cpu.get_cpu_capability()
    detail = "wrong: " + "; ".join(wrong) if wrong else "right"
    print(f"torch {torch.__version__}, CPU kernels {isa}: compiled float64 (ones * ones).sum(-1) {detail}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
