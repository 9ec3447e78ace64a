"""The leader's read of every slot in requests of a few slots, and its end at the running generation's interrupt
(ftcoord.leader.slot_scan), against a real store."""

from __future__ import annotations

from typing import Any

import pytest

from ftcoord import StoreServer, connect, job_store
from ftcoord.leader import slot_scan
from ftcoord.leader.slot_scan import SlotScan
from ftcoord.protocol import keys
from ftcoord.protocol.slots import FACT_KEYS, FactsCache, read_facts_and, read_facts_unless, register
from ftcoord.store import link as store_link
from ftcoord.store.link import StoreLink, bounded_multi_get

pytestmark = pytest.mark.timeout(30)

SLOTS = [0, 1, 2, 3, 4]


class Counted:
    """A store client whose multi_gets are counted: `sizes`, the keys each one asked."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.sizes: list[int] = []

    def multi_get(self, names: list[str]) -> list[bytes]:
        self.sizes.append(len(names))
        return self._store.multi_get(names)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


@pytest.fixture
def store(store_server: StoreServer, job_id: str) -> Counted:
    store = job_store(connect(store_server.address), job_id)
    for slot in SLOTS:
        register(store, slot)
        store.add(keys.heartbeat(slot), slot)  # every slot's counters differ
    store.set(keys.LEADER, "1:0:1")
    return Counted(store)


def test_a_read_in_requests_of_two_slots_reads_what_one_request_reads(store: Counted) -> None:
    extra, facts = read_facts_and(store, SLOTS, [keys.LEADER])
    store.sizes.clear()
    asked: list[int] = []
    chunked = read_facts_unless(store, SLOTS, [keys.LEADER], None, lambda: asked.append(1) or False, per_request=2)
    assert chunked == (extra, facts, True)
    assert store.sizes == [1 + 2 * 6, 2 * 6, 1 * 6], "one request per two slots, the first with the extra key"
    assert len(asked) == 2, "asked before each request after the first"


def test_a_read_stops_at_the_running_generations_interrupt_and_stands_on_the_last_whole_read(
    monkeypatch: pytest.MonkeyPatch, store: Counted
) -> None:
    monkeypatch.setattr(slot_scan, "READ_SLOTS_PER_REQUEST", 2)
    reads = SlotScan(store)
    read_at, facts, claim, fresh = reads.read(instance=0, running=None)  # learns the slots: read whole
    assert fresh and sorted(facts) == SLOTS and claim == b"1:0:1"
    assert reads.read(instance=0, running=7)[3], "a generation running and not interrupted: read whole"

    store.add(keys.heartbeat(3), 100)
    store.set(keys.LEADER, "2:1:1")
    store.set(keys.interrupt(7), "test")
    store.sizes.clear()
    standing_at, standing, claim, fresh = reads.read(instance=0, running=7)
    assert not fresh and len(store.sizes) == 1, "read on after the interrupt"
    assert claim == b"2:1:1", "the claim is this read's (its first request)"
    assert standing[3].heartbeat == facts[3].heartbeat, "the facts are the last whole read's"
    assert standing_at > read_at

    assert reads.read(instance=1, running=7)[3], "a whole read of another store instance is nothing to stand on"
    reads.forget()
    _, facts, _, fresh = reads.read(instance=1, running=7)
    assert fresh and facts[3].heartbeat == standing[3].heartbeat + 100, "nothing to stand on after forget()"


def test_a_slots_facts_stay_in_one_request_when_a_read_is_cut_by_its_bytes(
    monkeypatch: pytest.MonkeyPatch, store: Counted
) -> None:
    """Past MULTI_GET_BYTES of keys a read is cut into several requests (the store's CPU per request grows much faster
    than its keys: ftcoord.store.link.MULTI_GET_BYTES), never inside a slot's keys (its facts are one snapshot), and
    reads what one request reads."""
    extra, facts = read_facts_and(store, SLOTS, [keys.LEADER])
    assert store.sizes == [1 + 5 * 6]
    widest = max(len(key(slot)) for slot in SLOTS for key in FACT_KEYS) + 64  # a plain client's prefix allowance
    monkeypatch.setattr(store_link, "MULTI_GET_BYTES", 2 * 6 * widest + 5)  # two slots' keys, not three
    store.sizes.clear()
    assert read_facts_and(store, SLOTS, [keys.LEADER]) == (extra, facts)
    assert store.sizes == [1 + 2 * 6, 2 * 6, 1 * 6], "two slots a request, the first with the extra key"


def test_a_read_of_thousands_of_keys_is_cut_into_requests_the_store_serves_cheaply(
    store_server: StoreServer, job_id: str
) -> None:
    """At the default bound, through a job's client (its prefix counted): 4,096 slots' heartbeats (a status read) in
    requests of at most MULTI_GET_BYTES of keys on the wire, the values in order. In one request they cost the store
    ~15x the CPU (the module's docstring), while every other client of the job waited."""
    link = StoreLink(store_server.address, job_id, connect_timeout=30)
    client = link.connect()
    try:
        names = [keys.heartbeat(slot) for slot in range(4096)]
        client.view().multi_set(names, [str(slot) for slot in range(4096)])
        counted = Counted(client)
        assert bounded_multi_get(counted, names) == [str(slot).encode() for slot in range(4096)]
        on_the_wire = client.key_overhead + max(map(len, names))
        assert on_the_wire == len(f"/ftcoord/{job_id}/{names[-1]}") + 8, "the prefix and the length are counted"
        assert len(counted.sizes) > 1 and sum(counted.sizes) == 4096, counted.sizes
        assert all(size * on_the_wire <= store_link.MULTI_GET_BYTES for size in counted.sizes), counted.sizes
    finally:
        link.close()


def test_a_slot_read_as_it_was_is_not_parsed_again_and_each_of_its_keys_changed_is_seen(store: Counted) -> None:
    reads = SlotScan(store)
    _, first, _, _ = reads.read(instance=0, running=None)
    _, again, _, _ = reads.read(instance=0, running=None)
    assert all(again[slot] is first[slot] for slot in SLOTS), "values as they were: the facts parsed before"
    for key, value in zip(FACT_KEYS, ("2", "99", "12/3:w", "1", "1", "3:4"), strict=True):
        store.set(key(2), value)
        before = again
        _, again, _, _ = reads.read(instance=0, running=None)
        assert again[2] == read_facts_and(store, [2], [])[1][2], f"{key(2)} set to {value}: the facts say so"
        assert again[2] is not before[2]
        assert all(again[slot] is before[slot] for slot in SLOTS if slot != 2)


def test_a_slot_no_longer_registered_is_forgotten_by_the_cache(store: Counted) -> None:
    cache = FactsCache()
    _, facts = read_facts_and(store, SLOTS, [], cache=cache)
    raw = tuple(store.multi_get([key(4) for key in FACT_KEYS]))
    assert cache.facts(4, raw) is facts[4]
    cache.keep([0, 1])
    assert cache.facts(4, raw) is not facts[4], "a slot gone is not kept"
    assert cache.facts(4, raw) == facts[4]
