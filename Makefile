# Set-up and the two Quick-start jobs of the README. Everything installs into .venv with
# install/constraints.txt, which pins the local CPU build torch==2.13.0 (nothing may pull another).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
OUT    ?= rlconform-report
# --dist worksteal: an idle xdist worker takes tests queued on the others, so one long test (a fork's own
# code, the reference engine's whole catalog) does not end the run alone while the others sit idle.
# Six workers on 2 cores: some tests wait (a hang's deadline, a rank's health check) while others compute,
# and on a shared machine the suite's share of the cores grows with its runnable processes. Measured beside two
# CPU-bound processes on the command-line tests of five modules (73 tests): 385 s with -n 4, 331 s with -n 6,
# 324 s with -n 8 (each worker also collects the suite and holds its memory); an older suite from a fresh clone
# took 735 s quiet with -n 3 and 730 s with -n 2
PYTEST_ARGS ?= -n 6 --dist worksteal
# two engine worker processes for the checks (2 cores); override with CHECK_ARGS=...
CHECK_ARGS ?= -n 2

.PHONY: setup engines browser check-verl check-reference lint test test-fast reports clean

# pip's output goes to $(VENV)/rlconform-install.log (it holds local-index notices such as "Location …
# is ignored", which are not errors); on a failure its last lines are printed.
PIPLOG = $(VENV)/rlconform-install.log
PIP    = $(PY) -m pip --disable-pip-version-check

$(PY):
	$(PYTHON) -m venv $(VENV)
	@$(PIP) install -q --upgrade "pip>=24" >>$(PIPLOG) 2>&1 || (tail -n 30 $(PIPLOG); exit 1)

# rlconform itself (editable) with its test extras
$(VENV)/.rlconform-installed: $(PY) pyproject.toml install/constraints.txt
	@echo "[setup] installing rlconform (editable) and its test extras into $(VENV); pip log: $(PIPLOG)"
	@$(PIP) install -q -c install/constraints.txt -e '.[test]' >>$(PIPLOG) 2>&1 || (tail -n 30 $(PIPLOG); exit 1)
	@touch $@

# rlconform's own byte code, compiled once: an editable install compiles nothing, and where
# PYTHONDONTWRITEBYTECODE is set (Debian's and many CI images) every process of a check (controller, engine
# workers, referees) compiled every module again; a module edited since is compiled in memory as before
SOURCES := harness properties distributed_tests reference

setup: $(VENV)/.rlconform-installed
	@$(PY) -m compileall -q -j 0 $(SOURCES) >/dev/null

engines: setup
	bash install/engines.sh $(PY) all

# Quick start 1: the main job, a check of a real engine (verl 0.9.1), report in $(OUT)/verl/.
# The ledger reports/verl-0.9.1/xfails.txt lists verl's known discrepancies: the job is red when a new
# one appears or a listed one is fixed.
check-verl: engines
	$(VENV)/bin/rlconform check --engine verl --out $(OUT)/verl --xfails reports/verl-0.9.1/xfails.txt $(CHECK_ARGS)

check-reference: setup
	$(VENV)/bin/rlconform check --engine reference --out $(OUT)/reference $(CHECK_ARGS)

# Headless Chromium for tests/test_html_report.py (which skips, saying why, without it). Installed only
# when missing, and only as root with apt-get (Debian's `chromium`); otherwise a note, not an error.
# RLCONFORM_NO_APT=1 never installs it.
browser:
	@if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then :; \
	elif [ -n "$$RLCONFORM_NO_APT" ]; then echo "note: RLCONFORM_NO_APT set: chromium not installed; the browser tests will skip"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "[browser] installing Debian's chromium with apt-get for the HTML report test (RLCONFORM_NO_APT=1 skips this)"; \
	  (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium) \
	    >/dev/null || echo "note: could not install chromium; the browser tests will skip"; \
	else echo "note: chromium not found (not root or no apt-get); the browser tests will skip"; fi

# The linter (configuration: [tool.ruff] in pyproject.toml), part of both test targets.
lint: setup
	$(VENV)/bin/ruff check .

# Quick start 2: the self-tests, real engines included; the 20 slowest tests are printed at the end.
# -P and PYTHONSAFEPATH (inherited by xdist workers and subprocesses): the checkout root is never on
# sys.path, so a bare `import reference` cannot work by accident.
test: engines browser lint
	PYTHONSAFEPATH=1 $(PY) -P -m pytest $(PYTEST_ARGS) --durations=20 tests

# Before a commit: the linter, every module's unit tests and one end-to-end check of the reference engine;
# no real engine needed. The markers are checked by tests/test_markers.py.
FAST_MARKERS ?= smoke or not (cli or engines or distributed or slow)
# its tests compute and never wait: one worker per core (57 s from a fresh clone; 67 s with -n 3)
FAST_PYTEST_ARGS ?= -n 2 --dist worksteal
test-fast: setup lint
	PYTHONSAFEPATH=1 $(PY) -P -m pytest $(FAST_PYTEST_ARGS) --durations=10 -m "$(FAST_MARKERS)" tests

# Regenerate the committed reports of the real engines.
reports: engines
	bash reports/regenerate.sh $(VENV)

clean:
	rm -rf $(VENV) $(OUT) *.egg-info
