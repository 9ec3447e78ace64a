"""One process of `chaos bench --scale`: many simulated participants, each a real ftcoord Participant.

Every simulated participant has what a rank's process has: its own StoreLink (its own clients, its own watchdog),
its heartbeat, leader duty, interrupt monitor and helper watch threads, and a trainer thread that joins generations,
"trains" (pings progress every `--step-s`, no model, no collectives) and rejoins when its generation is interrupted.
After each join it does the store side of a real member's rendezvous: it counts itself arrived and writes its
process-group address key (gloo's layout and size, GLOO_KEY_BYTES), so the store holds what a real job's would.
Talks to the driver (chaos.scale.bench) in JSON lines: events on stdout; commands on stdin ("counts",
"stacks <slot> ...": where the named participants' threads are, for a straggler; "stop").
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import queue
import socket
import sys
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable

from chaos.scale.layout import freeze_startup_objects
from ftcoord.config import QuorumPolicy, Timing
from ftcoord.errors import FtcoordError
from ftcoord.log import configure
from ftcoord.protocol import keys, tally
from ftcoord.store.link import StoreLink
from ftcoord.store.main import raise_open_files
from ftcoord.wrapper.participant import Participant

GLOO_KEY_BYTES = 152 + len(socket.gethostname())
"""A member's gloo rendezvous key with the options ftcoord sets (ftcoord.wrapper.call.GLOO_RENDEZVOUS_OPTIONS): its
host's name and address (two lengths, the name, a sockaddr_storage and a sequence number): 152 bytes and the host's
name, whatever the world size. What the simulation leaves out: gloo's reads of every peer's key (multi_gets of 128)."""

_OUT: queue.SimpleQueue[dict[str, object] | None] = queue.SimpleQueue()


def emit(event: str, **facts: object) -> None:
    """Tell the driver, without waiting for it: a thread of its own writes the line. A participant that wrote its
    events itself would stand still whenever the driver read its pipe late: its trainer held in a full pipe's write,
    its rendezvous and rejoins with it."""
    _OUT.put({"event": event, **facts})


GATHER_S = 0.02
"""How long the writer gathers the lines that follow one before it writes them all: each carries its own time (a
participant's `t` is when it joined, not when the driver read it), so the wait is in no figure."""


def _write_events() -> None:
    """What was queued, in one write. An advance joins a process's participants one after another over a few hundred
    ms, so a write of only what was queued at the moment would be one write a participant or nearly, and a wake-up
    of the driver to read each. The writer gathers for GATHER_S after the first line: a dozen writes an advance, not
    a hundred."""
    while True:
        batch = [_OUT.get()]
        if batch[0] is not None:
            time.sleep(GATHER_S)
        while not _OUT.empty():
            batch.append(_OUT.get())
        lines = [json.dumps(message, separators=(",", ":")) + "\n" for message in batch if message is not None]
        sys.stdout.write("".join(lines))
        sys.stdout.flush()
        if None in batch:
            return


class SimulatedRank:
    """One simulated participant and its trainer thread."""

    def __init__(self, participant: Participant, step_s: float) -> None:
        self.p = participant
        self.step_s = step_s
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._train, name=f"sim-trainer-{participant.slot}", daemon=True)

    def _train(self) -> None:
        p, step = self.p, -1
        store = p.store  # a real rank's process groups get a client of their own: see chaos.scale.layout
        while not self.stopping.is_set():
            try:
                record = p.join(step)
            except FtcoordError as exc:
                emit("left", slot=p.slot, reason=f"{type(exc).__name__}: {exc}"[:300])
                return
            emit("joined", slot=p.slot, generation=record.generation, world=record.world_size,
                 t=time.monotonic())
            rank = record.rank_of(p.slot, p.incarnation)
            try:
                tally.arrive(store, record.generation, rank or 0, record.world_size)
                store.set(keys.gloo_rendezvous(record.generation, rank or 0), b"\0" * GLOO_KEY_BYTES)
            except Exception as exc:  # noqa: BLE001 - reported, the driver decides
                emit("left", slot=p.slot, reason=f"rendezvous: {exc}"[:300])
                return
            while not p.interrupted and not p.should_stop and not self.stopping.is_set():
                step += 1
                p.heartbeat.ping()
                p.report.committed(step)
                p.monitor.wait(self.step_s)


def thread_cpu(thread: threading.Thread) -> float:
    """CPU seconds a thread of this process has used."""
    if thread.ident is None:
        return 0.0
    try:
        return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
    except OSError:
        return 0.0


def leader_cpu(p: Participant) -> float:
    """CPU seconds of a participant's leader duty: its thread's and its forgetter's (ftcoord.leader.forgetter)."""
    forgetting = p.forgetter.thread
    return thread_cpu(p.leader.thread) + (thread_cpu(forgetting) if forgetting is not None else 0.0)


