"""Session hooks of the distributed tests: the worker pools are closed when the session ends (atexit
would do it too; this also runs when pytest is embedded, e.g. in ``rlconform check``), so that no
worker outlives the run."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session", autouse=True)
def _rlconform_close_pools():
    yield
    from rlconform.harness.workers.pool import close_all_pools

    close_all_pools()
