"""Store clients that survive the store: they reconnect, bound every operation, and know the server's instance.

TCPStore's own clients never reconnect after the server went away, and a server that stops answering hangs them
past every timeout. A `StoreLink` is one process's access to the store of one job; each thread takes its own
`LinkedStore` from it (one client per thread: a thread blocked in `wait` holds its client). A LinkedStore bounds
every operation (ftcoord.store.call_watch), reconnects with backoff and runs the operation again, and raises
StoreLost once the store stayed away `store_timeout` seconds. Each job keeps the store's `instance` ("epoch:nonce")
in it: a restarted, empty server gets the next epoch, and a process that moves to it rebuilds what it held.
"""

from __future__ import annotations

import os
import secrets
import socket
import threading
import time
import weakref
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import tenacity
import torch.distributed as dist

from ftcoord.env import STORE_INSTANCE_ENV, STORE_TIMEOUT_ENV
from ftcoord.errors import FtcoordError, StoreLost, StoreUnavailable, Superseded
from ftcoord.host import group_sockets
from ftcoord.log import get_logger
from ftcoord.store.address import StoreAddress, check_job_id
from ftcoord.store.boot import BOOT_KEY, Boot
from ftcoord.store.call_watch import UNANSWERED_OPS, CallWatch
from ftcoord.store.client import KEY_PREFIX, get_or_none, timed_get

INSTANCE_KEY = "instance"
"""The job's key that holds "epoch:nonce": which life of the store server this is."""

T = TypeVar("T")


_RETRY_MAX_S = 0.25  # the longest pause between two reconnection attempts: a returned store is seen within it
_REQUESTS = {"get": 2, "multi_get": 2}
"""Requests the server handles per call, where more than one: TCPStore's get and multi_get wait for their keys
first (2 round trips; add, check and compare_set 1; set and append 1 but no reply waited for)."""
_OPENING = threading.Lock()
"""Held while a client is made (StoreLink._open): what sockets it opened is told apart by when they appeared."""


class StoreRestarted(FtcoordError):
    """A pinned operation found a new instance of the store: what it was decided on is gone."""


class ClientClosed(FtcoordError):
    """An operation on a LinkedStore that was closed (a wait it sat in is cut: LinkedStore.close)."""


@dataclass(frozen=True)
class Instance:
    """One life of the store server, as the job sees it: its epoch and a nonce nobody else drew."""

    epoch: int
    nonce: str

    @classmethod
    def parse(cls, raw: bytes | str) -> Instance:
        text = raw.decode() if isinstance(raw, bytes) else raw
        epoch, _, nonce = text.partition(":")
        if not epoch.isdigit() or not nonce:
            raise FtcoordError(f"the store instance {text!r} is not 'epoch:nonce'")
        return cls(int(epoch), nonce)

    @classmethod
    def drawn(cls, epoch: int) -> Instance:
        return cls(epoch, secrets.token_hex(6))

    def __str__(self) -> str:
        return f"{self.epoch}:{self.nonce}"


def instance_from_env() -> Instance | None:
    raw = os.environ.get(STORE_INSTANCE_ENV)
    return Instance.parse(raw) if raw else None


def is_connection_failure(exc: BaseException) -> bool:
    """An error of the connection (the server went away, or we cut a hung call), not of the operation."""
    if isinstance(exc, (dist.DistNetworkError, ConnectionError, BrokenPipeError)):
        return True
    text = str(exc)
    return isinstance(exc, (RuntimeError, OSError)) and any(marker in text for marker in (
        "Connection reset", "Broken pipe", "Connection closed", "Failed to recv", "Failed to send", "got 0 bytes"))


@dataclass
class _Connection:
    raw: dist.TCPStore
    view: dist.Store
    sockets: dict[int, str]
    session: int


def tcpstore_client(address: StoreAddress, timeout: float) -> dist.TCPStore:
    """torch's TCPStore client, connected within `timeout` seconds: what every link opens, unless told otherwise."""
    return dist.TCPStore(address.host, address.port, is_master=False, timeout=timedelta(seconds=timeout),
                         wait_for_workers=False)


