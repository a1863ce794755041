"""``python -m rlconform.harness.cli ARGS`` for the self-tests, without an interpreter start and torch's
import per call.

A test that runs the CLI in a subprocess pays about 2.5 s of a 2-core machine before the CLI does anything
(the interpreter, torch, numpy, hypothesis, pytest); the suite runs the CLI hundreds of times. Here one
server per test process imports those once and forks a fresh child per call. The child is a new process
as ``subprocess.run`` would start: its own pid (and process group, so that a timeout kills what it
started there too), cwd, stdin (``/dev/null``), stdout and stderr (files read
back into a :class:`subprocess.CompletedProcess`), environment (the caller's ``os.environ`` at the call),
signal handlers (installed by the CLI), ``sys.argv``; the processes it spawns (engine workers, the referee,
gloo ranks) re-import ``rlconform.harness.cli`` as their main module, as under ``python -m``; it ends by a
normal interpreter exit (atexit handlers run). Nothing of one call reaches the next: each child is forked
from the server, which never runs a command itself.

What a fork cannot give falls back to a plain subprocess: an environment that differs from the server's
in a variable read when torch or the interpreter starts (anything but ``RLCONFORM_*``: e.g.
``ATEN_CPU_CAPABILITY``, ``OMP_NUM_THREADS``). ``RLCONFORM_TEST_NO_FORK=1`` runs every call as a subprocess
(the suite's results must not change).

Used through :func:`run` (tests import this module as ``forked_cli``; ``tests/conftest.py`` registers it).
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile

CLI = ("-m", "rlconform.harness.cli")
#: CPU seconds (user + system) of the forked calls this process made, and of what they waited for: a forked
#: child is the server's, so this process's ``RUSAGE_CHILDREN`` never counts it (tests/conftest.py adds it)
cpu_seconds = 0.0
#: calls this process ran as forked children (the others ran as subprocesses)
forked_calls = 0
#: environment variables a forked child may take from the caller (read by the CLI, not at import)
CHILD_ENV_PREFIXES = ("RLCONFORM_",)
#: variables an engine's import sets in the test process (ray, tensordict and torch's inductor, when a test imports
#: verl in process), read by no module the server imports: a caller that has them still forks (the child gets
#: them, as a subprocess would); without this, every later call of that test process ran as a subprocess
SET_BY_ENGINE_IMPORTS = ("RAY_CLIENT_MODE", "RAY_ENABLE_UV_RUN_RUNTIME_ENV", "LAZY_LEGACY_OP",
                         "TORCHINDUCTOR_CACHE_DIR")
#: variables pytest sets in the test process for each test phase (the running test's id), read at no import:
#: without this, only the test that started the server forked, and every later test ran its calls as subprocesses
SET_BY_PYTEST = ("PYTEST_CURRENT_TEST",)


def run(args, *, cwd=None, env=None, timeout: float = 900, input=None) -> subprocess.CompletedProcess:
    """As ``subprocess.run([sys.executable, "-m", "rlconform.harness.cli", *args], capture_output=True,
    text=True, cwd=cwd, env=env, timeout=timeout)``. Raises :class:`subprocess.TimeoutExpired` (the child
    killed) past ``timeout`` seconds, as that call does."""
    argv = [str(a) for a in args]
    env = dict(os.environ if env is None else env)
    server = None if input is not None or os.environ.get("RLCONFORM_TEST_NO_FORK") else _Server.get()
    if server is None or not server.can_fork(env):
        return subprocess.run([sys.executable, *CLI, *argv], capture_output=True, text=True, cwd=cwd, env=env,
                              timeout=timeout, input=input)
    return server.call(argv, cwd=str(cwd) if cwd is not None else os.getcwd(), env=env, timeout=timeout)


def stop() -> None:
    """End this test process's server (the next :func:`run` starts another)."""
    inst, _Server._instance = _Server._instance, None
    if inst is not None and inst.pid == os.getpid():
        inst.proc.stdin.close()
        try:
            inst.proc.wait(30)
        except subprocess.TimeoutExpired:
            inst.proc.kill()


