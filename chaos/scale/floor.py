"""The advance's floor for `chaos bench --scale`: what N bare store clients take, whatever the protocol.

An advance tells every participant that its generation ended, counts it in and tells it the next record: two wakes
of N waiting clients, with requests between and after. Here the clients are laid out as the participants were (the
same processes, one client and one thread each) with no ftcoord logic, and a driver plays the leader: it sets the
interrupt key, polls the count every _POLL_S, writes a record of the swarm's size and releases the monitors.
VARIANTS, least to most: `least` (wake, one add, wake), `critical_path` (the requests on ftcoord's critical path),
`ftcoord_requests` (every request ftcoord makes of a participant per advance) and `every_request` (those and gloo's
rendezvous key: what `requests_per_advance` counts; tests/integration/test_scale_bench.py checks the two agree).
The worker side runs as `python -m chaos.scale.floor` and prints JSON lines ("ready", then one "round" per round).
"""

from __future__ import annotations

import argparse
import json
import queue
import subprocess
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from chaos.bench.recovery import summary
from chaos.own_code import start_worker
from chaos.scale.layout import freeze_startup_objects
from chaos.scale.worker import GLOO_KEY_BYTES
from ftcoord.store.client import connect, get_or_none, read_int
from ftcoord.store.main import raise_open_files
from ftcoord.store.server import StoreProcess

VARIANTS = ("least", "critical_path", "ftcoord_requests", "every_request")
_POLL_S = 0.005  # the driver polls the count as often as ftcoord's leader polls a generation's join counter
_WAIT = timedelta(seconds=120)


def _key(variant: str, round_: int, name: str) -> str:
    return f"floor/{variant}/{round_}/{name}"


def _client_rounds(store: Any, variant: str, rounds: int, ends: list[float], slot: int) -> None:
    """One bare participant: for each round, hear the interrupt, be counted, hear the record (module docstring)."""
    announcement = json.dumps({"generation": 0, "slot": slot, "incarnation": 1, "step": 0}) + "\n"
    for r in range(rounds):
        interrupt, record = _key(variant, r, "interrupt"), _key(variant, r, "record")
        if variant == "least":
            store.wait([interrupt], _WAIT)
            store.add(_key(variant, r, "count"), 1)
        else:  # the monitor's wait_get: TCPStore's get, a wait and then the read; the trainer's announcement
            store.get(interrupt)
            store.append(_key(variant, r, "joiners"), announcement)
        if variant == "least":
            store.wait([record], _WAIT)
        else:
            store.get(record)
        if variant in ("ftcoord_requests", "every_request"):
            # the monitor, released: no read (ftcoord.liveness.interrupt_watch)
            store.wait([_key(variant, r, "probe")], _WAIT)
            store.compare_set(_key(variant, r, f"arrived/{slot}"), "", "1")  # the rendezvous marks the member in
            store.add(_key(variant, r, "arrived"), 1)  # and counts it on the hint (ftcoord.protocol.tally)
        if variant == "every_request":  # the process group's own rendezvous: gloo's address key
            store.set(_key(variant, r, f"address/{slot}"), b"\0" * GLOO_KEY_BYTES)
        ends[r] = max(ends[r], time.monotonic())


def _counted(store: Any, variant: str, round_: int) -> int:
    """The driver's poll: the counter (`least`), or the announcements' lines (as ftcoord's leader counts them)."""
    if variant == "least":
        return read_int(store, _key(variant, round_, "count"))
    return (get_or_none(store, _key(variant, round_, "joiners")) or b"").count(b"\n")