def _prefixed(raw: Any, prefix: str) -> dist.Store:
    """The job's view of a client: torch's PrefixStore, or a client's own (chaos.scale.wire_store)."""
    own = getattr(raw, "prefixed", None)
    return own(prefix) if own is not None else dist.PrefixStore(prefix, raw)


class StoreLink:
    """One process's access to one job's store: makes the clients, reconnects them, watches them.

    Bounds: a call unanswered for `op_timeout` beyond its own wait, while the store has answered nothing of this
    process for op_timeout, has its socket shut down (as ftcoord.host.group_sockets releases a hung collective) and
    counts as a server gone away; a store that is slow but answers is waited for (up to SLOW_LIMIT op_timeouts), not
    cut and reconnected to by every process at once. Reconnection: to the same address, with backoff; when the store
    stays away `store_timeout` seconds from the moment this process first noticed, every operation raises StoreLost,
    one line that names the address, how long it waited and what to do.

    The instance. A restarted server is empty. The first process to reconnect to an empty store writes the job's
    next instance (compare_set from absent): its epoch is the server's boot (ftcoord.store.boot), or one more than
    the epoch this process knew when that is higher (a server that keeps no count). With a counted boot every
    process proposes the same epoch, so the order they come back in does not matter; a launcher writes it too. Without
    one, only a job's participants write epoch 0, and a process that knows no instance (a launcher, an observer)
    writes nothing: it cannot tell a new job's store from a restarted one. Generation numbers of epoch e start above
    e * EPOCH_SPAN, so no number a lost instance may have decided is ever decided again
    (ftcoord.protocol.generations.next_generation). A process that finds a later epoch rebuilds the store from what
    it holds (`on_new_instance` callbacks: its registration, its generation's record, the leader's term;
    ftcoord.protocol.restore), under the link's lock, before any of its other operations runs, also when it slept
    through lives of the store in between: what it holds is older than what others hold, as a paused process's is,
    and every write back only moves forward (records from absent, `gen/current` and terms up, incarnations raised).
    One that finds its own epoch under another nonce, or an older one, reached a store whose first returning process
    proposed an epoch already used (a server without a count): it is superseded and exits (its launcher replaces
    it), since a number it decides may have been decided before. An operation retried in a new instance is the
    same operation; a write that must not cross instances (a leader's record: its judgement was made on the old one)
    pins the instance it was decided on, and raises StoreRestarted instead of being retried there. `add` is at least
    once: a call cut while the server hung may still run when it resumes, beside its retry; count with
    ftcoord.protocol.tally, or with compare_set, wherever counting twice matters.
    """

    open_client: Callable[[StoreAddress, float], Any] = staticmethod(tcpstore_client)
    """How a link opens a client: (address, timeout) -> a connected client with the dist.Store operations. A
    process of `chaos bench --scale`'s event-loop participants opens chaos.scale.wire_store's instead (torch's blocks in
    C++, where no event loop switches away); the same requests either way."""

    def __init__(self, address: StoreAddress | str, job_id: str, *, connect_timeout: float = 30.0,
                 store_timeout: float = 300.0, op_timeout: float = 10.0, known: Instance | None = None,
                 may_start_job: bool = False, settles_counted: bool = False,
                 on_wait: Callable[[BaseException], None] | None = None) -> None:
        """A link to the store at `address` for one job; the first client comes from `connect()`.

        Args:
            address: the store server, as a StoreAddress or "host:port".
            job_id: the job whose keys the prefixed clients see (ftcoord.store.address.check_job_id).
            connect_timeout: the deadline of the first connection, in seconds (default 30).
            store_timeout: how long the store may stay away before every operation raises StoreLost, in seconds
                (default 300).
            op_timeout: how long a call may go unanswered beyond its own wait, in seconds (default 10;
                Timing.store_op_timeout).
            known: the instance this process knows already (its launcher's); None: none.
            may_start_job: whether a process that knows no instance may write the first instance into a store
                without one (a job's participants; not a launcher or an observer).
            settles_counted: whether a process that knows no instance writes it into a store whose server counts
                its lives (a launcher: it then knows the instance from its start, and rebuilds after a restart).
            on_wait: `on_wait(error)`, called once when the first connection attempt fails (see
                ftcoord.store.client.connect); None: nothing is called.
        """
        self.address = StoreAddress.parse(address) if isinstance(address, str) else address
        self.job_id = check_job_id(job_id)
        self.connect_timeout = connect_timeout
        self.store_timeout = store_timeout
        self.op_timeout = op_timeout
        self.instance: Instance | None = known
        self.may_start_job = may_start_job
        self.settles_counted = settles_counted
        self.boot: Boot | None = None
        """The server's boot, as last read (None: not read yet, or a server that publishes none)."""
        self.instance_number = 0
        """Bumped each time this process moves to a new instance of the store."""
        self.lost: StoreLost | None = None
        self.stale: str | None = None
        self._on_wait = on_wait
        self._callbacks: list[Callable[[dist.Store, dist.Store], None]] = []
        self._lock = threading.RLock()
        self._session = 0  # bumped by every reconnection (new instance or not)
        self._down_since: float | None = None
        self._closed = threading.Event()
        self._clients: weakref.WeakSet[LinkedStore] = weakref.WeakSet()
        self._log = get_logger(component="store_link", store=str(self.address))
        self.calls = CallWatch(op_timeout, self._closed, self._store_sockets, self._log)
        self.calls.start()

    @property
    def epoch(self) -> int:
        """The epoch of the store instance this process is in (0 while it knows none)."""
        return self.instance.epoch if self.instance is not None else 0

    @property
    def down(self) -> bool:
        """The store is away right now (this process is reconnecting)."""
        return self._down_since is not None

    def on_new_instance(self, callback: Callable[[dist.Store, dist.Store], None]) -> None:
        """Call `callback(job_view, base_view)` on a fresh client whenever this process moves to the next
        instance (the store restarted): rebuild what the store lost. It runs under the link's lock, before
        any other operation of this process; a connection error in it starts the reconnection again."""
        self._callbacks.append(callback)

    def client(self, *, prefixed: bool = True) -> LinkedStore:
        """A new client for one thread (`prefixed`: the job's keys; else the whole store)."""
        return LinkedStore(self, prefixed)

    def requests(self) -> Counter[tuple[str, str]]:
        """Requests this process sent to the store, by (thread role, operation): what `chaos bench --scale`
        counts. A wait that timed out is two (the wait and its cancellation)."""
        total: Counter[tuple[str, str]] = Counter()
        for client in list(self._clients):
            total.update(client.requests)
        return total

    def connect(self) -> LinkedStore:
        """The first client: connects within connect_timeout (StoreUnavailable otherwise) and settles the
        instance (writes it when this is the first process of the job on this store)."""
        started = time.monotonic()

        def first_failure(state: tenacity.RetryCallState) -> None:
            if self._on_wait is not None and state.attempt_number == 1 and state.outcome is not None:
                self._on_wait(state.outcome.exception())

        try:
            connection = tenacity.Retrying(
                before_sleep=first_failure, stop=tenacity.stop_after_delay(self.connect_timeout),
                wait=tenacity.wait_exponential(multiplier=0.05, max=1.0),
                retry=tenacity.retry_if_exception_type((RuntimeError, OSError)), reraise=False,
            )(lambda: self._open(max(0.2, self.connect_timeout - (time.monotonic() - started)), prefixed=True))
        except tenacity.RetryError as exc:
            cause = exc.last_attempt.exception()
            raise StoreUnavailable(
                f"no ftcoord store answered at {self.address} within {self.connect_timeout:.1f}s ({cause}); "
                f"start one with `ftcoord-store --host {self.address.host} --port {self.address.port}` or check "
                f"the address, the port and any firewall between here and there") from cause
        with self._lock:
            self._settle_first(connection.view, connection.raw)
        first = LinkedStore(self, True)
        first._connection = connection
        return first

    def close(self) -> None:
        """Stop watching calls and reconnecting (its clients' in-flight calls are not cut: LinkedStore.close)."""
        self._closed.set()

    # -- connections ----------------------------------------------------------------------

    def _open(self, timeout: float, prefixed: bool) -> _Connection:
        """One attempt at a new client, bounded by `timeout` even against a server that does not answer.

        A client's sockets are the ones that appeared while its TCPStore was made, so clients are made one at a
        time in a process (_OPENING): made side by side (a participant's threads start together; `chaos bench
        --scale` runs hundreds of links in a process), one client's sockets would include another's, and
        closing it, or cutting its unanswered call, would cut the other's connection too."""
        with _OPENING:  # the knock too: its socket, open for a moment, would be counted as another client's
            # Knock first: TCPStore's constructor retries a refused connection inside, and can take twice its
            # timeout before it gives up, so it is only asked once something listens.
            with socket.create_connection((self.address.host, self.address.port), timeout=min(timeout, 2.0)):
                pass
            before = group_sockets.open_sockets()
            token = self.calls.watch(timeout + self.op_timeout, None, before)
            try:
                raw = StoreLink.open_client(self.address, timeout)
            finally:
                self.calls.unwatch(token)
            sockets = self._store_sockets(before)
        raw.set_timeout(timedelta(seconds=300))
        view: dist.Store = _prefixed(raw, f"{KEY_PREFIX}/{self.job_id}") if prefixed else raw
        return _Connection(raw, view, sockets, self._session)

    def _store_sockets(self, before: dict[int, str]) -> dict[int, str]:
        """The sockets to the store opened since `before` (another thread may open others meanwhile)."""
        found = {}
        for fd, inode in group_sockets.opened_since(before).items():
            try:
                sock = socket.socket(fileno=os.dup(fd))
            except OSError:
                continue
            try:
                if sock.getpeername()[1] == self.address.port:
                    found[fd] = inode
            except OSError:
                pass
            finally:
                sock.close()
        return found

    def _reopen(self, connection: _Connection | None, prefixed: bool, error: BaseException | None) -> _Connection:
        """A working connection for a client whose connection failed (or that has none yet)."""
        with self._lock:
            self._raise_if_unusable()
            if connection is None or connection.session != self._session:
                # A new client, or reconnected meanwhile by another thread: one attempt, which settles the
                # instance too (the store may have restarted since anyone looked), then the usual path.
                try:
                    return self._settled(self._open(self.op_timeout, prefixed=True), prefixed)
                except (RuntimeError, OSError) as exc:
                    if not is_connection_failure(exc) and not isinstance(exc, (dist.DistStoreError, OSError)):
                        raise
                    error = exc
            if self._down_since is None:
                self._down_since = time.monotonic()
                self._log.warning("store_away", error=str(error)[:200], store_timeout_s=self.store_timeout)
            return self._reconnect(prefixed)

    def _reconnect(self, prefixed: bool) -> _Connection:
        """Reconnect until the store answers (then settle the instance) or store_timeout passed."""
        assert self._down_since is not None
        attempt = 0
        while True:
            waited = time.monotonic() - self._down_since
            if waited >= self.store_timeout:
                self.lost = StoreLost(
                    f"the ftcoord store at {self.address} has been unreachable for {waited:.0f}s "
                    f"(store_timeout={self.store_timeout:.0f}s); restart it with `ftcoord-store --host "
                    f"{self.address.host} --port {self.address.port}` and relaunch the job (it resumes from its "
                    f"last checkpoint), or raise --store-timeout / {STORE_TIMEOUT_ENV} to ride out longer outages")
                self._log.error("store_lost", waited_s=round(waited, 3), store_timeout_s=self.store_timeout)
                raise self.lost
            try:
                left = self.store_timeout - waited
                connection = self._open(min(left, self.op_timeout), prefixed=True)
                self._session += 1
                connection = self._settled(connection, prefixed)
            except (RuntimeError, OSError) as exc:
                if not is_connection_failure(exc) and not isinstance(exc, (dist.DistStoreError, OSError)):
                    raise
                attempt += 1
                self._closed.wait(min(_RETRY_MAX_S, 0.02 * 2 ** min(attempt, 8)))
                continue
            self._log.info("store_back", away_s=round(time.monotonic() - self._down_since, 3),
                           instance=str(self.instance), instance_number=self.instance_number)
            self._down_since = None
            return connection

    def _settled(self, connection: _Connection, prefixed: bool) -> _Connection:
        """A new connection, once its instance is settled (the same, or a later one rebuilt), as a client of
        this session. Settling is bounded like any call; a rebuild, as long as it takes, request by request
        (_Bounded: thousands of members' registrations take longer than one call may)."""
        token = self.calls.watch(self.op_timeout, connection.sockets, {})
        try:
            later = self._settle_again(connection.view, connection.raw)
            self.calls.answered()
        finally:
            self.calls.unwatch(token)
        if later is not None:
            self._rebuild(later, _Bounded(connection.view, self, connection.sockets),
                          _Bounded(connection.raw, self, connection.sockets))
        connection.session = self._session
        if not prefixed:
            connection.view = connection.raw
        return connection

    def _raise_if_unusable(self) -> None:
        if self.lost is not None:
            raise self.lost
        if self.stale is not None:
            raise Superseded(self.stale)

    # -- the instance -----------------------------------------------------------------------

    def _read_boot(self, base: Any) -> Boot | None:
        """The server's boot. One that has just started publishes it within milliseconds of serving, so a missing one
        is waited for a moment (a wait woken before the key exists reads b"" and waits on); None when it stays
        missing: a TCPStore that is not an ftcoord-store. A server that is only slow answers the look first, and is
        waited for as long as any call."""
        if base.check([BOOT_KEY]):
            raw = base.get(BOOT_KEY)
        else:
            deadline = time.monotonic() + 2.0
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                try:
                    raw = timed_get(base, BOOT_KEY, left)
                except dist.DistStoreError:
                    return None
                if raw:
                    break
        self.boot = Boot.parse(raw)
        return self.boot

    def _read_or_write_instance(self, view: dist.Store, base: Any, write: bool) -> Instance | None:
        """The store's instance; when it has none and `write`, this process's proposal is written first (none:
        nothing is written)."""
        raw = get_or_none(view, INSTANCE_KEY)
        if raw is None and write:
            proposal = self._proposal(self._read_boot(base))
            if proposal is not None:
                raw = view.compare_set(INSTANCE_KEY, "", str(proposal))
        return Instance.parse(raw) if raw is not None else None

    def _proposal(self, boot: Boot | None) -> Instance | None:
        """What this process would write into a store without an instance: the server's boot, or the epoch after the
        one it knows when that is higher (a server without a count). A process that knows none writes only what it
        can vouch for: a counted boot (a participant or a launcher), or epoch 0 (a participant: it starts the job)."""
        floor = boot.number if boot is not None else 0
        if self.instance is not None:
            return Instance.drawn(max(floor, self.instance.epoch + 1))
        if self.may_start_job or (self.settles_counted and boot is not None and boot.counted):
            return Instance.drawn(floor)
        return None

    def _settle_first(self, view: dist.Store, base: Any) -> None:
        """A process's first connection: adopt the store's instance, or write the next one after what
        this process knows (its launcher's), or the first one of a job new to this store."""
        known = self.instance
        self.instance = self._read_or_write_instance(view, base, True) or known
        if known is not None and self.instance != known:
            self._log.info("store_instance_newer_than_launcher", known=str(known), found=str(self.instance))

    def learn_instance(self, client: LinkedStore) -> Instance | None:
        """The instance, read from the store if this process did not know it yet (a launcher learns it from its
        first processes, and hands it to the processes it starts later)."""
        if self.instance is None:
            with self._lock:
                if self.instance is None:
                    self.instance = self._read_or_write_instance(client.view(), None, False)
        return self.instance

    def _settle_again(self, view: dist.Store, base: dist.TCPStore) -> Instance | None:
        """After a reconnection: the same instance (a pause, a network cut: nothing was lost), a later epoch
        (restarted, once or more: returned, to rebuild), or one this process cannot vouch for (superseded)."""
        found = self._read_or_write_instance(view, base, True)
        if self.instance is None or found is None:  # knew none (nothing to rebuild), or the store has none yet
            self.instance = self.instance or found
            return None
        if found == self.instance:
            return None
        if found.epoch <= self.instance.epoch:
            self.stale = (f"the store at {self.address} holds instance {found} of this job, which does not follow "
                          f"the one this process knew ({self.instance}): the store came back without its count of "
                          f"its lives (ftcoord-store --state-file), and a process that knew an older epoch, or none, "
                          f"reached it first; numbers this process decides may have been decided before, so it exits "
                          f"without taking part")
            self._log.error("store_instance_stale", known=str(self.instance), found=str(found))
            raise Superseded(self.stale)
        return found

    def _rebuild(self, found: Instance, view: Any, base: Any) -> None:
        """Move to the later instance `found` and run the rebuild callbacks on it (under the link's lock)."""
        self._log.warning("store_restarted", previous=str(self.instance), instance=str(found),
                          boot=self.boot.number if self.boot is not None else None)
        previous, self.instance = self.instance, found
        try:
            for callback in self._callbacks:
                callback(view, base)
        except Superseded as exc:
            self.stale = str(exc)
            raise
        except BaseException:
            self.instance = previous  # the next connection finds the new instance again, and rebuilds it whole
            raise
        # Only now: a thread that reads the new number (to pin its reads to it) finds what the callbacks reset.
        self.instance_number += 1


