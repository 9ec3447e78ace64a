"""A TCPStore client in pure Python: torch's own wire protocol, so an event loop can run thousands of them.

torch's client blocks in C++, where no event loop can switch away; this one blocks in Python's socket module, which
gevent makes cooperative, and sends the same requests in the same order (chaos.scale.worker_events). The protocol
(torch 2.14.1, c10d/store/TCPStoreBackend.hpp; tests/unit/test_wire_store.py checks it against torch's client): a
connection opens with VALIDATE and MAGIC, then a PING with the pid, which the server echoes; a request is one byte
of query type, then its arguments (integers little-endian 64-bit, strings prefixed with their 64-bit length). Keys
get torch's client prefix "/". `get` and `multi_get` are a WAIT, then the read; a wait that times out is cancelled
with CANCEL_WAIT, answered after the wait's own answer if it ended meanwhile. SET, APPEND and MULTI_SET get no answer.
On an event loop (`loop`: chaos.scale.worker_events.LoopWaits) a connection waits for an answer, then reads it once.
"""

from __future__ import annotations

import os
import socket
import struct
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Protocol

import torch.distributed as dist

from ftcoord.store.address import StoreAddress

(VALIDATE, SET, COMPARE_SET, GET, ADD, CHECK, WAIT, GETNUMKEYS, DELETE_KEY, APPEND, MULTI_GET, MULTI_SET,
 CANCEL_WAIT, PING) = range(14)
"""TCPStoreBackend.hpp's QueryType, in its order."""
MAGIC = 0x3C85F7CE
"""validationMagicNumber: the first request of a connection."""
_READY, _STOP_WAITING, _WAIT_CANCELED = 0, 0, 1
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")
_DEFAULT_TIMEOUT = timedelta(seconds=300)


def _bytes(value: str | bytes) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


def _field(value: str | bytes) -> bytes:
    data = _bytes(value)
    return _U64.pack(len(data)) + data


class Waits(Protocol):
    """An event loop's waits for one connection (chaos.scale.worker_events.LoopWaits)."""

    sock: socket.socket
    """The connection: the operating system's socket, non-blocking."""

    def readable(self, timeout: float | None) -> bool:
        """Until the socket can be read (True), or `timeout` seconds passed (False; None: no limit)."""

    def writable(self) -> None:
        """Until the socket can be written."""


