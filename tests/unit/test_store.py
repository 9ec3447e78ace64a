"""Store server and client: bind where told, clear errors, per-job key prefixes."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist

from ftcoord import ConfigError, PortInUse, StoreAddress, StoreServer, StoreUnavailable, connect, job_store, mark_dead
from ftcoord.store.address import check_job_id
from ftcoord.store.client import get_or_none, wait_for_key, wait_get
from ftcoord.store.listen import bind_listen_socket


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_store_raises_store_unavailable_within_the_deadline() -> None:
    port = free_port()
    started = time.monotonic()
    with pytest.raises(StoreUnavailable, match=f"127.0.0.1:{port} within 1.5s"):
        connect(f"127.0.0.1:{port}", deadline=1.5)
    assert time.monotonic() - started < 1.5 + 2.5


def test_taken_port_is_a_clear_error() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        with pytest.raises(PortInUse, match=f"port {port} on 127.0.0.1 is already in use"):
            bind_listen_socket("127.0.0.1", port)


def test_server_listens_only_on_the_configured_host(store_server: StoreServer) -> None:
    client = connect(store_server.address, deadline=5)
    client.set("probe", "1")
    with socket.socket() as s:  # 127.0.0.2 reaches this host, but we did not bind it
        s.settimeout(2)
        with pytest.raises(OSError):
            s.connect(("127.0.0.2", store_server.port))


def test_jobs_sharing_a_server_do_not_see_each_other(store_server: StoreServer) -> None:
    client = connect(store_server.address, deadline=5)
    a, b = job_store(client, "job-a"), job_store(client, "job-b")
    a.set("gen/current", "5")
    assert not b.check(["gen/current"])
    assert client.get("ftcoord/job-a/gen/current") == b"5"


def test_mark_dead_only_moves_forward(store_server: StoreServer) -> None:
    store = job_store(connect(store_server.address, deadline=5), "mark-dead")
    mark_dead(store, 3, 2)
    mark_dead(store, 3, 1)
    assert store.get("slot/3/dead") == b"2"
    mark_dead(store, 3, 5)
    assert store.get("slot/3/dead") == b"5"


@pytest.mark.parametrize("text", ["localhost", "host:99999", ":12", "a:b"])
def test_bad_store_address_is_refused(text: str) -> None:
    with pytest.raises(ConfigError, match="store"):
        StoreAddress.parse(text)


def test_ipv6_address_parses() -> None:
    assert StoreAddress.parse("[::1]:29600") == StoreAddress("::1", 29600)


@pytest.mark.parametrize("job_id", ["", "a/b", "-x", "x" * 200, "sp ace"])
def test_bad_job_id_is_refused(job_id: str) -> None:
    with pytest.raises(ConfigError, match="job id"):
        check_job_id(job_id)


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "ftcoord.store.main", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def test_cli_port_zero_prints_the_port_and_stops_cleanly_on_sigterm() -> None:
    proc = run_cli("--port", "0", "--quiet")
    try:
        assert proc.stdout is not None
        ready = json.loads(proc.stdout.readline())
        assert ready["event"] == "store_ready" and ready["host"] == "127.0.0.1" and ready["port"] > 0
        client = connect(ready["address"], deadline=5)
        client.set("k", "v")
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(20) == 0
        with pytest.raises(dist.DistNetworkError):
            client.get("k")
    finally:
        proc.kill()


def test_cli_counts_its_lives_in_the_default_state_file_and_refuses_a_damaged_one(tmp_path: Path) -> None:
    """Two starts on one address: boots 0 and 1 in $XDG_STATE_HOME/ftcoord/store-HOST-PORT.boot; a damaged state
    file is one line naming it and what to do, exit 2, and is left as it was."""
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path)}
    port = None
    for expected in (0, 1):
        proc = run_cli("--port", str(port or 0), "--quiet", env=env)
        try:
            assert proc.stdout is not None
            ready = json.loads(proc.stdout.readline())
            port = ready["port"]
            assert ready["boot"] == expected, ready
            assert ready["state_file"] == str(tmp_path / "ftcoord" / f"store-127.0.0.1-{port}.boot")
        finally:
            os.kill(proc.pid, signal.SIGTERM)
            assert proc.wait(20) == 0
    bad = tmp_path / "bad.boot"
    bad.write_text("x\n")
    proc = run_cli("--port", "0", "--quiet", "--state-file", str(bad))
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines == [lines[0]] and f"the store's state file {bad} holds 'x', not a boot number" in lines[0], err
    assert bad.read_text() == "x\n"


def test_cli_taken_port_is_a_one_line_error() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        proc = run_cli("--port", str(port), "--quiet")
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines == [lines[0]] and f"port {port} on 127.0.0.1 is already in use" in lines[0]


def test_get_or_none_never_blocks_on_a_key_deleted_meanwhile(store_server: StoreServer, job_id: str) -> None:
    """One atomic operation: a key deleted between a check and a get used to block that get for the
    client's whole timeout (300 s)."""
    from ftcoord.store.client import get_or_none

    store = job_store(connect(store_server.address), job_id)
    store.set_timeout(timedelta(seconds=2))
    assert get_or_none(store, "absent") is None and not store.check(["absent"])  # and not created
    store.set("k", "v")
    assert get_or_none(store, "k") == b"v"
    store.set("empty", "")
    assert get_or_none(store, "empty") == b""

    class DeletesAfterCheck:
        """The interleaving: the key exists when checked and is gone before it is read."""

        def check(self, names: list[str]) -> bool:
            found = store.check(names)
            store.delete_key(names[0])
            return found

        def __getattr__(self, name: str) -> object:
            return getattr(store, name)

    store.set("k", "v")
    started = time.monotonic()
    value = get_or_none(DeletesAfterCheck(), "k")  # type: ignore[arg-type]
    assert time.monotonic() - started < 1.0 and value in (b"v", None)


