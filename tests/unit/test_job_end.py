"""When a launcher takes the job for ended, and ends what outstays it (ftcoord.launcher.job_end_watch), against a real
store."""

from __future__ import annotations

import pytest

from ftcoord import StoreServer, connect, job_store
from ftcoord.launcher.job_end_watch import DONE_POLL_S, JobEndWatch
from ftcoord.protocol import keys
from ftcoord.store.client import get_or_none

pytestmark = pytest.mark.timeout(20)


def test_a_stop_of_an_earlier_run_is_not_this_runs_end_but_a_new_stop_is(store_server: StoreServer,
                                                                          job_id: str) -> None:
    """A relaunch after a stop finds keys.STOPPED of the run before: its children must not be ended grace_s into the
    new run. A stop written in this run (a newer generation's number) is its end."""
    store = job_store(connect(store_server.address), job_id)
    store.set(keys.STOPPED, "7")
    watch = JobEndWatch(grace_s=1.0, stale_stopped=get_or_none(store, keys.STOPPED))
    assert not watch.ended(store, now=100.0)
    assert not watch.outstayed(store, now=200.0)
    store.set(keys.STOPPED, "12")
    assert not watch.outstayed(store, now=200.0 + DONE_POLL_S / 2), "looked again before DONE_POLL_S"
    assert not watch.outstayed(store, now=200.0 + DONE_POLL_S), "seen stopped now; the grace period starts"
    assert watch.outstayed(store, now=201.0 + DONE_POLL_S)


def test_done_ends_the_job_whatever_stop_came_before(store_server: StoreServer, job_id: str) -> None:
    store = job_store(connect(store_server.address), job_id)
    store.set(keys.STOPPED, "3")
    watch = JobEndWatch(grace_s=0.0, stale_stopped=b"3")
    assert not watch.ended(store, now=1.0)
    store.set(keys.DONE, "9")
    assert watch.ended(store, now=2.0)
    assert watch.ended_at == 2.0
