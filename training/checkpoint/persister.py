"""The flash strategy's persister: writes shared-memory images to disk in the background.

Runs in its own session, so it outlives the trainer that started it: a save requested
just before the trainer died still becomes a durable checkpoint. Runs niced: background
persistence must not take the CPU from training (on a 2-core box its torch import alone
slowed the next steps 3x). Exits when its owner is
gone and nothing is left to write (or on SIGTERM).
"""

from __future__ import annotations

import os

PERSISTER_NICE = 10
os.nice(PERSISTER_NICE)  # before torch loads: its import and every write yield the CPU to training

import argparse  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from training.checkpoint import atomic, shm  # noqa: E402
from training.state import serialize  # noqa: E402


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shm", required=True)
    parser.add_argument("--root", required=True)
    parser.add_argument("--keep", type=int, required=True)
    parser.add_argument("--owner-pid", type=int, required=True)
    args = parser.parse_args()
    directory, root = Path(args.shm), Path(args.root)
    stopping = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stopping.update(now=True))
    while True:
        requested = shm.read_marker(directory, shm.REQUEST)
        if requested > shm.read_marker(directory, shm.PERSISTED):
            image = shm.read_image(directory, copy=False)
            if image is not None and image[0]["seq"] == requested:
                meta, payload = image
                atomic.commit(root, meta["step"], serialize(payload), world_size=meta["world_size"],
                              config_hash=meta["config_hash"], strategy="flash", keep=args.keep)
            shm.write_marker(directory, shm.PERSISTED, requested)
            continue
        if stopping["now"] or not _alive(args.owner_pid):
            return 0
        time.sleep(0.005)


if __name__ == "__main__":
    sys.exit(main())
