"""chaos.scale.wire_store: the pure-Python TCPStore client sends what torch's client sends, and gets the same answers.

Both clients talk to a real store server through a proxy that records every byte a client sends; the same
operations must produce the same bytes (the event-loop participants of `chaos bench --scale` would otherwise measure
a protocol of their own) and the same results. Then the client under a StoreLink: a call cut from another thread; and
the client as an event-loop worker runs it."""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist

from chaos.scale.wire_store import WireStore
from ftcoord.store.address import StoreAddress
from ftcoord.store.link import StoreLink, is_connection_failure, tcpstore_client
from ftcoord.store.server import StoreProcess
from tests.helpers.slow_store import SlowProxy

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def server() -> Any:
    process = StoreProcess.start("127.0.0.1", 0, own_session=True)
    yield process
    process.stop()


def _operations(raw: Any, prefixed: Any, tag: str) -> list[Any]:
    """Every operation ftcoord uses, on the client itself and on a job's prefixed view of it."""
    answers: list[Any] = []
    for store in (raw, prefixed):
        store.set(f"{tag}/a", b"one")
        store.set(f"{tag}/text", "two")
        answers.append(store.get(f"{tag}/a"))
        answers.append(store.add(f"{tag}/n", 3))
        answers.append(store.add(f"{tag}/n", -1))
        store.append(f"{tag}/lines", "x\n")
        store.append(f"{tag}/lines", b"y\n")
        answers.append(store.get(f"{tag}/lines"))
        answers.append(store.compare_set(f"{tag}/cs", "", "first"))
        answers.append(store.compare_set(f"{tag}/cs", "", "second"))
        answers.append(store.compare_set(f"{tag}/cs", "first", "third"))
        answers.append(store.compare_set(f"{tag}/absent", "\0never", "\0never"))  # ftcoord.store.client.get_or_none
        answers.append(store.check([f"{tag}/a", f"{tag}/text"]))
        answers.append(store.check([f"{tag}/a", f"{tag}/missing"]))
        answers.append(store.multi_get([f"{tag}/a", f"{tag}/text"]))
        try:
            store.wait([f"{tag}/missing"], timedelta(milliseconds=100))
            answers.append("no timeout")
        except dist.DistStoreError:
            answers.append("timed out")
        store.wait([f"{tag}/a"], timedelta(seconds=5))
        answers.append(store.delete_key(f"{tag}/a"))
        answers.append(store.delete_key(f"{tag}/a"))
    answers.append(raw.num_keys() > 0)
    return answers


def _run(proxy: SlowProxy, client: Callable[[], Any], prefix: Callable[[Any], Any]) -> tuple[list[Any], bytes]:
    before = len(proxy.sent)
    raw = client()  # answered through the proxy: its connection, and what it sent, are recorded already
    answers = _operations(raw, prefix(raw), "k")
    raw.num_keys()  # answered: every request before it has reached the server, and the proxy's record
    return answers, bytes(proxy.sent[before])


def test_the_wire_client_sends_byte_for_byte_what_torchs_client_sends() -> None:
    """Each client on a server of its own (the same answers need the same state), through a recording proxy."""
    sent = {}
    for name, client, prefix in (
            ("torch", tcpstore_client, lambda raw: dist.PrefixStore("ftcoord/job", raw)),
            ("wire", WireStore.connect, lambda raw: raw.prefixed("ftcoord/job"))):
        server = StoreProcess.start("127.0.0.1", 0, own_session=True)
        proxy = SlowProxy(server.address)  # with no delay: a proxy that keeps what each client sent
        try:
            sent[name] = _run(proxy, lambda c=client, p=proxy: c(StoreAddress.parse(p.address), 5.0), prefix)
        finally:
            proxy.close()
            server.stop()
    assert sent["wire"][0] == sent["torch"][0]  # the answers
    assert len(sent["torch"][1]) > 500
    assert sent["wire"][1] == sent["torch"][1]  # the requests, the connection's opening included


def test_a_wire_client_sees_what_torchs_client_wrote(server: Any) -> None:
    address = StoreAddress.parse(server.address)
    theirs, ours = tcpstore_client(address, 5.0), WireStore.connect(address, 5.0)
    theirs.set("shared", b"\x00\xffbinary")
    assert ours.get("shared") == b"\x00\xffbinary"
    ours.set("back", "from the wire")
    assert theirs.get("back") == b"from the wire"
    assert ours.add("count", 2) == 2 and theirs.add("count", 1) == 3
    big = b"r" * 300_000  # a record of thousands of members: more than one read
    theirs.set("big", big)
    assert ours.get("big") == big


