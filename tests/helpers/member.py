"""A protocol-only member process for tests: joins generations, idles, rejoins.

It records every record it received (one JSON line per event) so tests can check that
all processes agree. "Training" is idling until the generation is interrupted or the
test sets the key `test/stop`, after which the member finishes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

from ftcoord import JobFinished, Participant, QuorumPolicy, QuorumTimeout, Timing, log


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--store", required=True)
    parser.add_argument("--job", required=True)
    parser.add_argument("--slot", type=int, required=True)
    parser.add_argument("--target", type=int, required=True)
    parser.add_argument("--min", type=int, default=1)
    parser.add_argument("--global-batch", type=int, default=None)
    parser.add_argument("--timing", default="{}", help="JSON of Timing fields")
    parser.add_argument("--progress-timeout", type=float, default=None)
    parser.add_argument("--events", required=True)
    parser.add_argument("--stuck-after-join", action="store_true",
                        help="stop pinging progress (a hung training thread)")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse(argv)
    events = Path(args.events)
    events.parent.mkdir(parents=True, exist_ok=True)
    log.configure(events.with_suffix(".log.jsonl"), console=False)

    def emit(kind: str, **facts: object) -> None:
        with events.open("a") as f:
            f.write(json.dumps({"kind": kind, "pid": os.getpid(), "mono": time.monotonic(), **facts}) + "\n")

    policy = QuorumPolicy(args.target, args.min, global_batch=args.global_batch)
    participant = Participant(args.store, args.job, args.slot, policy, Timing(**json.loads(args.timing)),
                              progress_timeout=args.progress_timeout).start()
    emit("started", slot=args.slot, incarnation=participant.incarnation)
    step = 0
    try:
        while True:
            try:
                record = participant.join(step)
            except JobFinished:
                emit("finished", slot=args.slot, incarnation=participant.incarnation, spare=True)
                return 0
            except QuorumTimeout as exc:
                emit("quorum_timeout", slot=args.slot, error=str(exc))
                return 3
            emit("record", slot=args.slot, incarnation=participant.incarnation,
                 record=dataclasses.asdict(record))  # plain lists (the store's text compacts them)
            while True:
                if not args.stuck_after_join:
                    participant.heartbeat.ping()
                if participant.monitor.wait(0.05):
                    emit("interrupted", generation=record.generation, reason=participant.monitor.reason)
                    break
                if participant.store.check(["test/stop"]):
                    if participant.finish():
                        emit("finished", slot=args.slot, incarnation=participant.incarnation, spare=False)
                        return 0
                    break
                step += 1
    finally:
        participant.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
