"""Store clients that survive the store (ftcoord.store.link): reconnection, instances, bounded calls.

Real store servers: an in-process one that is closed and started again on the same port (a restart: the
new one is empty), and a separate `ftcoord-store` process that is SIGSTOPped (a hung server).
"""

from __future__ import annotations

import signal
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from ftcoord import Participant, QuorumPolicy, StoreProcess, StoreServer, pausepoints
from ftcoord.config import Timing
from ftcoord.errors import ConfigError, StoreLost, Superseded
from ftcoord.host import group_sockets
from ftcoord.host.process_state import stopped
from ftcoord.leader.election import Election
from ftcoord.leader.judge import Judge
from ftcoord.log import get_logger
from ftcoord.protocol import keys, restore, tally
from ftcoord.protocol.generations import EPOCH_SPAN, LeaderClaim, next_generation, read_record
from ftcoord.protocol.record import GenerationRecord
from ftcoord.protocol.slots import fenced, register
from ftcoord.store.client import get_or_none, wait_get
from ftcoord.store.link import INSTANCE_KEY, Instance, LinkedStore, StoreLink, StoreRestarted
from ftcoord.wrapper.generation_client import GenerationClient
from ftcoord.wrapper.participant import Arrival
from tests.helpers.wait import wait_until

pytestmark = pytest.mark.timeout(60)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Restartable:
    """A store server on a fixed port that can die and come back empty (counting its lives in `state_file`, when
    given, as `ftcoord-store` does by default)."""

    def __init__(self, state_file: Path | None = None) -> None:
        self.port = free_port()
        self.state_file = state_file
        self.server: StoreServer | None = StoreServer("127.0.0.1", self.port, state_file=state_file)
        self.address = f"127.0.0.1:{self.port}"

    def kill(self) -> None:
        assert self.server is not None
        self.server.close()
        self.server = None

    def start(self) -> None:
        self.server = StoreServer("127.0.0.1", self.port, state_file=self.state_file)

    def restart(self) -> None:
        self.kill()
        self.start()


@pytest.fixture
def store() -> Iterator[Restartable]:
    """A server that keeps no count of its lives (boot 0 each time)."""
    restartable = Restartable()
    yield restartable
    if restartable.server is not None:
        restartable.server.close()


@pytest.fixture
def counted(tmp_path: Path) -> Iterator[Restartable]:
    """A server that counts its lives in a state file."""
    restartable = Restartable(tmp_path / "store.boot")
    yield restartable
    if restartable.server is not None:
        restartable.server.close()


def link(store: Restartable, job_id: str, **kwargs: float) -> StoreLink:
    """A participant's link (it may start the job)."""
    options = {"connect_timeout": 10.0, "store_timeout": 20.0, "op_timeout": 5.0, "may_start_job": True, **kwargs}
    return StoreLink(store.address, job_id, **options)


def record(generation: int) -> GenerationRecord:
    return GenerationRecord(generation=generation, members=(0, 1), incarnations=(1, 1), leader=0, leader_term=3,
                            target_world_size=2, heal_source=0, start_step=10, liveness_read_at=0.0)


def test_a_client_rides_through_a_restart_and_the_store_is_rebuilt_before_its_operation(
        store: Restartable, job_id: str) -> None:
    first = link(store, job_id)
    client = first.connect()
    assert first.instance is not None and first.instance.epoch == 0
    client.set("mine", "1")
    held = record(7)
    rebuilt: list[str] = []

    def on_new_instance(view, base) -> None:
        restore.record(view, held, None)
        rebuilt.append("record")

    first.on_new_instance(on_new_instance)
    store.restart()
    # The first operation after the restart reconnects, sees an empty store, moves to epoch 1 and rebuilds.
    assert get_or_none(client, "mine") is None
    assert rebuilt == ["record"] and first.instance.epoch == 1 and first.instance_number == 1
    assert read_record(client, 7) == held
    assert int(get_or_none(client, keys.CURRENT) or 0) == 7
    # Every member of the record is registered again, so one that never comes back is judged by its silence.
    assert client.multi_get([keys.heartbeat(0), keys.heartbeat(1), keys.incarnation(1)]) == [b"0", b"0", b"1"]
    # The new epoch never decides a number the lost instance may have decided.
    assert next_generation(client, 7) == EPOCH_SPAN + 1
    first.close()


