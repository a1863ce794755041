"""Idle OpenMP threads sleep in every process a run starts (harness/core/idle_threads.py), unless the user
chose a wait policy."""

from __future__ import annotations

import pytest

from rlconform.harness.core.idle_threads import ENV, sleep_when_idle


def test_passive_is_set_only_where_the_user_chose_nothing():
    env = {}
    assert sleep_when_idle(env) and env == {ENV: "PASSIVE"}
    for chosen in ("ACTIVE", "", "PASSIVE"):
        env = {ENV: chosen}
        assert not sleep_when_idle(env) and env == {ENV: chosen}


@pytest.mark.cli
@pytest.mark.parametrize("chosen", [None, "ACTIVE"])
def test_the_command_line_sets_it_before_it_starts_a_process(monkeypatch, chosen):
    from rlconform.harness.cli import main

    if chosen is None:
        monkeypatch.delenv(ENV, raising=False)
    else:
        monkeypatch.setenv(ENV, chosen)
    assert main(["list-engines"]) == 0
    import os

    assert os.environ[ENV] == (chosen or "PASSIVE")  # what every worker, referee and rank inherits