def test_a_wait_ends_only_when_its_key_exists(store_server: StoreServer, job_id: str) -> None:
    """TCPStore wakes a key's waiters when anyone compare_sets it, even without setting it: a reader's
    get_or_none of an absent interrupt key interrupted a generation every second (ftcoord status)."""
    waiter, reader = job_store(connect(store_server.address), job_id), job_store(connect(store_server.address), job_id)
    found: list[bool] = []
    thread = threading.Thread(target=lambda: found.append(wait_for_key(waiter, "gen/1/interrupt", 1.5)))
    started = time.monotonic()
    thread.start()
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        assert get_or_none(reader, "gen/1/interrupt") is None
        time.sleep(0.05)
    thread.join(10)
    assert found == [False], "the wait reported a key that was never written"
    assert time.monotonic() - started >= 1.4
    thread = threading.Thread(target=lambda: found.append(wait_for_key(waiter, "gen/1/interrupt", 10.0)))
    thread.start()
    reader.set("gen/1/interrupt", "dead:slot=1")
    thread.join(10)
    assert found == [False, True]


def test_wait_get_reads_a_key_once_it_exists_and_tells_a_timeout_from_an_empty_wake(
        store_server: StoreServer, job_id: str) -> None:
    """ftcoord.store.client.wait_get: the value; None when the wait timed out; b"" when a wake found the key absent (a
    compare_set of an absent key wakes its waiters). The client's own timeout is what it was before."""
    waiter, writer = job_store(connect(store_server.address), job_id), job_store(connect(store_server.address), job_id)
    timeout_before = waiter.timeout
    started = time.monotonic()
    assert wait_get(waiter, "k", 0.3) is None
    assert 0.25 <= time.monotonic() - started < 5 and waiter.timeout == timeout_before
    found: list[bytes | None] = []
    thread = threading.Thread(target=lambda: found.append(wait_get(waiter, "k", 10.0)))
    thread.start()
    deadline = time.monotonic() + 10
    while thread.is_alive() and time.monotonic() < deadline:  # a wake before the wait is registered wakes nobody:
        get_or_none(writer, "k")  # sets nothing, wakes the waiter                   # wake until it was woken
        thread.join(0.05)
    assert found == [b""]
    writer.set("k", "v")
    assert wait_get(waiter, "k", 10.0) == b"v" and waiter.timeout == timeout_before
