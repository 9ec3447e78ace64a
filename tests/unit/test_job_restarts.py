"""Whole-job restarts across launchers (ftcoord.launcher.job_restarts): the launcher that saw a death asks, every other
one
follows, a restart asked elsewhere and not carried out yet is carried out rather than asked again, an earlier run's
count is not followed, and a restarted store does not lower the count. Against a real store, one client per
launcher."""

from __future__ import annotations

import pytest

from ftcoord import StoreServer, connect, job_store
from ftcoord.config import FENCE_POLL_S
from ftcoord.launcher.job_restarts import JobRestarts
from ftcoord.protocol import keys
from ftcoord.store.client import read_int

pytestmark = pytest.mark.timeout(30)


def launcher(server: StoreServer, job_id: str) -> JobRestarts:
    return JobRestarts(job_store(connect(server.address), job_id))


def test_one_launcher_asks_and_the_others_follow_once(store_server: StoreServer, job_id: str) -> None:
    a, b, c = (launcher(store_server, job_id) for _ in range(3))
    assert b.asked_elsewhere(now=0.0) is None
    assert a.ask() == (1, True)
    assert b.asked_elsewhere(now=0.0 + FENCE_POLL_S / 2) is None, "read again before FENCE_POLL_S"
    assert b.asked_elsewhere(now=1.0) == 1
    assert c.asked_elsewhere(now=1.0) == 1
    assert b.asked_elsewhere(now=2.0) is None and c.asked_elsewhere(now=2.0) is None, "followed twice"
    assert a.asked_elsewhere(now=1.0) is None, "the launcher that asked followed its own restart"


def test_a_death_seen_before_following_a_restart_asked_elsewhere_joins_that_restart(store_server: StoreServer,
                                                                                    job_id: str) -> None:
    """Node A's process dies; so does one of node B's, before B's launcher read the count: B carries out restart 1
    (its processes all restart anyway) rather than asking for a second one that every launcher would carry out."""
    a, b = launcher(store_server, job_id), launcher(store_server, job_id)
    assert a.ask() == (1, True)
    assert b.ask() == (1, False)
    assert a.asked_elsewhere(now=1.0) is None and b.asked_elsewhere(now=1.0) is None
    assert read_int(job_store(connect(store_server.address), job_id), keys.JOB_RESTARTS) == 1


def test_an_earlier_runs_restarts_are_not_followed(store_server: StoreServer, job_id: str) -> None:
    earlier = launcher(store_server, job_id)
    earlier.ask()
    earlier.ask()
    relaunched = launcher(store_server, job_id)
    assert relaunched.asked_elsewhere(now=1.0) is None
    assert relaunched.ask() == (3, True)


def test_a_restarted_store_keeps_the_count(store_server: StoreServer, job_id: str) -> None:
    """The store came back empty (here: the count deleted, all a new instance would lack): each launcher rebuilds
    the count it carried out (Supervisor.rebuild), or the next launcher to ask would ask for restart 1 again, which
    the others carried out already, and they would not follow."""
    a, b = launcher(store_server, job_id), launcher(store_server, job_id)
    a.ask()
    assert b.asked_elsewhere(now=1.0) == 1
    empty = job_store(connect(store_server.address), job_id)
    empty.delete_key(keys.JOB_RESTARTS)
    for restarts in (a, b):
        restarts.rebuild(empty)
    assert read_int(empty, keys.JOB_RESTARTS) == 1
    assert a.ask() == (2, True)
    assert b.asked_elsewhere(now=2.0) == 2, "the restart asked after the store came back was not followed"