class WireStore:
    """One connection to a TCPStore server, with the operations of `dist.Store` that ftcoord uses."""

    def __init__(self, sock: socket.socket, prefix: str = "/", owner: WireStore | None = None) -> None:
        self._sock = sock
        self._prefix = prefix
        self._owner = owner or self  # a prefixed view shares its owner's connection, buffer and timeout
        self._buffer = bytearray()
        self._timeout = _DEFAULT_TIMEOUT
        self._waits: Waits | None = None  # an event loop's (module docstring); None: a blocking socket

    @classmethod
    def connect(cls, address: StoreAddress, timeout: float,
                loop: Callable[[socket.socket], Waits] | None = None) -> WireStore:
        """A validated connection to the server at `address` (OSError when nothing answers within `timeout`).
        `loop(sock)`: the event loop's waits for the connection once validated, on a socket they make of `sock`
        (module docstring)."""
        sock = socket.create_connection((address.host, address.port), timeout=timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            store = cls(sock)
            store._send(VALIDATE, _U32.pack(MAGIC))
            nonce = os.getpid() & 0xFFFFFFFF  # torch's client pings with its pid once connected, and checks the echo
            store._send(PING, _U32.pack(nonce))
            echo = _U32.unpack(store._take(4))[0]  # within `timeout` (the socket's): a hung server is not waited for
            if echo != nonce:
                raise dist.DistNetworkError(f"the store at {address} answered a ping with {echo}, not {nonce}")
            sock.settimeout(None)
            if loop is not None:
                store._waits = loop(sock)
                store._sock = store._waits.sock
            return store
        except BaseException:
            sock.close()
            raise

    def prefixed(self, prefix: str) -> WireStore:
        """A view whose keys are `prefix`/key (torch's PrefixStore), on this connection."""
        return WireStore(self._sock, f"{self._prefix}{prefix}/", self._owner)  # connected: its waits are the owner's

    def fileno(self) -> int:
        return self._sock.fileno()

    def close(self) -> None:
        self._sock.close()

    # -- the connection ---------------------------------------------------------------------

    def _key(self, key: str) -> bytes:
        return _field(self._prefix + key)

    def _keys(self, names: Sequence[str]) -> bytes:
        return _U64.pack(len(names)) + b"".join(self._key(k) for k in names)

    def _send(self, query: int, *parts: bytes) -> None:
        """One request, in as few sends as the socket takes (not sendall: gevent's asks the kernel for the socket's
        buffer size on every call, a system call per request)."""
        data = memoryview(bytes([query]) + b"".join(parts))
        try:
            while data:
                try:
                    data = data[self._sock.send(data):]
                except BlockingIOError:  # only an event loop's socket: its buffer is full
                    waits = self._owner._waits
                    assert waits is not None
                    waits.writable()
        except OSError as exc:
            raise dist.DistNetworkError(f"Failed to send to the store: {exc}") from exc

    def _fill(self, timeout: float | None) -> bool:
        """Read what the server sent; False when nothing came within `timeout` seconds (None: no limit)."""
        waits = self._owner._waits
        if waits is not None:
            return self._fill_on_loop(waits, timeout)
        buffer = self._owner._buffer
        sock = self._sock
        if timeout is not None:
            sock.settimeout(max(timeout, 0.001))  # 0 would make the socket non-blocking, not a timed wait
        try:
            chunk = sock.recv(1 << 16)
        except TimeoutError:
            return False
        except OSError as exc:
            raise dist.DistNetworkError(f"Failed to recv from the store: {exc}") from exc
        finally:
            if timeout is not None:
                sock.settimeout(None)
        if not chunk:
            raise dist.DistNetworkError("Connection closed by peer (the store)")
        buffer += chunk
        return True

    def _fill_on_loop(self, waits: Waits, timeout: float | None) -> bool:
        """_fill on an event loop's socket: the wait first, then one read."""
        deadline = None
        while True:
            try:
                if not waits.readable(timeout):
                    return False
                chunk = self._sock.recv(1 << 16)
            except BlockingIOError:  # woken with nothing to read after all: wait again, for what is left
                if timeout is not None:
                    deadline = deadline or time.monotonic() + timeout
                    timeout = max(deadline - time.monotonic(), 0.001)
                continue
            except OSError as exc:
                raise dist.DistNetworkError(f"Failed to recv from the store: {exc}") from exc
            if not chunk:
                raise dist.DistNetworkError("Connection closed by peer (the store)")
            self._owner._buffer += chunk
            return True

    def _take(self, n: int) -> bytes:
        buffer = self._owner._buffer
        while len(buffer) < n:
            if not self._fill(None):  # only while connecting, with the socket's timeout set
                raise dist.DistNetworkError("the store did not answer in time")
        data = bytes(buffer[:n])
        del buffer[:n]
        return data

    def _bits(self) -> bytes:
        return self._take(_U64.unpack(self._take(8))[0])

    def _int(self) -> int:
        return int(_I64.unpack(self._take(8))[0])

    # -- dist.Store -------------------------------------------------------------------------

    @property
    def timeout(self) -> timedelta:
        return self._owner._timeout

    def set_timeout(self, timeout: timedelta) -> None:
        self._owner._timeout = timeout

    def set(self, key: str, value: str | bytes) -> None:
        self._send(SET, self._key(key), _field(value))

    def append(self, key: str, value: str | bytes) -> None:
        self._send(APPEND, self._key(key), _field(value))

    def add(self, key: str, amount: int) -> int:
        self._send(ADD, self._key(key), _I64.pack(amount))
        return self._int()

    def compare_set(self, key: str, expected: str | bytes, desired: str | bytes) -> bytes:
        self._send(COMPARE_SET, self._key(key), _field(expected), _field(desired))
        return self._bits()

    def check(self, names: Sequence[str]) -> bool:
        self._send(CHECK, self._keys(names))
        return self._take(1)[0] == _READY

    def wait(self, names: Sequence[str], timeout: timedelta | None = None) -> None:
        """Until every key exists; DistStoreError after `timeout` (the client's own when None), as torch's."""
        self._send(WAIT, self._keys(names))
        limit = (timeout if timeout is not None else self.timeout).total_seconds()
        if not self._owner._buffer and not self._fill(limit):
            self._send(CANCEL_WAIT)
            if self._take(1)[0] != _WAIT_CANCELED:  # the wait ended as it was cancelled: its answer comes first
                self._take(1)
            raise dist.DistStoreError(f"wait timeout after {round(limit * 1000)}ms, keys: {list(names)}")
        if self._take(1)[0] != _STOP_WAITING:
            raise dist.DistStoreError("the store answered a wait with something other than stop_waiting")

    def get(self, key: str) -> bytes:
        self.wait([key])
        self._send(GET, self._key(key))
        return self._bits()

    def multi_get(self, names: Sequence[str]) -> list[bytes]:
        self.wait(names)
        self._send(MULTI_GET, self._keys(names))
        return [self._bits() for _ in names]

    def delete_key(self, key: str) -> bool:
        self._send(DELETE_KEY, self._key(key))
        return self._int() == 1

    def num_keys(self) -> int:
        self._send(GETNUMKEYS)
        return self._int()
