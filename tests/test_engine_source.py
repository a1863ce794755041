"""``bindings.source.engine_function`` runs an engine function whose module does not import:
compiled from the file on the path (a fork's edit included), its names resolved from the module's own
imports (an importable module directly, one that does not import from its source), its frames the file's."""

from __future__ import annotations

import subprocess
import sys
import textwrap

PKG = {
    "toyeng/__init__.py": "",
    "toyeng/helpers.py": textwrap.dedent('''
        import not_installed_anywhere  # noqa: F401 - this module does not import here

        def finalize(metrics):
            metrics["mean"] = metrics["sum"] / max(metrics["count"], 1)
    '''),
    "toyeng/trainer.py": textwrap.dedent('''
        import math
        import not_installed_anywhere  # noqa: F401
        from collections import defaultdict
        from toyeng.helpers import finalize

        class Trainer:
            @some_decorator_that_is_not_defined
            def step(self, parts):
                acc = defaultdict(float)
                for part in parts:
                    for k, v in part.items():
                        acc[k] += v
                finalize(acc)
                return dict(acc, root=math.sqrt(acc["count"]))

            def broken(self):
                raise ValueError("from the engine file")
    '''),
}

SCRIPT = textwrap.dedent('''
    import sys, traceback, types
    sys.path.insert(0, sys.argv[1])
    from rlconform.harness.bindings.source import engine_function
    step = engine_function("toyeng.trainer", "Trainer.step")
    print(step(types.SimpleNamespace(), [{"sum": 3.0, "count": 2.0}, {"sum": 1.0, "count": 2.0}]))
    try:
        engine_function("toyeng.trainer", "Trainer.broken")(None)
    except ValueError:
        print("frame", traceback.extract_tb(sys.exc_info()[2])[-1].filename.endswith("toyeng/trainer.py"))
    try:
        engine_function("toyeng.trainer", "Trainer.missing")
    except AttributeError as exc:
        print("missing", "defines no method 'missing'" in str(exc))
''')


def test_a_method_of_a_module_that_does_not_import_runs_from_its_source(tmp_path):
    for rel, text in PKG.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert lines[0] == "{'sum': 4.0, 'count': 4.0, 'mean': 1.0, 'root': 2.0}", lines
    assert lines[1:] == ["frame True", "missing True"], lines