def test_a_paused_leaders_write_never_crosses_into_a_restarted_store(store: Restartable, job_id: str) -> None:
    """A leader decided generation 8 on what the lost instance showed, paused, and wakes in the new one: its
    pinned compare_set of the record raises instead of writing (without the pin it writes generation 8 there,
    a number the lost instance may have decided)."""
    leader = link(store, job_id)
    client = leader.connect()
    decided_on = leader.instance_number
    store.restart()
    with pytest.raises(StoreRestarted):
        client.compare_set(keys.record(8), "", record(8).to_json(), pinned=decided_on)
    assert get_or_none(client, keys.record(8)) is None
    leader.close()


def test_a_process_cut_off_through_two_restarts_rebuilds_the_newest(store: Restartable, job_id: str) -> None:
    """The store restarted twice while one process was paused: the others moved to epoch 2. The paused one finds
    epoch 2, later than any it knew: nothing it decides there can repeat a number, so it rebuilds what it holds
    (older than the others' knowledge, as a paused process's is: records only from absent, `gen/current` only
    forward) and takes part again, rather than being replaced."""
    awake, paused = link(store, job_id), link(store, job_id)
    awake_client, paused_client = awake.connect(), paused.connect()
    held = record(5)
    paused.on_new_instance(lambda view, base: restore.record(view, held, None))
    for _ in range(2):
        store.restart()
        awake_client.check([INSTANCE_KEY])  # moves to the next instance
    assert awake.instance.epoch == 2
    paused_client.check([INSTANCE_KEY])
    assert paused.instance == awake.instance and paused.instance_number == 1 and paused.stale is None
    assert read_record(awake_client, 5) == held
    awake.close()
    paused.close()


def test_a_stale_first_comer_at_a_server_without_a_count_supersedes_who_knew_better(store: Restartable,
                                                                                    job_id: str) -> None:
    """The fallback a store without a state file leaves (docs/store.md): a process paused through a whole store life
    reaches the next one first and proposes the epoch after the one it knew, an epoch the awake process already
    used; the awake process cannot vouch for it and exits superseded, with a line that says what to do."""
    awake, paused = link(store, job_id), link(store, job_id)
    awake_client, paused_client = awake.connect(), paused.connect()
    store.restart()
    awake_client.check([INSTANCE_KEY])
    store.restart()
    paused_client.check([INSTANCE_KEY])
    assert paused.instance.epoch == 1
    with pytest.raises(Superseded, match=r"without its count of its lives \(ftcoord-store --state-file\)"):
        awake_client.check([INSTANCE_KEY])
    with pytest.raises(Superseded):  # and stays so
        awake_client.set("x", "1")
    awake.close()
    paused.close()


def test_a_replacement_started_while_the_store_was_away_writes_the_next_epoch(store: Restartable, job_id: str) -> None:
    """A process its launcher starts during the outage knows the launcher's instance: first to reach the empty
    store, it writes epoch+1, not 0 (epoch 0 would decide the lost instance's numbers again)."""
    launcher = link(store, job_id)
    launcher.connect()
    known = launcher.instance
    store.restart()
    replacement = StoreLink(store.address, job_id, known=known, may_start_job=True)
    replacement.connect()
    assert replacement.instance is not None and replacement.instance.epoch == known.epoch + 1
    launcher.client().check([INSTANCE_KEY])
    assert launcher.instance == replacement.instance  # the launcher adopts it: the next epoch of its own
    launcher.close()
    replacement.close()


def test_a_store_away_past_store_timeout_raises_store_lost_naming_the_address(store: Restartable, job_id: str) -> None:
    lost = link(store, job_id, store_timeout=1.5)
    client = lost.connect()
    store.kill()
    started = time.monotonic()
    with pytest.raises(StoreLost, match=rf"{store.address}.*unreachable for \d+s.*store_timeout=2s"):
        client.add("counter", 1)
    assert time.monotonic() - started < 6.0
    with pytest.raises(StoreLost):  # at once from then on
        client.check(["x"])
    lost.close()