def worker(argv: list[str] | None = None, client: Callable[[str], Any] = connect) -> int:
    """`client(address)`: a connected store client (torch's; chaos.scale.worker_events gives its own)."""
    parser = argparse.ArgumentParser(prog="python -m chaos.scale.floor", description=__doc__.splitlines()[0])
    parser.add_argument("--store", required=True, help="host:port of the store")
    parser.add_argument("--count", type=int, required=True, help="bare participants in this process")
    parser.add_argument("--first", type=int, default=0, help="the first one's slot")
    parser.add_argument("--variant", choices=VARIANTS, required=True)
    parser.add_argument("--rounds", type=int, required=True)
    args = parser.parse_args(argv)
    raise_open_files()
    clients = [client(args.store) for _ in range(args.count)]
    ends_of = [[0.0] * args.rounds for _ in clients]
    threads = [threading.Thread(target=_client_rounds, args=(c, args.variant, args.rounds, ends_of[i], args.first + i),
                                daemon=True) for i, c in enumerate(clients)]
    freeze_startup_objects()
    for thread in threads:
        thread.start()
    print(json.dumps({"event": "ready"}), flush=True)
    for thread in threads:
        thread.join()
    for r in range(args.rounds):
        print(json.dumps({"event": "round", "round": r, "end": max(ends[r] for ends in ends_of)}), flush=True)
    return 0


def measure(n: int, per_process: int, rounds: int, record_bytes: int, variant: str,
            timeout_s: float = 120.0, participants: str = "threads") -> dict[str, Any]:
    """The floor of an advance among `n` bare participants, `per_process` to a process: a summary of the rounds'
    times from the interrupt until the last participant finished. `participants`: "threads" (a thread and torch's
    client each) or "events" (a greenlet and chaos.scale.wire_store's client each: chaos.scale.worker_events), as the
    simulated participants it is the floor of."""
    server = StoreProcess.start("127.0.0.1", 0, own_session=True)
    store = connect(server.address)
    workers: list[_Worker] = []
    try:
        for first in range(0, n, per_process):
            workers.append(_Worker.spawn(server.address, first, min(per_process, n - first), variant, rounds,
                                         participants))
        for worker in workers:
            worker.expect("ready", timeout_s)
        record = b"r" * record_bytes
        starts = []
        for r in range(rounds):
            time.sleep(0.5)  # settle, as the bench does between advances
            starts.append(time.monotonic())
            store.set(_key(variant, r, "interrupt"), "bench:floor")
            deadline = time.monotonic() + timeout_s
            while _counted(store, variant, r) < n:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the floor's round {r} at N={n}: not every bare participant was counted "
                                       f"within {timeout_s:.0f}s")
                time.sleep(_POLL_S)
            store.set(_key(variant, r, "record"), record)
            store.set(_key(variant, r, "probe"), "decided")  # as the leader releases the monitors
        ends = [0.0] * rounds
        for worker in workers:
            for _ in range(rounds):
                event = worker.expect("round", timeout_s)
                ends[event["round"]] = max(ends[event["round"]], event["end"])
        return summary([end - start for start, end in zip(starts, ends, strict=True)])
    finally:
        for worker in workers:
            worker.stop()
        server.stop()


class _Worker:
    """A floor worker process, and its lines as they come (read by a thread: a wait for one has a deadline)."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.process = process
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    @classmethod
    def spawn(cls, address: str, first: int, count: int, variant: str, rounds: int,
              participants: str = "threads") -> _Worker:
        entry = ["chaos.scale.floor"] if participants == "threads" else ["chaos.scale.worker_events", "floor"]
        return cls(start_worker(
            entry[0], [*entry[1:], "--store", address, "--count", str(count), "--first", str(first), "--variant",
                       variant, "--rounds", str(rounds)],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True, text=True))

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line)
        self.lines.put("")  # the end

    def expect(self, event: str, timeout_s: float) -> dict[str, Any]:
        """The worker's next line, which must be `event`; a worker that died or went quiet is said at once."""
        try:
            line = self.lines.get(timeout=timeout_s)
        except queue.Empty:
            raise TimeoutError(f"a floor worker said nothing for {timeout_s:.0f}s (waiting for {event!r})") from None
        if not line:
            raise RuntimeError(f"a floor worker exited with {self.process.wait()} before saying {event!r}")
        message: dict[str, Any] = json.loads(line)
        if message.get("event") != event:
            raise RuntimeError(f"a floor worker said {message!r} where {event!r} was expected")
        return message

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


if __name__ == "__main__":
    raise SystemExit(worker())