class _Bounded:
    """A rebuild's view of a new connection: each request bounded by the link's watchdog and counted as the store's
    answer, as a LinkedStore call is (a rebuild is many requests; one watch over all of them would cut it)."""

    def __init__(self, store: Any, link: StoreLink, sockets: dict[int, str]) -> None:
        self._store, self._link, self._sockets = store, link, sockets

    def __getattr__(self, name: str) -> Any:
        op = getattr(self._store, name)
        if not callable(op):
            return op
        calls = self._link.calls

        def bounded(*args: Any, **kwargs: Any) -> Any:
            token = calls.watch(self._link.op_timeout, self._sockets, {})
            try:
                result = op(*args, **kwargs)
            finally:
                calls.unwatch(token)
            calls.answered()
            return result

        return bounded


class LinkedStore:
    """One thread's client: the `dist.Store` operations ftcoord uses, through reconnections.

    Not a `dist.Store` itself (torch's PrefixStore cannot wrap it); `view()` gives the current real
    client for what needs one (a process group's rendezvous)."""

    def __init__(self, link: StoreLink, prefixed: bool) -> None:
        self.link = link
        self._prefixed = prefixed
        self._connection: _Connection | None = None
        self.requests: Counter[tuple[str, str]] = Counter()
        """Requests sent, by (role of the thread that sent it, operation); one thread per client, so exact."""
        self._closed = False
        self._roles: dict[int, str] = {}  # thread id -> role, for the counts
        link._clients.add(self)

    def close(self) -> None:
        """No more operations on this client; one in flight (a long wait) is cut now, from any thread, by shutting
        its connection's sockets down, and raises ClientClosed instead of reconnecting."""
        self._closed = True
        connection = self._connection
        if connection is not None:
            group_sockets.shut_down(dict(connection.sockets))

    def cut(self) -> int:
        """Shut this client's connection down and forget it, from any thread: a call in flight on it (one of
        `view()`'s, inside C++: a process group's rendezvous) fails at once; the next call opens a new connection
        (the store is not taken for away). How many sockets were shut down."""
        connection, self._connection = self._connection, None
        return group_sockets.shut_down(dict(connection.sockets)) if connection is not None else 0

    @property
    def epoch(self) -> int:
        return self.link.epoch

    @property
    def instance_number(self) -> int:
        return self.link.instance_number

    @property
    def key_overhead(self) -> int:
        """What each key of a request costs on the wire beyond its own length: its 64-bit length, torch's "/" and
        the job's prefix ("ftcoord/<job>/") when this client has one (bounded_multi_get)."""
        return 9 + (len(KEY_PREFIX) + len(self.link.job_id) + 2 if self._prefixed else 0)

    def clone(self) -> LinkedStore:
        return LinkedStore(self.link, self._prefixed)

    def view(self) -> dist.Store:
        """The current connection (a real dist.Store), checked alive with one round trip, connecting if needed."""

        def alive(store: dist.Store) -> dist.Store:
            store.check([INSTANCE_KEY])
            return store

        return self._call("check", alive)

    def _role(self) -> str:
        """The calling thread's role, for the counts (looked up once per thread)."""
        thread = threading.get_ident()
        role = self._roles.get(thread)
        if role is None:
            role = self._roles[thread] = thread_role()
        return role

    def _call(self, name: str, op: Callable[[dist.Store], T], wait_s: float = 0.0, pinned: int | None = None) -> T:
        link = self.link
        self.requests[(self._role(), name)] += _REQUESTS.get(name, 1)
        while True:
            if self._closed:
                raise ClientClosed(f"this client of the store at {link.address} was closed")
            if pinned is not None and link.instance_number != pinned:
                raise StoreRestarted(f"the store restarted (instance {link.instance}) since this write was decided")
            connection = self._connection
            if connection is None or link.down or link.lost is not None or link.stale is not None:
                connection = self._connection = link._reopen(connection, self._prefixed, None)
                if pinned is not None and link.instance_number != pinned:
                    raise StoreRestarted(f"the store restarted (instance {link.instance}) since this write was "
                                         f"decided")
                if self._closed:  # closed while the connection was made: close() may not have seen it
                    raise ClientClosed(f"this client of the store at {link.address} was closed")
            token = link.calls.watch(link.op_timeout + wait_s, connection.sockets, {})
            try:
                result = op(connection.view)
                if name not in UNANSWERED_OPS:
                    link.calls.answered()
                return result
            except Exception as exc:
                if not is_connection_failure(exc) or self._closed:
                    raise
                self._connection = link._reopen(connection, self._prefixed, exc)
            finally:
                link.calls.unwatch(token)

    # -- the dist.Store operations ftcoord uses ---------------------------------------------------

    def set(self, key: str, value: str | bytes) -> None:
        self._call("set", lambda s: s.set(key, value))

    def get(self, key: str) -> bytes:
        return self._call("get", lambda s: s.get(key))

    def get_within(self, key: str, timeout: float, *, pinned: int | None = None) -> bytes:
        """`get` whose wait for the key ends after `timeout` seconds (DistStoreError then;
        ftcoord.store.client.timed_get). b"" when a wake found the key absent (see ftcoord.store.client.wait_get).
        `pinned`: raise StoreRestarted, rather than wait on in a new instance, when the store restarts (a wait for
        what only the old instance would decide)."""
        try:
            return self._call("get", lambda s: timed_get(s, key, timeout), wait_s=timeout, pinned=pinned)
        except dist.DistStoreError:  # the wait timed out and was cancelled: the read was never sent
            self.requests[(self._role(), "get")] -= 1
            self.requests[(self._role(), "cancel_wait")] += 1
            raise

    def add(self, key: str, amount: int) -> int:
        return self._call("add", lambda s: s.add(key, amount))

    def compare_set(self, key: str, expected: str | bytes, desired: str | bytes, *, pinned: int | None = None) -> bytes:
        return self._call("compare_set", lambda s: s.compare_set(key, expected, desired), pinned=pinned)

    def check(self, names: Sequence[str]) -> bool:
        return self._call("check", lambda s: s.check(list(names)))

    def wait(self, names: Sequence[str], timeout: timedelta | None = None) -> None:
        seconds = timeout.total_seconds() if timeout is not None else 300.0
        try:
            if timeout is None:
                self._call("wait", lambda s: s.wait(list(names)), wait_s=seconds)
            else:
                self._call("wait", lambda s: s.wait(list(names), timeout), wait_s=seconds)
        except dist.DistStoreError:
            self.requests[(self._role(), "cancel_wait")] += 1  # TCPStore cancels a timed-out wait with a request
            raise

    def multi_get(self, names: Sequence[str], *, pinned: int | None = None) -> list[bytes]:
        return self._call("multi_get", lambda s: s.multi_get(list(names)), pinned=pinned)

    def append(self, key: str, value: str | bytes) -> None:
        self._call("append", lambda s: s.append(key, value))

    def delete_key(self, key: str) -> bool:
        return self._call("delete_key", lambda s: s.delete_key(key))

    def num_keys(self) -> int:
        return self._call("num_keys", lambda s: s.num_keys())

    def set_timeout(self, timeout: timedelta) -> None:  # every operation is bounded by the link
        pass


