"""Store client: connect with backoff and a deadline, scope keys per job, small helpers.

One client per thread: a thread blocked in `wait` holds its client's lock, so every
background thread of ftcoord works on its own `clone()`.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from datetime import timedelta

import tenacity
import torch.distributed as dist

from ftcoord.errors import ConfigError, StoreUnavailable

JOB_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
KEY_PREFIX = "ftcoord"
DEFAULT_OP_TIMEOUT = timedelta(seconds=300)

Store = dist.Store


@dataclass(frozen=True)
class StoreAddress:
    """Where the external TCPStore server listens."""

    host: str
    port: int

    @classmethod
    def parse(cls, text: str) -> StoreAddress:
        """Parse "host:port" (IPv6 as "[::1]:port")."""
        match = re.fullmatch(r"\[?([^\[\]]+?)\]?:(\d+)", text.strip())
        if not match:
            raise ConfigError(f"store address {text!r} is not HOST:PORT (e.g. 127.0.0.1:29600)")
        port = int(match.group(2))
        if not 0 < port < 65536:
            raise ConfigError(f"store port {port} in {text!r} is outside 1..65535")
        return cls(match.group(1), port)

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def check_job_id(job_id: str) -> str:
    """Job ids become key prefixes: keep them to a safe alphabet."""
    if not JOB_ID_PATTERN.match(job_id):
        raise ConfigError(
            f"job id {job_id!r} must be 1-128 characters of letters, digits, '.', '_' "
            f"or '-', starting with a letter or digit"
        )
    return job_id


def connect(
    address: StoreAddress | str,
    *,
    deadline: float = 30.0,
    op_timeout: timedelta = DEFAULT_OP_TIMEOUT,
) -> dist.TCPStore:
    """Connect to a running store server, retrying with exponential backoff.

    Raises:
        StoreUnavailable: nothing answered at host:port before `deadline` seconds.
    """
    addr = StoreAddress.parse(address) if isinstance(address, str) else address
    started = time.monotonic()

    def attempt() -> dist.TCPStore:
        # One attempt may use all the time left: TCPStore itself retries a refused
        # connection, and a slow reverse-DNS lookup can take seconds on its own.
        left = max(0.2, deadline - (time.monotonic() - started))
        store = dist.TCPStore(
            addr.host,
            addr.port,
            is_master=False,
            timeout=timedelta(seconds=left),
            wait_for_workers=False,
        )
        store.set_timeout(op_timeout)
        return store

    retrying = tenacity.Retrying(
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
    """The view of the store that holds one job's keys (`ftcoord/<job_id>/...`)."""
    return dist.PrefixStore(f"{KEY_PREFIX}/{check_job_id(job_id)}", store)


def get_or_none(store: dist.Store, key: str) -> bytes | None:
    """Read a key without blocking: `get` on a missing key waits for it to appear."""
    return store.get(key) if store.check([key]) else None


def read_int(store: dist.Store, key: str) -> int:
    """Read a counter (a missing counter reads 0 and is created)."""
    return int(store.add(key, 0))


def wait_for_key(store: dist.Store, key: str, timeout: float) -> bool:
    """Wait up to `timeout` seconds for a key to exist; True when it does."""
    if timeout <= 0:
        return bool(store.check([key]))
    try:
        store.wait([key], timedelta(seconds=timeout))
        return True
    except dist.DistStoreError:
        return store.check([key])
