"""The flash strategy's persister: writes shared-memory images to disk in the background.

Runs in its own session, so it outlives the trainer that started it: a save requested just before the trainer died
still becomes a durable checkpoint. Runs niced: background persistence must not take the CPU from training. Exits
when its owner is gone and nothing is left to write (or on SIGTERM, once idle). It holds the image's
`persister.lock` for its whole life (a new trainer waits for it, see training.checkpoint.flash), commits an image
only if the writer's `writing` stamp did not move while it was read, and never dies of a refused write: the failure
goes to `failed.json` for the trainer to count, the write's temp files are gone, and the next request is served.
"""

from __future__ import annotations

import os

PERSISTER_NICE = 10
if __name__ == "__main__":  # the persister process only: importing this module (a test does) changes nothing
    os.nice(PERSISTER_NICE)  # before torch loads: its import and every write yield the CPU to training

import argparse  # noqa: E402
import fcntl  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from ftcoord.host import scratch  # noqa: E402
from training.checkpoint import atomic, shm  # noqa: E402
from training.hooks import load_write_hooks  # noqa: E402
from training.state import serialize  # noqa: E402


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def persist(directory: Path, root: Path, keep: int, requested: int, hooks: tuple[object, ...] = ()) -> None:
    """Write image `requested` to disk, or record why not; either way it is done with (`hooks`: see
    training.hooks' checkpoint_half_written)."""
    image = shm.read_image(directory, copy=False)
    if image is None or image[0]["seq"] != requested:
        shm.write_failure(directory, requested, {"error": f"image {requested} is not in {directory} (replaced or "
                                                          f"removed before it was written)"})
        return
    meta, payload = image
    data = serialize(payload)  # a private copy: from here on the buffer may change
    if shm.read_marker(directory, shm.WRITING) != requested:
        shm.write_failure(directory, requested, {"error": "the image changed while it was read (a torn read); "
                                                          "not committed"})
        return
    try:
        atomic.commit(root, meta["step"], data, world_size=meta["world_size"], config_hash=meta["config_hash"],
                      strategy="flash", keep=keep, hooks=hooks)
    except OSError as exc:
        shm.write_failure(directory, requested, atomic.describe_failure(root, exc))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shm", required=True)
    parser.add_argument("--root", required=True)
    parser.add_argument("--keep", type=int, required=True)
    parser.add_argument("--owner-pid", type=int, required=True)
    parser.add_argument("--hook", action="append", default=[], help="MODULE:FACTORY (training.hooks)")
    args = parser.parse_args()
    hooks = load_write_hooks(args.hook)
    directory, root = Path(args.shm), Path(args.root)
    stopping = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stopping.update(now=True))
    lock = open(directory / shm.PERSISTER_LOCK, "a")  # noqa: SIM115 - held until this process exits
    fcntl.flock(lock, fcntl.LOCK_EX)
    shm.write_marker(directory, shm.PERSISTER_PID, os.getpid())
    user = scratch.register_user(directory)  # the launcher waits for us before it removes the image
    try:
        while True:
            requested = shm.read_marker(directory, shm.REQUEST)
            if requested > shm.read_marker(directory, shm.PERSISTED):
                persist(directory, root, args.keep, requested, hooks)
                shm.write_marker(directory, shm.PERSISTED, requested)
                continue
            if stopping["now"] or not _alive(args.owner_pid):
                return 0
            time.sleep(0.005)
    finally:
        user.unlink(missing_ok=True)


if __name__ == "__main__":
    sys.exit(main())