def thread_role(name: str | None = None) -> str:
    """What a thread does, from its name: "heartbeat" for ftcoord-heartbeat-3, "trainer" for any of the user's."""
    name = threading.current_thread().name if name is None else name
    if not name.startswith("ftcoord-"):
        return "trainer"
    return name[len("ftcoord-"):].rstrip("0123456789").rstrip("-") or "ftcoord"


def pinned_compare_set(store: Any, pinned: int | None, key: str, expected: str, desired: str) -> bytes:
    """compare_set that must not cross into a new store instance (a LinkedStore), or a plain one."""
    if isinstance(store, LinkedStore):
        return store.compare_set(key, expected, desired, pinned=pinned)
    return store.compare_set(key, expected, desired)


def pinned_multi_get(store: Any, pinned: int | None, names: list[str]) -> list[bytes]:
    """multi_get of keys that exist in one store instance (a slot's, registered there): in a restarted store they
    may never come back (a dead slot), and a plain retry would wait for them forever; StoreRestarted instead."""
    if isinstance(store, LinkedStore):
        return store.multi_get(names, pinned=pinned)
    return store.multi_get(names)


MULTI_GET_BYTES = 16 * 1024
"""The most key bytes in one multi_get of bounded_multi_get. The store's CPU per request grows much faster than its
keys in large requests, and every other client waits meanwhile, so a read of many keys is cut into requests of this
size at most."""


