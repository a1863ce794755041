"""A forced CPU ISA gets torch.compile kernels of its own (harness/core/compile_cache.py): inductor
reused kernels generated under another ISA from its shared on-disk cache, and verl's vocab-parallel entropy
read 38.85 for an exact 0.668 under ``ATEN_CPU_CAPABILITY=avx2`` after a native run."""

from __future__ import annotations

import os
import subprocess
import sys

from rlconform.harness.core.compile_cache import ENV, isolate_per_isa


def test_a_forced_isa_gets_its_own_cache_folder_and_the_users_choice_stands():
    env = {"ATEN_CPU_CAPABILITY": "avx2"}
    folder = isolate_per_isa(env)
    assert folder and env[ENV] == folder and folder.endswith("_isa-avx2")
    other = {"ATEN_CPU_CAPABILITY": "default"}
    assert isolate_per_isa(other).endswith("_isa-default") and other[ENV] != folder
    native = {}
    assert isolate_per_isa(native) is None and ENV not in native  # inductor's default: native kernels only
    chosen = {"ATEN_CPU_CAPABILITY": "avx2", ENV: "/somewhere/mine"}
    assert isolate_per_isa(chosen) is None and chosen[ENV] == "/somewhere/mine"


def test_the_cli_sets_it_for_every_process_it_starts(tmp_path):
    code = ("import os, sys; from rlconform.harness import cli; sys.argv = ['rlconform', 'list-ops'];"
            " cli.main(['list-ops']); print('CACHE=' + os.environ.get('TORCHINDUCTOR_CACHE_DIR', ''))")
    env = {k: v for k, v in os.environ.items() if k != ENV}
    env["ATEN_CPU_CAPABILITY"] = "avx2"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1].endswith("_isa-avx2"), proc.stdout[-500:]
