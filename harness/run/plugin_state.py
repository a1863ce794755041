"""What the two halves of the pytest plugin share: where a session's state hangs on pytest's config, and which
process this is (an xdist controller, an engine worker, or a single process that is both)."""

from __future__ import annotations

STATE_KEY = "_rlconform_state"
#: the controller's (or single process's) state, for hooks that get no config
CONTROLLER_STATE: dict = {}


def state_of(config):
    """The session's :class:`~rlconform.harness.run.pytest_plugin.State`, or None (no engine selected)."""
    return getattr(config, STATE_KEY, None)


def is_worker(config) -> bool:
    return hasattr(config, "workerinput")


def is_controller(config) -> bool:
    """The xdist controller: it schedules findings on workers and runs none itself."""
    return not is_worker(config) and getattr(config.option, "dist", "no") != "no"
