"""torch.compile's on-disk cache, one per forced CPU ISA.

Inductor caches the CPU kernels it generates (``TORCHINDUCTOR_CACHE_DIR``, by default
``<tmp>/torchinductor_<user>``) and, with torch 2.13.0+cpu, reuses a kernel generated under one vector ISA in a
process whose kernels dispatch to another (``ATEN_CPU_CAPABILITY=avx2`` after a native AVX-512 run): the sums
come out wrong. Measured on an AVX-512 Xeon with verl's ``mul_reduce`` (``(a * b).sum(-1, keepdim=True)``
compiled with ``dynamic=True``): float64 ones, 16 elements summing to 8 under avx2 after a native run had
filled the cache, 8 summing to 16 the other way round; every sum right with a fresh cache per ISA. verl's
vocab-parallel entropy compiles exactly that, so a ``make check-verl`` under ``ATEN_CPU_CAPABILITY=avx2`` that
followed a native one read 38.85 for an exact 0.668. Core layer: imports nothing of the project.
"""

from __future__ import annotations

import getpass
import os
import re
import tempfile

ENV = "TORCHINDUCTOR_CACHE_DIR"
ISA_ENV = "ATEN_CPU_CAPABILITY"


def isolate_per_isa(environ=os.environ) -> str | None:
    """When ``ATEN_CPU_CAPABILITY`` forces an ISA and the user has not chosen a cache folder, point
    ``TORCHINDUCTOR_CACHE_DIR`` at inductor's default folder suffixed with that ISA (``…_isa-avx2``), in
    ``environ`` (inherited by every worker and rank the run starts). A native run keeps inductor's default
    folder, which then holds native kernels only. Returns the folder set, or None when nothing was changed."""
    isa = (environ.get(ISA_ENV) or "").strip().lower()
    if not isa or environ.get(ENV):
        return None
    try:
        user = getpass.getuser()
    except Exception:  # noqa: BLE001 - no user name (a container without one): inductor's own fallback
        user = "unknown"
    folder = os.path.join(tempfile.gettempdir(), f"torchinductor_{re.sub(r'[^A-Za-z0-9_.-]', '_', user)}"
                                                 f"_isa-{re.sub(r'[^a-z0-9_]', '_', isa)}")
    environ[ENV] = folder
    return folder