def stop(server: StoreProcess) -> None:
    """SIGSTOP the store's server, and wait until the kernel says it stopped: a signal is delivered asynchronously,
    and a server that ran on for a moment answered the call that was to hang (seen once in CI, on 2 busy cores)."""
    server.process.send_signal(signal.SIGSTOP)
    wait_until(lambda: stopped(server.process.pid), 5, "the store's server to stop")


def test_a_hung_store_is_a_store_away_not_a_frozen_client(job_id: str) -> None:
    """A SIGSTOPped server hangs TCPStore calls past every timeout; the link cuts the call after op_timeout and
    gives up at store_timeout, while the server is still stopped (without the cut: blocked until SIGCONT)."""
    server = StoreProcess.start("127.0.0.1", 0)
    resume = threading.Timer(40.0, lambda: server.process.send_signal(signal.SIGCONT))
    try:
        hung = StoreLink(server.address, job_id, op_timeout=1.0, store_timeout=3.0, may_start_job=True)
        client = hung.connect()
        client.set("a", "1")
        stop(server)
        resume.start()
        started = time.monotonic()
        with pytest.raises(StoreLost):
            client.get("a")
        assert time.monotonic() - started < 10.0
        hung.close()
    finally:
        resume.cancel()
        server.process.send_signal(signal.SIGCONT)
        server.stop()


def test_a_store_that_answers_again_after_a_hang_is_the_same_instance(job_id: str) -> None:
    """A hang outlasting op_timeout but not store_timeout: the cut call reconnects to the same instance, which
    lost nothing: no rebuild, the value is still there."""
    server = StoreProcess.start("127.0.0.1", 0)
    try:
        paused = StoreLink(server.address, job_id, op_timeout=1.0, store_timeout=30.0, may_start_job=True)
        client = paused.connect()
        before = paused.instance
        assert before is not None
        client.set("a", "1")
        stop(server)
        threading.Timer(2.5, lambda: server.process.send_signal(signal.SIGCONT)).start()
        assert client.get("a") == b"1"
        assert paused.instance == before and paused.instance_number == 0
        paused.close()
    finally:
        server.process.send_signal(signal.SIGCONT)
        server.stop()


def test_instances_parse_and_refuse_garbage() -> None:
    assert Instance.parse(b"3:abc") == Instance(3, "abc")
    with pytest.raises(Exception, match="epoch:nonce"):
        Instance.parse("x")


def waiting_joiner(store: Restartable, job_id: str) -> tuple[StoreLink, int, list[GenerationRecord],
                                                           threading.Thread, LinkedStore]:
    """Slot 0 registered, announced for generation 1 and waiting for its record (in a thread, slices of 10 s): its
    link, incarnation, what its join returns, the thread, and another process's client."""
    joiner_link = link(store, job_id)
    joiner_store = joiner_link.connect()
    incarnation = register(joiner_store, 0)
    joiner = GenerationClient(joiner_store, 0, incarnation, Timing(heartbeat_interval=1.0, heartbeat_timeout=10.0))
    joined: list[GenerationRecord] = []
    thread = threading.Thread(target=lambda: joined.append(joiner.join(step=5)), daemon=True)
    thread.start()
    other = link(store, job_id).connect()
    wait_until(lambda: get_or_none(other, keys.joiners(1)) is not None, 10, "the announcement for generation 1")
    wait_until(lambda: joiner_store.requests[("trainer", "get")] >= 1, 10, "the joiner in its wait for the record")
    return joiner_link, incarnation, joined, thread, other


