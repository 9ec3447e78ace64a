"""Store client: connect with backoff and a deadline, scope keys per job, small helpers.

One client per thread: a thread blocked in `wait` holds its client's lock, so every
background thread of ftcoord works on its own `clone()`.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from datetime import timedelta

import tenacity
import torch.distributed as dist

from ftcoord.errors import StoreUnavailable
from ftcoord.store.address import StoreAddress, check_job_id

KEY_PREFIX = "ftcoord"
DEFAULT_OP_TIMEOUT = timedelta(seconds=300)

Store = dist.Store


def connect(
    address: StoreAddress | str,
    *,
    deadline: float = 30.0,
    op_timeout: timedelta = DEFAULT_OP_TIMEOUT,
    on_wait: Callable[[BaseException], None] | None = None,
) -> dist.TCPStore:
    """Connect to a running store server, retrying with exponential backoff.

    Args:
        address: the server, as a StoreAddress or "host:port" ("[::1]:port" for IPv6).
        deadline: the total time to keep trying, in seconds (default 30).
        op_timeout: the client's timeout for each later store operation (default 300 s).
        on_wait: called once, with the error, when the first attempt fails, so the caller can say what it waits
            for rather than wait `deadline` seconds in silence; None: nothing is called.

    Raises:
        StoreUnavailable: nothing answered at host:port before `deadline` seconds.
    """
    addr = StoreAddress.parse(address) if isinstance(address, str) else address
    started = time.monotonic()

    def attempt() -> dist.TCPStore:
        left = max(0.2, deadline - (time.monotonic() - started))
        # Knock first: TCPStore's constructor retries a refused connection inside, and can take twice
        # its timeout before it gives up, so it is only asked once something listens. A refused knock
        # is answered at once and retried here, with backoff.
        with socket.create_connection((addr.host, addr.port), timeout=min(left, 2.0)):
            pass
        # One attempt may use all the time left: a slow reverse-DNS lookup can take seconds on its own.
        store = dist.TCPStore(
            addr.host,
            addr.port,
            is_master=False,
            timeout=timedelta(seconds=left),
            wait_for_workers=False,
        )
        store.set_timeout(op_timeout)
        return store

    def first_failure(state: tenacity.RetryCallState) -> None:
        if on_wait is not None and state.attempt_number == 1 and state.outcome is not None:
            on_wait(state.outcome.exception())

    retrying = tenacity.Retrying(
        before_sleep=first_failure,
        stop=tenacity.stop_after_delay(deadline),
        wait=tenacity.wait_exponential(multiplier=0.05, max=1.0),
        retry=tenacity.retry_if_exception_type((RuntimeError, OSError)),
        reraise=False,
    )
    try:
        return retrying(attempt)
    except tenacity.RetryError as exc:
        cause = exc.last_attempt.exception()
        raise StoreUnavailable(
            f"no ftcoord store answered at {addr} within {deadline:.1f}s ({cause}); "
            f"start one with `ftcoord-store --host {addr.host} --port {addr.port}` or check "
            f"the address, the port and any firewall between here and there"
        ) from cause


def job_store(store: dist.Store, job_id: str) -> dist.PrefixStore:
    """The view of the store that holds one job's keys (`ftcoord/<job_id>/...`).

    Args:
        store: a client of the store server (what `connect` returns).
        job_id: the job's id: 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit.

    Raises:
        ConfigError: `job_id` has another character, or another length.
    """
    return dist.PrefixStore(f"{KEY_PREFIX}/{check_job_id(job_id)}", store)


_ABSENT = "\x00ftcoord:absent\x00"  # never a value of ours


def get_or_none(store: dist.Store, key: str) -> bytes | None:
    """Read a key without blocking, in one atomic operation.

    `get` on a missing key waits for it to appear (up to the client's timeout, 300 s), so "check, then
    get" blocks when the key is deleted in between. compare_set with an expected value no key ever
    holds changes nothing and answers the current value, or the expected value itself when the key
    does not exist (a missing key is only created when the expected value is empty).
    """
    value = store.compare_set(key, _ABSENT, _ABSENT)
    return None if value == _ABSENT.encode() else value


def read_int(store: dist.Store, key: str) -> int:
    """Read a counter (a missing counter reads 0 and is created)."""
    return int(store.add(key, 0))


def raise_to(store: dist.Store, key: str, floor: int) -> None:
    """Make the integer `key` at least `floor`, never lowering it (compare_set, so concurrent raisers agree)."""
    while True:
        current = store.compare_set(key, "", str(floor)).decode()
        if current == str(floor) or int(current or 0) >= floor:
            return
        if store.compare_set(key, current, str(floor)).decode() == str(floor):
            return


def wait_for_key(store: dist.Store, key: str, timeout: float) -> bool:
    """Wait up to `timeout` seconds for a key to exist; True when it does.

    A store wait can end before its key exists: TCPStore wakes every waiter of a key whenever anyone
    compare_sets it, even a compare that sets nothing (`get_or_none` of the absent key, as an observer reads).
    A wake taken for the key would act on a key nobody set (an interrupt nobody asked for), so the key is
    checked after every wake, and the wait goes on for the rest of the timeout.
    """
    if timeout <= 0:
        return bool(store.check([key]))
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return bool(store.check([key]))
        try:
            store.wait([key], timedelta(seconds=left))
        except dist.DistStoreError:
            return bool(store.check([key]))
        if store.check([key]):
            return True


def get_if_present(store: dist.Store, key: str) -> bytes | None:
    """get_or_none that wakes nobody: it looks (check) before it reads, since a read of an absent key (a compare_set)
    wakes every waiter of that key (see wait_for_key). For keys others may wait on; two requests when present."""
    return get_or_none(store, key) if store.check([key]) else None


def timed_get(store: dist.Store, key: str, timeout: float) -> bytes:
    """TCPStore's get (a wait for the key, then the read) with its wait ending after `timeout` seconds (DistStoreError
    then): the client's own timeout, set for this one call and put back. One thread per client, so no other call
    sees it."""
    previous = store.timeout
    store.set_timeout(timedelta(seconds=timeout))
    try:
        return store.get(key)
    finally:
        store.set_timeout(previous)


def wait_get(store: dist.Store, key: str, timeout: float, pinned: int | None = None) -> bytes | None:
    """Wait up to `timeout` seconds for a key and read it: its value; None when the wait timed out; b"" when a wake
    found the key absent (a compare_set that set nothing wakes every waiter: see wait_for_key; or the key was deleted
    at once), so only for keys whose values are never empty. Two requests, TCPStore's get (a wait, then the read),
    where a wait, a check and a read are three; and the read wakes nobody, as a compare_set of an absent key would
    (every woken waiter reading so would wake the others again). `pinned`: see LinkedStore.get_within (a plain
    client knows no instances)."""
    within = getattr(store, "get_within", None)  # a LinkedStore: through its reconnections, counted
    try:
        return within(key, timeout, pinned=pinned) if within is not None else timed_get(store, key, timeout)
    except dist.DistStoreError:
        return None


def woken(store: dist.Store, key: str, timeout: float) -> bool:
    """One store wait of up to `timeout` seconds and no request after it: True when it was woken, False when it timed
    out. A wake does not prove the key exists (a compare_set that set nothing wakes too: see wait_for_key); for a
    waiter that acts on a wake at once, and looks at the key later (two requests when it times out, one when woken)."""
    try:
        store.wait([key], timedelta(seconds=timeout))
    except dist.DistStoreError:
        return False
    return True
