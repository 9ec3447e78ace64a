"""A store that is slow but answers: a TCP proxy in front of a real store server that holds every answer back.

SIGSTOP makes a store silent (it answers nothing); a queue longer than op_timeout (thousands of clients at once, a
host starved of CPU) makes one slow: every answer comes, late. This proxy makes the second kind on demand: every
byte the server sends reaches its client `delay()` seconds later, in order; requests pass at once. It also keeps
every byte each connection's client sent (`sent`): what a client puts on the wire (tests/unit/test_wire_store.py).
"""

from __future__ import annotations

import queue
import socket
import threading
import time


class SlowProxy:
    """Listens on 127.0.0.1 (`address`); each connection gets one of its own to the server behind."""

    def __init__(self, upstream: str) -> None:
        host, port = upstream.rsplit(":", 1)
        self._upstream = (host, int(port))
        self._delay = (0.0, 0.0, 0.0, 0.0)  # from, to, starting, over (seconds)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._closed = threading.Event()
        self._sockets: list[socket.socket] = []
        self.sent: list[bytearray] = []
        """What each connection's client sent, in the order the connections were accepted."""
        threading.Thread(target=self._accept, name="slow-proxy-accept", daemon=True).start()

    def slow_down(self, to: float, over: float) -> None:
        """Answers late by `to` seconds, the delay growing evenly from what it is now over `over` seconds (a store
        that falls behind: its answers keep coming, in order, with gaps no longer than the clients' own)."""
        self._delay = (self.delay(), to, time.monotonic(), over)

    def delay(self) -> float:
        start, to, starting, over = self._delay
        if over <= 0:
            return to
        return start + (to - start) * min(1.0, (time.monotonic() - starting) / over)

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
        for sock in self._sockets:
            _shut(sock)

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self._upstream)
            for sock in (client, server):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._sockets += [client, server]
            held: queue.SimpleQueue[tuple[float, bytes]] = queue.SimpleQueue()
            sent = bytearray()
            self.sent.append(sent)
            threading.Thread(target=self._pass, args=(client, server, sent), daemon=True).start()
            threading.Thread(target=self._hold, args=(server, held), daemon=True).start()
            threading.Thread(target=self._release, args=(held, client, server), daemon=True).start()

    @staticmethod
    def _pass(source: socket.socket, sink: socket.socket, sent: bytearray) -> None:
        """Requests: at once (and kept)."""
        try:
            while data := source.recv(65536):
                sent += data
                sink.sendall(data)
        except OSError:
            pass
        _shut(sink)
        _shut(source)

    def _hold(self, source: socket.socket, held: queue.SimpleQueue[tuple[float, bytes]]) -> None:
        """Answers: stamped with when they may go on."""
        try:
            while data := source.recv(65536):
                held.put((time.monotonic() + self.delay(), data))
        except OSError:
            pass
        held.put((0.0, b""))

    @staticmethod
    def _release(held: queue.SimpleQueue[tuple[float, bytes]], sink: socket.socket, source: socket.socket) -> None:
        while True:
            due, data = held.get()
            if not data:
                break
            pause = due - time.monotonic()
            if pause > 0:
                time.sleep(pause)  # the delay line itself, not a wait for a condition
            try:
                sink.sendall(data)
            except OSError:
                break
        _shut(sink)
        _shut(source)


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