def test_a_joiner_waiting_through_a_restart_announces_itself_again_for_the_new_epoch(
        store: Restartable, job_id: str) -> None:
    """A process that announced itself for generation 1 and waits for its record when the store restarts: its
    announcement is lost with the store and generation 1 is never decided there (the new epoch decides above
    EPOCH_SPAN). It announces itself again for EPOCH_SPAN + 1, at once (its wait is pinned to the instance it
    announced itself in: sabotage, unpinned, it waited out its first slice, 10 s here), and joins the record decided
    there."""
    joiner_link, incarnation, joined, thread, leader = waiting_joiner(store, job_id)
    store.restart()
    wait_until(lambda: get_or_none(leader, keys.joiners(EPOCH_SPAN + 1)) is not None, 2.5,
               "the announcement again, for the new epoch's first generation")
    assert get_or_none(leader, keys.joiners(1)) is None, "it announced itself for a number of the lost store"
    decided = GenerationRecord(generation=EPOCH_SPAN + 1, members=(0,), incarnations=(incarnation,), leader=0,
                               leader_term=1, target_world_size=1, heal_source=0, start_step=5, liveness_read_at=0.0)
    leader.compare_set(keys.record(EPOCH_SPAN + 1), "", decided.to_json())
    thread.join(10)
    assert joined == [decided]
    joiner_link.close()


def test_a_member_that_never_read_its_record_joins_it_when_a_member_writes_it_back(
        store: Restartable, job_id: str) -> None:
    """Generation 1 was decided with slot 0 in it, and the store restarted before slot 0 read its record; another
    member, which read it, writes it back as it rebuilds (here: first, under the restarted link's lock). Slot 0 joins
    generation 1, where its peers wait for it at the rendezvous, instead of announcing itself for the new epoch's
    first number (then its peers waited for it until pg_timeout). Sabotage: announcing again without reading the
    rebuilt record leaves the join waiting for generation EPOCH_SPAN + 1."""
    joiner_link, incarnation, joined, thread, observer = waiting_joiner(store, job_id)
    decided = GenerationRecord(generation=1, members=(0, 1), incarnations=(incarnation, 1), leader=1, leader_term=1,
                               target_world_size=2, heal_source=1, start_step=5, liveness_read_at=0.0)
    joiner_link.on_new_instance(lambda view, base: restore.record(view, decided, None))  # the member's write-back
    store.restart()
    thread.join(5)
    assert joined == [decided]
    assert get_or_none(observer, keys.joiners(EPOCH_SPAN + 1)) is None
    joiner_link.close()


def test_a_leader_paused_before_its_record_write_through_a_restart_decides_nothing_there(
        store: Restartable, job_id: str) -> None:
    """The leader has generation 2's record ready, pauses (a pause point), the store restarts empty, the leader
    wakes: its write is pinned to the instance it observed, so generation 2 (a number of the lost store) is
    never written in the new one; the joiner joins the new epoch's first generation instead. Without the pin
    the leader writes record 2 into the new store."""
    fast = Timing(heartbeat_interval=0.1, heartbeat_timeout=1.0, join_timeout=0.3, barrier_timeout=10.0)
    member = Participant(store.address, job_id, 0, QuorumPolicy(1), fast, on_helper_failure=lambda reason: None)
    member.start()
    try:
        wait_until(lambda: member.leader.is_leader, 5, "slot 0 to lead")
        assert member.join(0).generation == 1
        gate = pausepoints.hold(pausepoints.LEADER_BEFORE_RECORD)
        try:
            member.interrupt("test")
            joined: list[GenerationRecord] = []
            thread = threading.Thread(target=lambda: joined.append(member.join(0)), daemon=True)
            thread.start()
            assert gate.wait_reached(5), "the leader never came to write generation 2"
            store.restart()
            observer = StoreLink(store.address, job_id).connect()  # an observer: it never writes an instance
            wait_until(lambda: get_or_none(observer, keys.record(1)) is not None, 10, "the store to be rebuilt")
        finally:
            gate.release()
        thread.join(15)
        assert joined and joined[0].generation == EPOCH_SPAN + 1, joined
        assert get_or_none(observer, keys.record(2)) is None, "the paused leader decided a lost store's number"
    finally:
        member.close()


def test_an_observer_that_knows_nothing_never_writes_an_instance(store: Restartable, job_id: str) -> None:
    """A launcher's or the chaos runner's link, first at a restarted store, cannot tell it from a new job's:
    it writes nothing (epoch 0 there would make every process of the job superseded), and learns the instance
    the job's processes write."""
    member = link(store, job_id)
    member.connect()
    store.restart()
    observer = StoreLink(store.address, job_id)
    client = observer.connect()
    assert observer.instance is None and get_or_none(client, INSTANCE_KEY) is None
    member.client().check([INSTANCE_KEY])  # the member moves on to epoch 1
    assert observer.learn_instance(client) == member.instance and member.instance.epoch == 1
    member.close()
    observer.close()


