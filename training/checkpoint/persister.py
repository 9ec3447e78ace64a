"""The flash strategy's persister: writes shared-memory images to disk in the background.

Runs in its own session, so it outlives the trainer that started it: a save requested
just before the trainer died still becomes a durable checkpoint. Exits when its owner is
gone and nothing is left to write (or on SIGTERM).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

from training.checkpoint import atomic, shm
from training.state import serialize


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
