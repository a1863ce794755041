"""The gloo pool's ranks fork from the rank server (rlconform.harness.workers.rank_server) instead of each
starting an interpreter: from one server per environment of what torch reads at import, with the owner's
environment and output files of the moment, one thread, and ends reported as a spawned rank's are."""

from __future__ import annotations

import os
import sys

import pytest

from rlconform.harness.workers import pool_cases as pc
from rlconform.harness.workers import rank_server
from rlconform.harness.workers.pool import RankFailure, WorkerPool
from rlconform.harness.workers.pool_worker import one_thread_environment

NAMES = ["RLCONFORM_TEST_RANK_SERVER", "OMP_NUM_THREADS", "ATEN_CPU_CAPABILITY"]


def test_a_server_is_kept_while_what_imports_read_is_unchanged(monkeypatch):
    before = rank_server._read_at_import()
    assert ("OMP_NUM_THREADS", "1") in before
    monkeypatch.setenv("RLCONFORM_TEST_RANK_SERVER", "x")  # read by no import the server makes
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "tests/test_other.py::test_other (call)")
    assert rank_server._read_at_import() == before
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")  # read when torch loads
    assert rank_server._read_at_import() != before


def test_the_one_thread_environment_holds_within_and_is_restored_after(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    with one_thread_environment():
        assert os.environ["OMP_NUM_THREADS"] == os.environ["MKL_NUM_THREADS"] == "1"
    assert os.environ["OMP_NUM_THREADS"] == "4" and "MKL_NUM_THREADS" not in os.environ


def test_no_server_where_no_fork(monkeypatch):
    monkeypatch.setattr(sys, "platform", "darwin")
    assert rank_server.server() is None


def _server_pid() -> int:
    return rank_server.server()._forkserver_pid


@pytest.mark.distributed
def test_ranks_fork_from_one_server_with_the_owners_environment_and_output(monkeypatch, tmp_path):
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    pool = WorkerPool(2, timeout_s=120.0)
    try:
        monkeypatch.setenv("RLCONFORM_TEST_RANK_SERVER", "first")
        first = pool.run(pc.rank_process, {"env": NAMES})
        server = _server_pid()
        assert server != os.getpid()
        assert [r["ppid"] for r in first] == [server, server]  # forked from the server, not spawned
        assert all(r["threads"] == 1 and r["env"]["OMP_NUM_THREADS"] == "1" for r in first), first
        assert all(r["env"]["RLCONFORM_TEST_RANK_SERVER"] == "first" for r in first), first
        with pytest.raises(RankFailure) as err:
            pool.run(pc.sigkill_on, {"rank": 0})
        assert err.value.kind == "died" and "SIGKILL" in err.value.tracebacks[0]
        monkeypatch.setenv("RLCONFORM_TEST_RANK_SERVER", "second")  # set after the server started
        saved = os.dup(2)
        with open(tmp_path / "stderr", "wb") as redirected:  # this process's stderr, redirected after it started
            sys.stderr.flush()
            os.dup2(redirected.fileno(), 2)
            try:
                second = pool.run(pc.rank_process, {"env": NAMES})  # a new group, from the same server
            finally:
                sys.stderr.flush()
                os.dup2(saved, 2)
                os.close(saved)
        assert {r["pid"] for r in second}.isdisjoint(r["pid"] for r in first)
        assert [r["ppid"] for r in second] == [server, server] and _server_pid() == server
        assert all(r["env"]["RLCONFORM_TEST_RANK_SERVER"] == "second" for r in second), second
    finally:
        pool.close()
    written = (tmp_path / "stderr").read_text()
    assert "rank 0" in written and "rank 1" in written  # the ranks write where their owner writes now


@pytest.mark.distributed
def test_a_group_of_a_replaced_server_still_reports_how_its_ranks_ended(monkeypatch):
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    old_pool, new_pool = WorkerPool(2, timeout_s=120.0), WorkerPool(2, timeout_s=120.0)
    try:
        old = old_pool.run(pc.rank_process, {"env": NAMES})
        monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")  # torch reads it at import: a new server
        new = new_pool.run(pc.rank_process, {"env": NAMES})
        assert new[0]["ppid"] != old[0]["ppid"] and new[0]["env"]["ATEN_CPU_CAPABILITY"] == "default"
        with pytest.raises(RankFailure) as err:  # its server lives on for it: not "exit code 255"
            old_pool.run(pc.sigkill_on, {"rank": 1})
        assert err.value.kind == "died" and "SIGKILL" in err.value.tracebacks[1], err.value.tracebacks
        os.kill(new[0]["pid"], 0)  # the other group is untouched
        assert new_pool.run(pc.rank_info, None)[0]["pid"] == new[0]["pid"]
    finally:
        old_pool.close()
        new_pool.close()


@pytest.mark.distributed
def test_spawned_ranks_where_no_server_runs(monkeypatch):
    monkeypatch.setattr(rank_server, "server", lambda: None)
    pool = WorkerPool(2, timeout_s=120.0)
    try:
        facts = pool.run(pc.rank_process, {"env": NAMES})
        assert [r["ppid"] for r in facts] == [os.getpid(), os.getpid()]
        assert all(r["threads"] == 1 for r in facts)
    finally:
        pool.close()