def test_a_finish_that_was_interrupted_is_not_counted_again_in_a_rebuilt_store(
        store: Restartable, job_id: str) -> None:
    """A member returned in generation 3 (finished 1 of 2), then the generation was interrupted and it trained
    on elsewhere: a rebuild must not count that finish again (every member doing so would mark the job done)."""
    member_link = link(store, job_id)
    member_store = member_link.connect()
    client = GenerationClient(member_store, 0, 1, Timing(heartbeat_interval=0.1, heartbeat_timeout=1.0))
    held = record(3)
    threading.Timer(0.3, lambda: member_store.clone().compare_set(keys.interrupt(3), "", "test")).start()
    assert client.finish(held) is False
    assert get_or_none(member_store, keys.finished(3)) == b"1"
    store.restart()
    view = member_store.view()  # reconnects: a new, empty instance
    client.rebuild(view)
    assert get_or_none(view, keys.finished(3)) is None and get_or_none(view, keys.DONE) is None
    member_link.close()


def test_clients_made_side_by_side_in_one_process_own_only_their_own_sockets(store: Restartable, job_id: str) -> None:
    """Many links in one process (a participant per thread in these tests; hundreds per process in `chaos bench
    --scale`), their clients made at the same moment: each client owns exactly its own connection, so closing one
    (or cutting its unanswered call) never cuts another's."""
    links = [StoreLink(store.address, job_id, connect_timeout=10, op_timeout=10) for _ in range(4)]
    for each in links:
        each.connect()
    clients = [link.client() for link in links for _ in range(6)]
    start = threading.Barrier(len(clients))

    def first_call(client: LinkedStore) -> None:
        start.wait()
        client.add("counter", 1)

    threads = [threading.Thread(target=first_call, args=(c,)) for c in clients]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    owned = [set(c._connection.sockets) for c in clients]  # noqa: SLF001 - what close() and the watchdog cut
    assert all(len(sockets) == 1 for sockets in owned), owned
    assert len(set().union(*owned)) == len(clients), "two clients claim the same socket"
    clients[0].close()
    for client in clients[1:]:
        assert client.add("counter", 1) > 0  # still connected: no reconnection needed
    sessions = {link._session for link in links}  # noqa: SLF001
    assert sessions == {0}, "a client's close cut another's connection (it had to reconnect)"
    for each in links:
        each.close()


def test_a_cut_client_fails_its_call_in_flight_at_once_and_its_next_call_reconnects(
        store: Restartable, job_id: str) -> None:
    """`cut()` (what a process group's creation gets when its generation is interrupted: ftcoord.wrapper.call): a wait
    in
    flight on the client's raw store, as torch's rendezvous sends it from C++, fails at once rather than after the
    client's 300 s; the next call opens a new connection without taking the store for away (no reconnection of the
    link's other clients)."""
    each = link(store, job_id)
    each.connect()
    client, other = each.client(), each.client()
    client.add("counter", 1)
    raw = client.view()
    failed: list[float] = []

    def wait_in_flight() -> None:
        started = time.monotonic()
        try:
            raw.wait(["never-written"])
        except Exception:  # noqa: BLE001 - any failure: what counts is when
            failed.append(time.monotonic() - started)

    waiter = threading.Thread(target=wait_in_flight, daemon=True)
    waiter.start()
    time.sleep(0.2)  # the wait is sent (a cut before it is sent fails it too)
    assert client.cut() == 1
    waiter.join(10)
    assert failed and failed[0] < 5, f"the wait in flight failed after {failed}s, not at once"
    assert client.add("counter", 1) == 2  # a new connection, the same store
    assert each.down is False and each.lost is None and each._session == 0  # noqa: SLF001 - not taken for away
    assert other.add("counter", 1) == 3
    each.close()