def test_a_linked_call_on_a_wire_client_is_cut_from_another_thread(server: Any,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A LinkedStore closed while its thread waits in the store: the wait ends at once (the call watch and close()
    shut the client's socket down; the wire client must notice, as torch's does, and not reconnect)."""
    monkeypatch.setattr(StoreLink, "open_client", staticmethod(WireStore.connect))
    link = StoreLink(server.address, "wirejob", op_timeout=2.0, may_start_job=True)
    client = link.connect()
    assert isinstance(client.view(), WireStore)
    outcome: list[BaseException] = []

    def wait_long() -> None:
        try:
            client.wait(["never"], timedelta(seconds=30))
        except BaseException as exc:  # noqa: BLE001 - the test looks at it
            outcome.append(exc)

    waiter = threading.Thread(target=wait_long)
    waiter.start()
    time.sleep(0.3)  # let the wait reach the server (nothing to poll for: it is blocked in recv)
    started = time.monotonic()
    client.close()
    waiter.join(10)
    assert not waiter.is_alive()
    assert time.monotonic() - started < 2.0
    assert outcome and is_connection_failure(outcome[0]), outcome  # as with torch's client: no reconnection
    link.close()


def test_a_connection_to_a_server_that_never_answers_fails_within_its_timeout() -> None:
    """Something listens but answers nothing (a hung store): the connection's ping is not waited for past `timeout`,
    and the failure is a connection failure (a StoreLink retries it, as it retries torch's)."""
    silent = socket.create_server(("127.0.0.1", 0))
    try:
        started = time.monotonic()
        with pytest.raises(dist.DistNetworkError, match="did not answer"):
            WireStore.connect(StoreAddress("127.0.0.1", silent.getsockname()[1]), 0.5)
        assert time.monotonic() - started < 3.0
    finally:
        silent.close()


LOOP_SCRIPT = r"""
import json, os, socket, sys, time
from datetime import timedelta
import chaos.scale.worker_events as events  # monkey patches, as a worker does
import gevent
import torch.distributed as dist
from gevent.timeout import Timeout
from ftcoord.store.address import StoreAddress
from tests.unit.test_wire_store import _operations

thrown = []
expire = Timeout._on_expiration
Timeout._on_expiration = lambda self, greenlet, ex: (thrown.append(ex), expire(self, greenlet, ex))[1]
raw = events.wire_on_loop(StoreAddress.parse(sys.argv[1]), 5.0)
out = {"pid": os.getpid(), "answers": [repr(a) for a in _operations(raw, raw.prefixed("ftcoord/job"), "k")]}
raw.num_keys()  # answered: every request before it reached the server
big = os.urandom(8 << 20)  # more than the socket's buffers hold: the send waits to write, the read takes many
raw.set("big", big)
out["big"] = raw.get("big") == big
t0 = time.monotonic()
try:
    raw.wait(["never"], timedelta(milliseconds=200))
    out["timed_out"] = None
except dist.DistStoreError:
    out["timed_out"] = round(time.monotonic() - t0, 3)
out["after_timeout"] = raw.add("n", 1)  # the cancelled wait's answers were read: the connection is in step
out["thrown"] = len(thrown)
cut = {}
def wait_long():
    t = time.monotonic()
    try:
        raw.wait(["never"], timedelta(seconds=30))
    except Exception as exc:
        cut.update(error=type(exc).__name__, s=round(time.monotonic() - t, 3))
waiter = gevent.spawn(wait_long)
gevent.sleep(0.3)
socket.socket(fileno=os.dup(raw.fileno())).shutdown(socket.SHUT_RDWR)  # as ftcoord.store.link cuts a connection
waiter.join(10)
out["cut"] = cut
print(json.dumps(out))
"""


def test_a_wire_client_on_an_event_loop_sends_the_same_and_waits_without_exceptions() -> None:
    """chaos.scale.worker_events' clients (an operating system's socket, waited on by the event loop:
    chaos.scale.wire_store)
    send the same bytes and get the same answers as the blocking client; a request larger than the socket's buffers
    goes whole, and its answer comes back whole; a timed wait runs out on time with no exception thrown into its
    greenlet, and leaves the connection in step; a connection shut down under a wait (how a StoreLink cuts one) ends
    the wait at once. In a process of its own: gevent's monkey patching would change this one."""
    pytest.importorskip("gevent")
    results = {}
    for name in ("blocking", "loop"):
        server = StoreProcess.start("127.0.0.1", 0, own_session=True)
        proxy = SlowProxy(server.address)
        try:
            if name == "blocking":
                answers, sent = _run(proxy, lambda p=proxy: WireStore.connect(StoreAddress.parse(p.address), 5.0),
                                     lambda raw: raw.prefixed("ftcoord/job"))
                results[name] = ([repr(a) for a in answers], sent, os.getpid(), None)
            else:
                done = subprocess.run([sys.executable, "-c", LOOP_SCRIPT, proxy.address], capture_output=True,
                                      text=True, timeout=50, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
                assert done.returncode == 0, done.stderr[-3000:]
                out = json.loads(done.stdout.strip().splitlines()[-1])
                results[name] = (out["answers"], bytes(proxy.sent[0]), out["pid"], out)
        finally:
            proxy.close()
            server.stop()
    (blocking, sent_blocking, pid_blocking, _), (loop, sent_loop, pid_loop, out) = results["blocking"], results["loop"]
    assert loop == blocking
    opening = 1 + 4 + 1  # VALIDATE and its magic number, PING; then the pid it pings with, then the operations
    assert sent_loop[:opening] == sent_blocking[:opening]
    assert sent_loop[opening:opening + 4] == struct.pack("<I", pid_loop & 0xFFFFFFFF)
    assert sent_blocking[opening:opening + 4] == struct.pack("<I", pid_blocking & 0xFFFFFFFF)
    operations = len(sent_blocking)  # the blocking run ended with its operations; the loop's went on
    assert len(sent_blocking) > 500 and sent_loop[opening + 4:operations] == sent_blocking[opening + 4:]
    assert out["big"] is True
    assert out["timed_out"] is not None and 0.19 <= out["timed_out"] < 1.0, out
    assert out["after_timeout"] == 1 and out["thrown"] == 0, out
    assert out["cut"].get("error") == "DistNetworkError" and out["cut"]["s"] < 1.0, out
