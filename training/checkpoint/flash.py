"""Flash checkpoints: copy the state into a reused shared-memory buffer, persist in the background.

The training thread only memcpys tensors into the image (a GPU's through a reused pinned buffer: shm.PinnedStaging)
and writes a tiny skeleton; a persister process (its own session, so it outlives the trainer) writes the image to
disk with the atomic protocol. A process restarted on the same node loads the image when it is at least as new as
the newest checkpoint on disk (onto the rank's device: TrainState.restore copies into it). An image lives in the job's
node-local scratch (`ftcoord.host.scratch`), which its launcher removes; it records the checkpoint directory's
lineage, and a run loads only an image of its own. One persister per image (it holds `persister.lock`); a new
trainer waits until an earlier trainer's last request is written, killing a lock holder stuck past TAKEOVER_WAIT_S.
The writer stamps `writing` before it copies and `request` after; the persister commits its copy only if `writing`
did not move, so a torn read never becomes a checkpoint. A save is durable only once the persister reports it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import torch

from ftcoord.env import LAUNCHER_PID_ENV, SLOT_ENV
from ftcoord.host import scratch
from ftcoord.host.interpreter import module_command
from training.checkpoint import atomic, shm
from training.checkpoint.base import CheckpointStrategy, Loaded, SaveStats, load_latest
from training.errors import CheckpointFailed
from training.hooks import hook_args
from training.state import TrainState

PERSIST_WAIT_S = 600.0
TAKEOVER_WAIT_S = 60.0
"""How long a new trainer lets an old persister finish the write it was asked for before stopping it."""
FLASH = "flash"


def flash_dirs(job_id: str) -> list[Path]:
    """Every flash image of a job on this node (one per slot that ever saved)."""
    return sorted(scratch.job_dir(job_id).glob(f"slot*/{FLASH}"))


class FlashCheckpoint(CheckpointStrategy):
    name = "flash"

    def __init__(self, root: Path, *, config_hash: str, keep: int, job_id: str, max_failures: int,
                 hooks: tuple[str, ...] = (), write_hooks: tuple[object, ...] = ()) -> None:
        super().__init__(root, config_hash=config_hash, keep=keep, job_id=job_id, max_failures=max_failures,
                         hooks=hooks, write_hooks=write_hooks)
        slot = int(os.environ.get(SLOT_ENV, str(os.getpid())))
        self.directory = scratch.slot_dir(job_id, slot) / FLASH
        self._buffer: shm.SharedBuffer | None = None
        self._staging = shm.PinnedStaging()  # holds no memory until a save of a state on a GPU
        self._persister: subprocess.Popen[bytes] | None = None
        self._seq = 0
        self._in_flight: dict[int, SaveStats] = {}
        self._watch_stop = threading.Event()
        self._watcher: threading.Thread | None = None

    # -- start and handoff -------------------------------------------------------------------

    def _start(self) -> None:
        """Create the image and the persister on first save (most ranks never save)."""
        if LAUNCHER_PID_ENV not in os.environ:
            scratch.claim(self.job_id)  # no launcher to own (and remove) the image: this process does
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        if self.directory.stat().st_uid != os.getuid():
            raise PermissionError(f"{self.directory} belongs to another user; refusing to use it")
        self._spawn_persister()
        self._take_over()
        self._buffer = shm.SharedBuffer(self.directory)
        self._watcher = threading.Thread(target=self._watch, name="flash-watch", daemon=True)
        self._watcher.start()

    def _take_over(self) -> None:
        """Wait until an earlier trainer's last request for this image is written (see module docstring)."""
        pending = shm.read_marker(self.directory, shm.REQUEST)
        deadline = time.monotonic() + TAKEOVER_WAIT_S
        killed = False
        while shm.read_marker(self.directory, shm.PERSISTED) < pending:
            if time.monotonic() > deadline and not killed:
                # stuck (a hung filesystem, say): a kill mid-commit leaves a temp directory, never a torn
                # checkpoint, and our own persister, next in line for the lock, writes the request again
                pid = shm.read_marker(self.directory, shm.PERSISTER_PID)
                with contextlib.suppress(ProcessLookupError):
                    if pid and self._persister is not None and pid != self._persister.pid:
                        os.kill(pid, signal.SIGKILL)
                killed = True
                self.log.warning("flash_persister_killed", pid=pid, request=pending, waited_s=TAKEOVER_WAIT_S)
            if time.monotonic() > deadline + TAKEOVER_WAIT_S:
                raise RuntimeError(f"flash image {self.directory}: request {pending} of an earlier trainer was not "
                                   f"written within {2 * TAKEOVER_WAIT_S:.0f}s; see its persister.err")
            time.sleep(0.01)
        # Copies a trainer died in the middle of were never requested: nothing to write for them.
        self._seq = max(pending, shm.read_marker(self.directory, shm.WRITING))
        if shm.read_marker(self.directory, shm.PERSISTED) < self._seq:
            shm.write_marker(self.directory, shm.PERSISTED, self._seq)

    def _spawn_persister(self) -> None:
        self._persister = subprocess.Popen(
            module_command("training.checkpoint.persister", "--shm", str(self.directory), "--root", str(self.root),
                           "--keep", str(self.keep), "--owner-pid", str(os.getpid()),
                           *hook_args(self.hooks)),
            start_new_session=True,  # outlives this process: an in-flight persist still lands
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,  # holds no pipe of ours open
            stderr=open(self.directory / "persister.err", "ab"),  # noqa: SIM115 - the child owns it
        )

    # -- saving ------------------------------------------------------------------------------

    def _wait_persisted(self, seq: int, timeout: float = PERSIST_WAIT_S) -> None:
        """Until the persister is done with `seq` (written or refused); a dead persister is a failed save."""
        deadline = time.monotonic() + timeout
        while shm.read_marker(self.directory, shm.PERSISTED) < seq:
            if self._persister is not None and self._persister.poll() is not None:
                code = self._persister.returncode
                self._spawn_persister()  # the next save gets a writer again
                shm.write_marker(self.directory, shm.PERSISTED, seq)
                shm.write_failure(self.directory, seq, {"error": f"the flash persister exited (code {code}) "
                                                                 f"before writing it"})
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"flash checkpoint {seq} not persisted after {timeout:.0f}s")
            time.sleep(0.002)
        self._collect()

    def _collect(self) -> None:
        """Report each finished save once: durable, or failed (from any thread)."""
        with self._lock:
            persisted = shm.read_marker(self.directory, shm.PERSISTED)
            finished = [(seq, self._in_flight.pop(seq)) for seq in sorted(self._in_flight) if seq <= persisted]
            failure = shm.read_failure(self.directory)
        for seq, stats in finished:
            if failure is not None and failure.get("seq") == seq:
                self._failed(stats.step, str(failure.get("error")),
                             {k: failure.get(k) for k in ("path", "errno", "error", "free_bytes")})
            else:
                self._durable(stats)

    def _watch(self) -> None:
        while not self._watch_stop.wait(0.02):
            if self._in_flight:
                with contextlib.suppress(OSError):
                    self._collect()

    def prepare(self) -> None:
        """Start the persister now: its Python and torch import (seconds, niced) overlap training instead
        of stalling the save after the first, which must wait until the persister read the buffer."""
        if self._buffer is None:
            self._start()

    def save(self, state: TrainState, world_size: int) -> SaveStats:
        self.raise_if_failing()
        started = time.perf_counter()
        if self._buffer is None:
            self._start()
        self._wait_persisted(self._seq)  # backpressure: the persister may still read the buffer
        self.raise_if_failing()
        waited = time.perf_counter()
        tensors: list[torch.Tensor] = []
        skeleton = shm.flatten(state.capture(), tensors)
        layout, total = shm.layout_of(tensors)
        seq = self._seq + 1
        shm.write_marker(self.directory, shm.WRITING, seq)  # the persister never commits a torn read
        (self.directory / shm.META).unlink(missing_ok=True)  # a kill mid-copy leaves no valid image
        assert self._buffer is not None
        shm.write_image(self._buffer, tensors, layout, total, self._staging)
        copied = time.perf_counter()
        meta = {"seq": seq, "step": state.step, "world_size": world_size, "config_hash": self.config_hash,
                "root": str(self.root.resolve()), "lineage": atomic.lineage(self.root), "job_id": self.job_id,
                "layout": layout, "total": total, "skeleton": skeleton}
        temp = self.directory / f"{shm.META}.tmp"
        torch.save(meta, temp)
        os.replace(temp, self.directory / shm.META)
        done = time.perf_counter()
        stats = SaveStats(state.step, self.name, snapshot_s=copied - waited,
                          enqueue_s=(waited - started) + (done - copied), stall_s=done - started, bytes=total)
        with self._lock:
            self._in_flight[seq] = stats
        self._seq = seq
        shm.write_marker(self.directory, shm.REQUEST, seq)
        self.log.info("checkpoint_snapshot", **stats.to_dict())
        return stats

    def flush(self) -> None:
        if self._buffer is not None:
            self._wait_persisted(self._seq)
        self.raise_if_failing()

    def close(self, finished: bool = False) -> None:
        """Flush and stop the persister; a finished job also drops its image (no resume left)."""
        try:
            self.flush()
        except CheckpointFailed:
            pass  # reported where it was raised
        finally:
            self._watch_stop.set()
            if self._persister is not None:
                self._persister.terminate()
                try:
                    self._persister.wait(30)
                except subprocess.TimeoutExpired:
                    self._persister.kill()
                self._persister = None
            if self._buffer is not None:
                self._buffer.close()
            self._staging.close()
            if finished:
                shm.remove_image(self.directory)

    # -- loading -----------------------------------------------------------------------------

    def load(self, warm_start: bool = False, start_over: bool = False) -> Loaded | None:
        """The newest of: a complete flash image of this lineage on this node, the newest disk checkpoint."""
        started = time.perf_counter()
        image = self._newest_image()
        on_disk = atomic.step_dirs(self.root)
        if image is not None and image[0]["step"] >= (on_disk[0][0] if on_disk else -1):
            return self._loaded_image(image, started)
        loaded = load_latest(self.root, self.config_hash, warm_start, start_over and image is None)
        if image is not None and (loaded is None or image[0]["step"] > loaded.step):
            return self._loaded_image(image, started)
        return loaded

    def _loaded_image(self, image: tuple[dict, dict, Path], started: float) -> Loaded:
        meta, payload, directory = image
        seconds = time.perf_counter() - started
        self.log.info("checkpoint_loaded", path=str(directory), step=meta["step"], seconds=round(seconds, 4),
                      source="flash")
        return Loaded(payload, meta["step"], f"flash:{directory}", seconds)

    def _newest_image(self) -> tuple[dict, dict, Path] | None:
        lineage = atomic.lineage(self.root)
        root = str(self.root.resolve())
        best: tuple[dict, dict, Path] | None = None
        for directory in flash_dirs(self.job_id):
            try:
                image = shm.read_image(directory)
            except Exception as exc:  # a torn image: the disk has the previous state
                self.log.warning("flash_image_skipped", path=str(directory), reason=str(exc)[:200])
                continue
            if image is None:
                continue
            meta = image[0]
            if (meta.get("root"), meta.get("lineage"), meta["config_hash"]) != (root, lineage, self.config_hash):
                self.log.warning("flash_image_stale", path=str(directory), step=meta["step"],
                                 why="written for another checkpoint directory, lineage or configuration")
                continue
            if best is None or meta["step"] > best[0]["step"]:
                best = (meta, image[1], directory)
        return best