class _Server:
    _instance: "_Server | None" = None

    @classmethod
    def get(cls) -> "_Server | None":
        inst = cls._instance
        if inst is None or inst.proc.poll() is not None or inst.pid != os.getpid():
            cls._instance = inst = cls()
        return inst

    def __init__(self):
        self.pid = os.getpid()
        self.env = dict(os.environ)
        self.proc = subprocess.Popen([sys.executable, "-P", __file__], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=self.env,
                                     bufsize=1)

    def can_fork(self, env: dict) -> bool:
        keys = set(env) | set(self.env)
        free = SET_BY_ENGINE_IMPORTS + SET_BY_PYTEST
        return all(env.get(k) == self.env.get(k) for k in keys
                   if (not k.startswith(CHILD_ENV_PREFIXES) or k in READ_AT_IMPORT) and k not in free)

    def call(self, argv, *, cwd: str, env: dict, timeout: float) -> subprocess.CompletedProcess:
        global cpu_seconds, forked_calls
        forked_calls += 1
        with tempfile.TemporaryDirectory(prefix="rlconform-forked-cli-") as tmp:
            out, err = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
            self.proc.stdin.write(json.dumps({"argv": argv, "cwd": cwd, "env": env, "out": out, "err": err}) + "\n")
            self.proc.stdin.flush()
            child = json.loads(self._line(60))["pid"]
            try:
                answer = json.loads(self._line(timeout))
            except subprocess.TimeoutExpired:
                os.killpg(child, signal.SIGKILL)  # the CLI and what it started in its process group
                cpu_seconds += json.loads(self._line(60))["cpu"]
                raise subprocess.TimeoutExpired([sys.executable, *CLI, *argv], timeout,
                                                _read(out), _read(err)) from None
            cpu_seconds += answer["cpu"]
            return subprocess.CompletedProcess([sys.executable, *CLI, *argv], answer["rc"], _read(out), _read(err))

    def _line(self, timeout: float) -> str:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            raise subprocess.TimeoutExpired("forked_cli", timeout)
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the forked CLI server ended (exit code {self.proc.wait()})")
        return line


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except FileNotFoundError:
        return ""


def _serve() -> None:
    """The server: import once, then fork a child per request line (``{"argv", "cwd", "env", "out",
    "err"}``), answer ``{"pid"}`` at once and ``{"rc", "cpu"}`` when the child has ended (``cpu``: user +
    system seconds of the child and of every process it waited for)."""
    requests = os.fdopen(os.dup(0), "r")
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    _warm_up()
    import gc

    gc.freeze()  # what the server imported is never collected in a child (nor copied by the collector's writes)
    for line in requests:
        req = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            requests.close()
            answers.close()
            _child(req)  # never returns: the interpreter exits with the CLI's code
        answers.write(json.dumps({"pid": pid}) + "\n")
        _, status, usage = os.wait4(pid, 0)
        answers.write(json.dumps({"rc": os.waitstatus_to_exitcode(status),
                                  "cpu": usage.ru_utime + usage.ru_stime}) + "\n")


#: third-party modules every CLI call imports (the report's plots, tables and templates included)
WARM = ("torch", "numpy", "hypothesis", "pytest", "xdist", "execnet", "mpmath", "rich.console", "rich.table",
        "jinja2", "matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg", "matplotlib.colors")
#: rlconform's packages whose modules the server imports (none holds engine code: bindings and mutants, the
#: reference engine's included, are imported by the child, as a fresh process imports them; a CLI forked from a
#: server holding one could not make its clean copy, and would spawn its referee and probe)
WARM_PACKAGES = ("rlconform.harness.core", "rlconform.harness.catalog", "rlconform.harness.families",
                 "rlconform.harness.report", "rlconform.harness.run", "rlconform.harness.workers",
                 "rlconform.properties", "rlconform.reference", "rlconform.distributed_tests")
WARM_MODULES = ("rlconform.harness.cli", "rlconform.harness.bindings.load")
#: RLCONFORM_ variables rlconform reads when a module is imported: a call whose value differs is not forked
#: (tests/test_forked_cli.py finds every module-level read in the package)
READ_AT_IMPORT = ("RLCONFORM_DIST_MAX_EXAMPLES", "RLCONFORM_SPILL_DIR", "RLCONFORM_DIST_DEADLINE_S",
                  "RLCONFORM_DIST_COLLECTIVE_TIMEOUT_S")


def _warm_up() -> None:
    import importlib
    import pkgutil

    for name in WARM + WARM_MODULES:
        importlib.import_module(name)
    for package in WARM_PACKAGES:
        pkg = importlib.import_module(package)
        for info in pkgutil.walk_packages(pkg.__path__, package + "."):
            if not info.name.rsplit(".", 1)[-1].startswith("test_"):
                importlib.import_module(info.name)


def _child(req: dict) -> None:
    os.setpgid(0, 0)  # a group of its own: a timeout ends the CLI and what it started in that group
    for fd, path in ((1, req["out"]), (2, req["err"])):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(f, fd)
        os.close(f)
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    import rlconform.harness.cli as cli

    # as under `python -m rlconform.harness.cli`: spawned processes import the CLI as their main module
    sys.modules["__main__"] = cli
    sys.argv = [cli.__file__, *req["argv"]]
    try:
        code = cli.main(req["argv"])
    except SystemExit as exc:
        code = exc.code
    except BaseException:  # noqa: BLE001 - as an uncaught exception ends `python -m`: traceback, exit 1
        import traceback

        traceback.print_exc()
        code = 1
    sys.exit(code)


if __name__ == "__main__":
    _serve()