def keys_per_request(store: Any, names: list[str], together: int = 1) -> int:
    """How many of `names` one request may name to stay within MULTI_GET_BYTES of keys: whole runs of `together`."""
    overhead = getattr(store, "key_overhead", 64)  # a plain client: an allowance for a job's prefix
    widest = max(map(len, names), default=0) + overhead
    return max(1, MULTI_GET_BYTES // (widest * together)) * together


def bounded_check(store: Any, names: list[str]) -> bool:
    """Every key of `names` exists: checks of MULTI_GET_BYTES of keys at most each (as bounded_multi_get reads),
    stopping at the first one that fails."""
    per = keys_per_request(store, names)
    return all(store.check(names[start:start + per]) for start in range(0, len(names), per))


def bounded_multi_get(store: Any, names: list[str], pinned: int | None = None, together: int = 1,
                      lead: int = 0) -> list[bytes]:
    """pinned_multi_get of `names` in requests of MULTI_GET_BYTES of keys at most, each of whole runs of `together`
    keys after the first `lead` names (which go with the first request): a slot's facts stay one snapshot. The values
    in the order of `names`; one request when they fit."""
    per = keys_per_request(store, names, together)
    if len(names) <= lead + per:
        return pinned_multi_get(store, pinned, names)
    values = pinned_multi_get(store, pinned, names[:lead + per])
    for start in range(lead + per, len(names), per):
        values += pinned_multi_get(store, pinned, names[start:start + per])
    return values


def instance_number(store: Any) -> int:
    """How many new store instances this process has moved to (0 for a plain store)."""
    return getattr(store, "instance_number", 0)
