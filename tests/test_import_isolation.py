"""Inside the checkout, a bare ``import reference`` / ``import harness`` must not work by accident.

The folders ``reference/``, ``harness/``, ... are mapped into ``rlconform.*`` by the editable install
(pyproject ``package-dir``). If the checkout root ever lands on ``sys.path`` (PYTHONPATH=., a
``pythonpath`` pytest setting, a conftest ``sys.path.insert``, pytest's prepend import mode, running a
script from the root), the same files become importable twice under two names, and code importing
``reference`` works here but breaks for every user. The tests below:

* probe a fresh interpreter started from the checkout root the way ``--import-mode=importlib`` and
  ``python -P`` see the world (no cwd / script dir on sys.path; PYTHONPATH and .pth files honoured),
* check the pytest process itself (import mode, sys.path entries, already imported modules),
* and prove the probe can fail: with the root put on PYTHONPATH, or with a namespace (``__init__``-less)
  package — whose spec has ``origin=None`` and would slip past a check on ``origin`` alone — it reports
  the leak.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BARE = ("reference", "harness")

PROBE = r"""
import importlib.util, json, sys
out = {}
for name in sys.argv[1:]:
    try:
        spec = importlib.util.find_spec(name)
    except Exception as exc:  # a dotted name imports its parent first
        out[name] = {"error": repr(exc)}
        continue
    out[name] = None if spec is None else {
        "origin": spec.origin, "locations": list(spec.submodule_search_locations or [])}
print(json.dumps(out))
"""


def _inside(path, root: Path) -> bool:
    if not path or path in ("namespace", "built-in", "frozen"):
        return False
    try:
        Path(path).resolve().relative_to(root.resolve())
        return True
    except ValueError:
        return False


def _leaks(spec: dict | None, root: Path) -> list:
    """Paths inside ``root`` through which a spec resolves: its origin *and* its search locations."""
    if spec is None or "error" in spec:
        return []
    return [p for p in [spec["origin"], *spec["locations"]] if _inside(p, root)]


def _probe(names, cwd: Path, env_extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env.update(env_extra or {})
    if sys.version_info >= (3, 11):
        cmd = [sys.executable, "-P", "-c", PROBE, *names]
    else:  # no -P: drop the '' that -c puts first, which is what -P does
        cmd = [sys.executable, "-c", "import sys; sys.path.pop(0)\n" + PROBE, *names]
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_bare_names_do_not_resolve_but_rlconform_does():
    out = _probe([*BARE, "rlconform.reference", "rlconform.harness"], cwd=REPO)
    for name in BARE:
        assert _leaks(out[name], REPO) == [], f"`import {name}` resolves into the checkout: {out[name]}"
    for name, folder in (("rlconform.reference", "reference"), ("rlconform.harness", "harness")):
        spec = out[name]
        assert spec is not None and "error" not in spec, f"{name} does not import: {spec}"
        assert Path(spec["origin"]).resolve() == (REPO / folder / "__init__.py").resolve(), spec


def test_probe_detects_root_on_path_and_namespace_packages(tmp_path):
    # the checkout root on PYTHONPATH: `import reference` now resolves into it, and the probe says so
    out = _probe(list(BARE), cwd=REPO, env_extra={"PYTHONPATH": str(REPO)})
    for name in BARE:
        assert _leaks(out[name], REPO), out[name]
    # an __init__-less folder on the path is a namespace package: origin None, found via its locations
    (tmp_path / "reference").mkdir()
    out = _probe(["reference"], cwd=tmp_path, env_extra={"PYTHONPATH": str(tmp_path)})
    assert out["reference"]["origin"] in (None, "namespace")
    assert _leaks(out["reference"], tmp_path), out["reference"]


def test_pytest_process_puts_nothing_of_the_checkout_on_the_path(request):
    assert request.config.getoption("importmode") == "importlib", "run pytest with --import-mode=importlib"
    cwd = Path.cwd().resolve()
    on_path = [p for p in sys.path if (Path(p).resolve() if p else cwd) == REPO.resolve()]
    # without -P / PYTHONSAFEPATH (`make test` sets both), `python -m pytest` and pytest-xdist's workers
    # put the cwd first when run from the checkout root; nothing else may
    allowed = int(not sys.flags.safe_path and cwd == REPO.resolve())
    assert len(on_path) <= allowed, f"the checkout root is on sys.path {len(on_path)} times: {sys.path}"
    for name in BARE:
        mod = sys.modules.get(name)
        if mod is not None:
            paths = [getattr(mod, "__file__", None), *list(getattr(mod, "__path__", []) or [])]
            assert not any(_inside(p, REPO) for p in paths), f"something imported bare `{name}` from the checkout"
    import rlconform.reference

    assert Path(rlconform.reference.__file__).resolve() == (REPO / "reference" / "__init__.py").resolve()
