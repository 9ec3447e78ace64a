"""Counts that stay exact when a store request is retried (ftcoord.protocol.tally), against real store servers.

A request cut while the server hung (SIGSTOP) is still in the server's receive buffer and runs when it resumes,
beside its retry: `add` then counts twice. The members' marks and compare_set increments must not.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from ftcoord import StoreProcess, StoreServer
from ftcoord.host.process_state import stopped
from ftcoord.protocol import keys, tally
from ftcoord.protocol.slots import register
from ftcoord.store.client import get_or_none, read_int
from ftcoord.store.link import StoreLink
from tests.helpers.wait import wait_until

pytestmark = pytest.mark.timeout(120)


class HangsBeforeWrites:
    """A client whose every write (a compare_set that sets, an add) finds the server SIGSTOPped: the request waits in
    the server's buffer, the link cuts it after op_timeout and retries it, and the server resumes `hang_s` later."""

    def __init__(self, client: Any, server: StoreProcess, hang_s: float) -> None:
        self._client, self._server, self._hang_s = client, server, hang_s
        self.hangs = 0

    def _hang(self) -> None:
        self._server.process.send_signal(signal.SIGSTOP)
        wait_until(lambda: stopped(self._server.process.pid), 5, "the store's server to stop")
        threading.Timer(self._hang_s, lambda: self._server.process.send_signal(signal.SIGCONT)).start()
        self.hangs += 1

    def compare_set(self, key: str, expected: str, desired: str) -> bytes:
        if expected != desired:
            self._hang()
        return self._client.compare_set(key, expected, desired)

    def add(self, key: str, amount: int) -> int:
        self._hang()
        return self._client.add(key, amount)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


@pytest.fixture
def hung_server() -> Iterator[StoreProcess]:
    server = StoreProcess.start("127.0.0.1", 0)
    yield server
    server.process.send_signal(signal.SIGCONT)
    server.stop()


def test_an_increment_cut_and_retried_through_hangs_counts_each_call_once(hung_server: StoreProcess,
                                                                           job_id: str) -> None:
    """Three increments (a slot's incarnation: register()), each cut by the link's watchdog while the server hung and
    retried after it resumed: the count is 3 and each call returned its own number. Sabotage: with `add`, the count
    the issue measured was one too high in 3 of 4 tries."""
    link = StoreLink(hung_server.address, job_id, op_timeout=1.0, store_timeout=30.0, may_start_job=True)
    client = link.connect()
    hanging = HangsBeforeWrites(client, hung_server, hang_s=2.5)
    returned = [tally.increment(hanging, keys.incarnation(4)) for _ in range(3)]
    assert hanging.hangs == 3
    assert returned == [1, 2, 3] and read_int(client, keys.incarnation(4)) == 3
    assert register(client, 4) == 4
    link.close()


def test_a_rendezvous_counted_twice_waits_for_the_member_still_missing(store_server: StoreServer,
                                                                        job_id: str) -> None:
    """The arrival hint counted one arrival twice (a retried add): the first member's arrival reads 2 of 2, but the
    second member's mark is missing, so nobody declares everyone arrived until it comes. Sabotage: acting on the hint
    alone (the code before marks) sets all_arrived with a member missing."""
    client = StoreLink(store_server.address, job_id, may_start_job=True).connect()
    client.add(keys.arrived(7), 1)  # the retried request's twin, run by the server after it resumed
    assert tally.arrive(client, 7, 0, 2) is False
    assert get_or_none(client, keys.all_arrived(7)) is None
    assert tally.arrive(client, 7, 1, 2) is True
    assert get_or_none(client, keys.all_arrived(7)) == b"1"


def test_a_job_ends_only_once_every_member_marked_its_finish(store_server: StoreServer, job_id: str) -> None:
    """The finish hint counted twice: the first member's finish is not the job's end; the second's is, and a
    member that returned to stop makes it a stop whoever counted last."""
    client = StoreLink(store_server.address, job_id, may_start_job=True).connect()
    client.add(keys.finished(3), 1)
    assert tally.finish(client, 3, 5, (5, 9), stopping=True) is None
    assert tally.finish(client, 3, 5, (5, 9), stopping=False) is None, "a member's finish counted twice"
    assert tally.finish(client, 3, 9, (5, 9), stopping=False) == "stop"
    assert get_or_none(client, keys.finished_by(3, 5)) == b"stop"
