"""The leader's round does not wait for an old generation's deletes (ftcoord.leader.forgetter.Forgetter).

Real store server, the leader's schedule run from a thread named as the leader duty's, so the store link counts its
requests apart from the forgetter's. Through tests/helpers/slow_store.py's proxy where a slow network is the point.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable

import pytest

from chaos.bench.forget import bench_forget, plant
from ftcoord import StoreServer
from ftcoord.leader.forgetter import BACKLOG, KEEP_GENERATIONS, ForgetSchedule, Forgetter
from ftcoord.log import get_logger
from ftcoord.protocol import keys
from ftcoord.store.client import get_or_none
from ftcoord.store.link import LinkedStore, StoreLink
from tests.helpers.slow_store import SlowProxy
from tests.helpers.wait import wait_until

pytestmark = pytest.mark.timeout(60)

_LEFT_BY_A_GENERATION = (keys.joiners, keys.probe, keys.interrupt, keys.evidence, keys.finished, keys.arrived,
                         keys.all_arrived)


def _forgotten(store: LinkedStore, generation: int, world: int) -> bool:
    left = [key(generation) for key in _LEFT_BY_A_GENERATION]
    left += [keys.gloo_rendezvous(generation, rank) for rank in range(world)]
    return get_or_none(store, keys.record(generation)) == keys.FORGOTTEN.encode() and not any(
        store.check([key]) for key in left)


def _as_leader(work: Callable[[], object]) -> None:
    """Run `work` in a thread named as the leader duty's (ftcoord-leader-<slot>: its requests count as the leader's)."""
    thread = threading.Thread(target=work, name="ftcoord-leader-0")
    thread.start()
    thread.join(30)
    assert not thread.is_alive(), "the leader's round did not come back"


def _deletes(link: StoreLink) -> Counter[str]:
    return Counter({role: n for (role, op), n in link.requests().items() if op == "delete_key"})


def test_the_leader_hands_an_old_generation_to_its_forgetter_and_sends_none_of_its_deletes(job_id: str) -> None:
    """One request per key, N of them for gloo's keys alone: the leader sends none (sabotage: a schedule with no
    forgetter, as before, has the leader send all of them and this fails)."""
    server = StoreServer("127.0.0.1", 0)
    link = StoreLink(server.address, job_id)
    store = link.connect()
    world, newest = 64, 1 + KEEP_GENERATIONS
    plant(store, 1, world)
    store.set(keys.all_arrived(newest), "1")  # the newest generation's members all hold its record: quiet
    forgetter = Forgetter(link.client, "ftcoord-forget-0", get_logger())
    schedule = ForgetSchedule(patience_s=30.0, forgetter=forgetter)
    schedule.decided(newest)
    try:
        _as_leader(lambda: schedule.run(store, newest))
        wait_until(lambda: _forgotten(store, 1, world), 20, "generation 1 forgotten by the forgetter")
        deletes = _deletes(link)
        assert deletes["leader"] == 0 and deletes["forget"] >= world, f"deletes by thread role: {dict(deletes)}"
    finally:
        forgetter.stop(wait_s=5.0)
        link.close()
        server.close()


def test_a_forgetter_backlog_generations_behind_leaves_the_next_ones_to_the_leader(job_id: str) -> None:
    """A forgetter on a slow network takes at most BACKLOG generations besides the one it deletes; the leader
    deletes the rest itself, so the store does not grow however fast it decides (sabotage: a forgetter that takes
    every generation leaves the leader nothing to delete, and this fails)."""
    server = StoreServer("127.0.0.1", 0)
    proxy = SlowProxy(server.address)
    proxy.slow_down(0.05, 0.0)  # each of the forgetter's answers 50 ms late: ~1 s a generation
    link = StoreLink(server.address, job_id)
    store = link.connect()
    slow = StoreLink(proxy.address, job_id)
    world, handed = 8, BACKLOG + 2  # one being deleted, BACKLOG waiting, and one more at least
    for generation in range(1, handed + 1):
        plant(store, generation, world)
    forgetter = Forgetter(slow.client, "ftcoord-forget-0", get_logger())
    schedule = ForgetSchedule(patience_s=30.0, forgetter=forgetter)
    for generation in range(1, handed + 1):
        schedule.decided(generation + KEEP_GENERATIONS)  # more than BACKLOG waiting: due, quiet or not
    try:
        _as_leader(lambda: schedule.run(store, None))
        assert _deletes(link)["leader"] >= world, f"deletes by thread role: {dict(_deletes(link))}"
        for generation in range(1, handed + 1):
            wait_until(lambda g=generation: _forgotten(store, g, world), 30, f"generation {generation} forgotten")
    finally:
        forgetter.stop(wait_s=0.0)
        slow.close()
        link.close()
        proxy.close()
        server.close()


def test_a_forgetter_that_cannot_open_its_client_leaves_the_deletes_to_the_leader(job_id: str) -> None:
    """Its thread ends, says why, and takes nothing more: the leader's round deletes what comes due itself (sabotage:
    a forgetter that still takes generations once its thread ended leaves them undeleted, and this fails)."""
    server = StoreServer("127.0.0.1", 0)
    link = StoreLink(server.address, job_id)
    store = link.connect()

    def no_client() -> LinkedStore:
        raise OSError("no descriptor left")

    forgetter = Forgetter(no_client, "ftcoord-forget-0", get_logger())
    try:
        assert forgetter.hand(1)  # taken: the thread starts, and fails to open its client
        wait_until(lambda: forgetter.failed is not None, 10, "the forgetter's failure")
        plant(store, 2, 4)
        schedule = ForgetSchedule(patience_s=0.0, forgetter=forgetter)
        schedule.decided(2 + KEEP_GENERATIONS)
        _as_leader(lambda: schedule.run(store, 2 + KEEP_GENERATIONS))
        assert _forgotten(store, 2, 4)  # at once, by the leader
        assert _deletes(link)["leader"] >= 4
    finally:
        forgetter.stop(wait_s=0.0)
        link.close()
        server.close()


def test_the_forget_bench_counts_the_leaders_requests_apart_from_its_forgetters(store_server: StoreServer) -> None:
    """`chaos bench --only forget`, small: deleting itself, the leader's round sends every delete (a key per member
    and the change's own); handing it over, the one look that says the newest generation is quiet."""
    rows = bench_forget(store_server.address, [16], reps=2)
    assert rows[0]["itself"]["leader_requests"] >= 16 + 6, rows
    assert rows[0]["handed"]["leader_requests"] == 1, rows