class CollectorPauses:
    """Full collections (the collector's generation 2) that held this process's interpreter lock: when and how long;
    each is told to the driver (a straggling advance that met one measured the machine, not the protocol)."""

    def __init__(self) -> None:
        self._started = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            self._started = time.monotonic()
        else:
            emit("collected", t=self._started, s=round(time.monotonic() - self._started, 4),
                 collected=info.get("collected", 0))


def state(p: Participant) -> dict[str, object]:
    """What a participant's interrupt watch and trainer hold now (for a straggler)."""
    m = p.monitor
    return {"generation": p.generation, "watching": m._generation, "fired": m.fired, "answered": m._answered,
            "announced": m._announced, "reason": m.reason}


def stacks(slots: set[int]) -> dict[str, list[str]]:
    """Where each thread of the named participants is now, by thread name (ftcoord-monitor-12: its frames, innermost
    last): what a straggler waits in."""
    frames = sys._current_frames()
    found: dict[str, list[str]] = {}
    for thread in threading.enumerate():
        slot = thread.name.rsplit("-", 1)[-1]
        frame = frames.get(thread.ident or -1)
        if slot.isdigit() and int(slot) in slots and frame is not None:
            walk = traceback.walk_stack(frame)
            found[thread.name] = [f"{f.f_code.co_filename}:{line} {f.f_code.co_name}" for f, line in walk][::-1]
    return found


def main(argv: list[str] | None = None, prepare: Callable[[Timing], None] = lambda timing: None) -> int:
    """`prepare(timing)`: what the process needs before its participants start, given their timing
    (chaos.scale.worker_events' timers)."""
    parser = argparse.ArgumentParser(prog="python -m chaos.scale.worker", description=__doc__.splitlines()[0])
    parser.add_argument("--store", required=True, help="host:port of the job's store")
    parser.add_argument("--job", required=True)
    parser.add_argument("--first", type=int, required=True, help="the first slot this process simulates")
    parser.add_argument("--count", type=int, required=True, help="how many consecutive slots")
    parser.add_argument("--target", type=int, required=True, help="the job's target world size")
    parser.add_argument("--step-s", type=float, default=0.05, help="seconds per simulated step")
    parser.add_argument("--heartbeat-interval", type=float, default=Timing.heartbeat_interval)
    parser.add_argument("--heartbeat-timeout", type=float, default=Timing.heartbeat_timeout)
    args = parser.parse_args(argv)
    configure(level=os.environ.get("FTCOORD_SCALE_LOG", "error"))
    writer = threading.Thread(target=_write_events, name="sim-events", daemon=True)
    writer.start()
    raise_open_files()  # four store connections per simulated participant
    ranks: list[SimulatedRank] = []
    policy = QuorumPolicy(target_world_size=args.target, min_world_size=1)
    timing = Timing(heartbeat_interval=args.heartbeat_interval, heartbeat_timeout=args.heartbeat_timeout)
    prepare(timing)
    started = time.monotonic()
    for slot in range(args.first, args.first + args.count):
        participant = Participant(args.store, args.job, slot, policy, timing,
                                  on_helper_failure=lambda reason, s=slot: emit("helper_failed", slot=s,
                                                                                reason=reason[:300]))
        participant.start()
        ranks.append(SimulatedRank(participant, args.step_s))
    freeze_startup_objects()
    CollectorPauses()
    emit("started", first=args.first, count=args.count, start_s=round(time.monotonic() - started, 3),
         client=StoreLink.open_client.__qualname__,
         incarnations={r.p.slot: r.p.incarnation for r in ranks})
    for rank in ranks:
        rank.thread.start()
    for line in sys.stdin:
        command = line.strip()
        if command == "counts":
            total: Counter[tuple[str, str]] = Counter()
            for rank in ranks:
                assert rank.p.link is not None
                total.update(rank.p.link.requests())
            leaders = [r for r in ranks if r.p.leader.is_leader]
            emit("counts", t=time.monotonic(), requests={f"{role}/{op}": n for (role, op), n in total.items()},
                 leader_slot=leaders[0].p.slot if leaders else None,
                 leader_cpu_s=leader_cpu(leaders[0].p) if leaders else None)
        elif command.startswith("stacks "):
            named = {int(s) for s in command.split()[1:]}
            emit("stacks", t=time.monotonic(), threads=stacks(named),
                 state={r.p.slot: state(r.p) for r in ranks if r.p.slot in named})
        elif command == "stop":
            break
    for rank in ranks:
        rank.stopping.set()
    emit("stopped")
    _OUT.put(None)
    writer.join(10.0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
