"""One process of `chaos bench --scale`: many simulated participants, each a real ftcoord Participant.

Every simulated participant has what a rank's process has: its own StoreLink (its own clients, its own
watchdog), its heartbeat, leader duty, interrupt monitor and helper watch threads, and a trainer thread that
joins generations, "trains" (pings progress every `--step-s`, no model, no collectives) and rejoins when
its generation is interrupted. After each join it does the store side of a real member's rendezvous: it
counts itself arrived and writes its process-group address key (gloo's layout and size: 8 bytes per peer),
so the store holds what a real job's would.

Talks to the driver (chaos.bench_scale) in JSON lines: events on stdout; commands on stdin ("counts",
"stop").
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections import Counter

from chaos.scale_layout import freeze_startup_objects
from ftcoord import keys
from ftcoord.config import QuorumPolicy, Timing
from ftcoord.errors import FtcoordError
from ftcoord.log import configure
from ftcoord.participant import Participant
from ftcoord.store_main import raise_open_files

_OUT_LOCK = threading.Lock()


def emit(event: str, **facts: object) -> None:
    with _OUT_LOCK:
        sys.stdout.write(json.dumps({"event": event, **facts}, separators=(",", ":")) + "\n")
        sys.stdout.flush()


class SimulatedRank:
    """One simulated participant and its trainer thread."""

    def __init__(self, participant: Participant, step_s: float) -> None:
        self.p = participant
        self.step_s = step_s
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._train, name=f"sim-trainer-{participant.slot}", daemon=True)

    def _train(self) -> None:
        p, step = self.p, -1
        store = p.store  # a real rank's process groups get a client of their own: see chaos.scale_layout
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
                if int(store.add(keys.arrived(record.generation), 1)) >= record.world_size:
                    store.set(keys.all_arrived(record.generation), "1")
                store.set(keys.gloo_rendezvous(record.generation, rank or 0), b"\0" * 8 * record.world_size)
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chaos.scale_worker", description=__doc__.splitlines()[0])
    parser.add_argument("--store", required=True, help="host:port of the job's store")
    parser.add_argument("--job", required=True)
    parser.add_argument("--first", type=int, required=True, help="the first slot this process simulates")
    parser.add_argument("--count", type=int, required=True, help="how many consecutive slots")
    parser.add_argument("--target", type=int, required=True, help="the job's target world size")
    parser.add_argument("--step-s", type=float, default=0.05, help="seconds per simulated step")
    args = parser.parse_args(argv)
    configure(level=os.environ.get("FTCOORD_SCALE_LOG", "error"))
    raise_open_files()  # four store connections per simulated participant
    ranks: list[SimulatedRank] = []
    policy = QuorumPolicy(target_world_size=args.target, min_world_size=1)
    started = time.monotonic()
    for slot in range(args.first, args.first + args.count):
        participant = Participant(args.store, args.job, slot, policy, Timing(),
                                  on_helper_failure=lambda reason, s=slot: emit("helper_failed", slot=s,
                                                                                reason=reason[:300]))
        participant.start()
        ranks.append(SimulatedRank(participant, args.step_s))
    freeze_startup_objects()
    emit("started", first=args.first, count=args.count, start_s=round(time.monotonic() - started, 3),
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
                 leader_cpu_s=thread_cpu(leaders[0].p.leader.thread) if leaders else None)
        elif command == "stop":
            break
    for rank in ranks:
        rank.stopping.set()
    emit("stopped")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