def test_the_watchdog_sleeps_until_a_call_may_be_overdue_and_cuts_it_on_time(
        job_id: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """An idle link's watchdog sleeps op_timeout (no call that starts meanwhile can be due sooner); one watching a
    call sleeps until that call's deadline and cuts it then, not at the next of a fixed series of looks."""
    cuts: list[float] = []
    shut_down = group_sockets.shut_down

    def timed_shut_down(record: dict[int, str]) -> int:
        cuts.append(time.monotonic())
        return shut_down(record)

    monkeypatch.setattr(group_sockets, "shut_down", timed_shut_down)
    server = StoreProcess.start("127.0.0.1", 0)
    try:
        hung = StoreLink(server.address, job_id, op_timeout=4.0, store_timeout=60.0, may_start_job=True)
        client = hung.connect()
        client.set("a", "1")
        assert hung.calls.until_due() == pytest.approx(4.0, abs=0.01)  # nothing watched
        token = hung.calls.watch(1.5, {}, {})
        assert 1.3 < hung.calls.until_due() <= 1.5
        hung.calls.unwatch(token)
        stop(server)
        threading.Timer(6.0, lambda: server.process.send_signal(signal.SIGCONT)).start()
        started = time.monotonic()
        assert client.get("a") == b"1"  # cut at op_timeout, then reconnected once the server answers again
        assert cuts, "the hung call was never cut"
        assert 4.0 <= cuts[0] - started < 4.8, f"cut {cuts[0] - started:.2f}s after the call started (op_timeout 4 s)"
        hung.close()
    finally:
        server.process.send_signal(signal.SIGCONT)
        server.stop()


def test_a_timed_get_counts_what_the_server_handles_and_rides_through_a_restart(
        store: Restartable, job_id: str) -> None:
    """LinkedStore.get_within (ftcoord.store.client.wait_get's path): a get whose wait is bounded, counted as the server
    sees it (a wait and a read; a wait that timed out, and its cancellation, with no read); a get waiting when the
    store restarts waits again in the new instance and reads the key written there."""
    client, writer = link(store, job_id).connect(), link(store, job_id).connect()
    assert wait_get(client, "k", 0.2) is None
    assert +client.requests == Counter({("trainer", "get"): 1, ("trainer", "cancel_wait"): 1})
    found: list[bytes | None] = []
    thread = threading.Thread(target=lambda: found.append(wait_get(client, "k", 15.0)), daemon=True)
    thread.start()
    wait_until(lambda: client.requests[("trainer", "get")] >= 3, 10, "the second get sent")
    store.restart()
    wait_until(lambda: writer.check([INSTANCE_KEY]), 10, "the writer in the new instance")
    writer.set("k", "after the restart")
    thread.join(15)
    assert found == [b"after the restart"]


def test_a_replacement_that_knows_nothing_reaches_the_restarted_store_first_and_the_survivor_follows(
        counted: Restartable, job_id: str) -> None:
    """Issue 76, 1(a): the store restarts while a rank is dead; its replacement knows no instance (its launcher
    learned none) and reaches the empty store first. On a server that counts its lives it writes the server's boot,
    not epoch 0 (which would decide generation 1 again), and the survivor, who knew epoch 0, follows it and
    rebuilds: nobody is superseded. Sabotage: a proposal that ignores the boot writes epoch 0 and supersedes the
    survivor."""
    survivor = link(counted, job_id)
    survivor_client = survivor.connect()
    assert survivor.instance.epoch == 0
    rebuilt: list[int] = []
    survivor.on_new_instance(lambda view, base: rebuilt.append(survivor.instance.epoch))
    counted.restart()
    replacement = StoreLink(counted.address, job_id, known=None, may_start_job=True)
    replacement_client = replacement.connect()
    assert replacement.instance.epoch == 1
    assert next_generation(replacement_client, 0) == EPOCH_SPAN + 1
    survivor_client.check([INSTANCE_KEY])
    assert rebuilt == [1] and survivor.instance == replacement.instance and survivor.stale is None
    survivor.close()
    replacement.close()


def test_a_process_paused_through_a_whole_store_life_and_first_at_the_next_supersedes_nobody(
        counted: Restartable, job_id: str) -> None:
    """Issue 76, 1(b): one process sleeps through a whole life of the store (epoch 1) and is the first to reach the
    next one. It writes the server's boot (2), not its own next epoch (1, which the awake process used and may have
    decided numbers in), and both move to epoch 2 and rebuild. Sabotage: a proposal of known + 1 writes epoch 1
    again and supersedes the awake process."""
    awake, paused = link(counted, job_id), link(counted, job_id)
    awake_client, paused_client = awake.connect(), paused.connect()
    counted.restart()
    awake_client.check([INSTANCE_KEY])
    assert awake.instance.epoch == 1
    counted.restart()
    paused_client.check([INSTANCE_KEY])  # first to reach the third life
    assert paused.instance.epoch == 2 and paused.stale is None
    awake_client.check([INSTANCE_KEY])
    assert awake.instance == paused.instance and awake.instance_number == 2 and awake.stale is None
    assert next_generation(awake_client, EPOCH_SPAN + 7) == 2 * EPOCH_SPAN + 1
    awake.close()
    paused.close()


def test_a_launcher_knows_the_instance_from_its_start_and_rebuilds_after_a_restart(
        counted: Restartable, job_id: str) -> None:
    """A launcher's link on a server that counts its lives settles the instance at connect (its first children
    get it), and rebuilds like a participant when the store restarts; an observer still writes nothing."""
    launcher = StoreLink(counted.address, job_id, settles_counted=True)
    client = launcher.connect()
    assert launcher.instance is not None and launcher.instance.epoch == 0
    rebuilt: list[int] = []
    launcher.on_new_instance(lambda view, base: rebuilt.append(launcher.instance.epoch))
    counted.restart()
    client.check([INSTANCE_KEY])
    assert rebuilt == [1]
    other = StoreLink(counted.address, f"{job_id}-other")
    assert other.connect().check([INSTANCE_KEY]) is False and other.instance is None
    launcher.close()
    other.close()


def test_a_server_counts_its_lives_in_its_state_file_and_refuses_a_damaged_one(tmp_path: Path) -> None:
    state = tmp_path / "boot"
    boots = []
    for _ in range(3):
        server = StoreServer("127.0.0.1", 0, state_file=state)
        boots.append(server.boot)
        server.close()
    assert [b.number for b in boots] == [0, 1, 2] and all(b.counted for b in boots)
    assert state.read_text() == "2\n"
    assert not StoreServer("127.0.0.1", 0).boot.counted
    state.write_text("two\n")
    with pytest.raises(ConfigError, match=r"holds 'two', not a boot number; restore it, or pass another"):
        StoreServer("127.0.0.1", 0, state_file=state)
    assert state.read_text() == "two\n", "a damaged state file was overwritten"


def test_a_member_waiting_at_the_rendezvous_arrives_again_in_a_restarted_store(counted: Restartable,
                                                                               job_id: str) -> None:
    """Rank 0 reached generation 9's rendezvous and waits for rank 1 when the store restarts: its arrival is lost
    with the store, so it arrives again as it rebuilds, and rank 1, arriving in the new store, completes the
    rendezvous. Sabotage: without the arrival written back, rank 1 reads 1 of 2 and both wait until pg_timeout.
    A member that had seen everyone arrive writes all_arrived back instead."""
    fast = Timing(heartbeat_interval=0.1, heartbeat_timeout=1.0, join_timeout=0.3, barrier_timeout=10.0)
    member = Participant(counted.address, job_id, 0, QuorumPolicy(1), fast, on_helper_failure=lambda reason: None)
    member.start()
    try:
        member.record = record(9)
        member.arrival = Arrival(9, 0, 2)
        assert tally.arrive(member.store, 9, 0, 2) is False
        counted.restart()
        member.store.check([INSTANCE_KEY])  # moves to the new instance, and rebuilds it
        assert member.link.instance.epoch == 1
        other = link(counted, job_id).connect()
        assert tally.arrive(other, 9, 1, 2) is True
        assert get_or_none(other, keys.all_arrived(9)) == b"1"
        member.arrival.met = True
        counted.restart()
        member.store.check([INSTANCE_KEY])
        assert get_or_none(member.store, keys.all_arrived(9)) == b"1"
    finally:
        member.close()


def test_the_leader_key_written_back_never_goes_back_to_an_older_term(store: Restartable, job_id: str) -> None:
    """A process that fell behind writes back term 3 first; the holder of term 5 then replaces it (compare_set from
    absent alone left term 3 there, and a takeover claimed term 4 again); a lower term after it changes nothing."""
    client = link(store, job_id).connect()
    restore.leader_term(client, None, 3)
    restore.leader_term(client, "5:2:1", 5)
    assert get_or_none(client, keys.LEADER) == b"5:2:1"
    restore.leader_term(client, None, 4)
    restore.leader_term(client, None, 5)
    assert get_or_none(client, keys.LEADER) == b"5:2:1"


def test_a_leaders_fences_are_written_back_and_never_lowered(counted: Restartable, job_id: str) -> None:
    """The leader fenced slot 2 (incarnation 1) and the store restarted: its launcher, paused through it, would wake to
    a store that no longer says so, and its process would wait as a spare, left out for good. The leader writes the
    fence back at each restart, over the "0" a registration wrote, never over a fence of a later incarnation."""
    client = link(counted, job_id).connect()
    judge = Judge(client, Timing(), None, get_logger(component="test"))
    assert judge._fence(2, 1, "test", 3) and judge._fence(4, 5, "test", 3)
    assert judge._fence(6, 1, "test", 2)  # an earlier term of ours: a leader between may have let it take part
    for _ in range(2):
        counted.restart()
        view = client.view()
        restore.slot(view, 2, 1)  # the launcher or the process, first: its fence key reads "0"
        view.set(keys.fence(4), "3:6")  # a later incarnation of slot 4 was fenced since
        judge.write_back_fences(view, 3)
        judge.rebuilt()
        assert get_or_none(client, keys.fence(2)) == b"3:1"
        assert get_or_none(client, keys.fence(4)) == b"3:6"
        assert get_or_none(client, keys.fence(6)) is None
    assert fenced(client, 2, 1) is not None


def test_a_deposed_leader_writes_back_the_newer_holders_term_and_a_claim_naming_us_is_taken_up(
        store: Restartable, job_id: str) -> None:
    """A leader of term 4 lost the key to "5:7:1" and follows: at a restart it writes back the holder's claim of term 5
    (it wrote "4:released": the term went back, and a takeover claimed term 5 again). A claim written back for a
    process that follows (a follower that came back first wrote its holder's) makes it lead again."""
    client = link(store, job_id).connect()
    log = get_logger(component="test")
    judge = Judge(client, Timing(), None, log)
    elected: list[int] = []
    election = Election(client, 2, 1, judge, log, lambda incarnation: None, lambda: elected.append(1))
    election.claim = LeaderClaim(4, 2, 1)
    election.lose(LeaderClaim(5, 7, 1))
    store.restart()
    view = client.view()
    assert election.rebuild(view, None) is False
    assert get_or_none(client, keys.LEADER) == b"5:7:1"
    view.set(keys.LEADER, "6:2:1")  # written back for us by a follower
    restore.slot(view, 2, 1)  # and our registration, as our own rebuild writes it
    election.forget_holder()
    election.follow(client.link.instance_number)
    assert election.claim == LeaderClaim(6, 2, 1) and elected == [1]


def test_a_rebuild_longer_than_one_calls_bound_completes(counted: Restartable, job_id: str) -> None:
    """A rebuild of many members' keys takes longer than op_timeout: each of its requests is bounded and answered, so
    it is never cut as one hung call (cut, the rebuild started over on the next connection, and was cut again, until
    store_timeout). Here op_timeout is 1 s and the rebuild makes requests for 2.5 s."""
    member = link(counted, job_id, op_timeout=1.0, store_timeout=15.0)
    client = member.connect()
    runs: list[int] = []

    def slow_rebuild(view, base) -> None:
        runs.append(1)
        started = time.monotonic()
        while time.monotonic() - started < 2.5:
            view.set("rebuilt", "1")
            view.check(["rebuilt"])
            time.sleep(0.05)

    member.on_new_instance(slow_rebuild)
    counted.restart()
    assert client.get("rebuilt") == b"1"
    assert runs == [1] and member.instance_number == 1 and member.lost is None
    member.close()
