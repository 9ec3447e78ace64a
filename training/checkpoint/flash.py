"""Flash checkpoints: copy the state into a reused shared-memory buffer, persist in the background.

The training thread only memcpys tensors into /dev/shm (no pickling) and writes a tiny
skeleton; a persister process (its own session, so it outlives the trainer) writes the
image to disk with the atomic protocol. A process restarted on the same node loads the
image from memory when it is at least as new as the newest disk checkpoint.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from training.checkpoint import shm
from training.checkpoint.atomic import step_dirs
from training.checkpoint.base import CheckpointStrategy, Loaded, SaveStats, load_latest
from training.state import TrainState

PERSIST_WAIT_S = 600.0


def shm_root() -> Path:
    return Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())


def flash_dirs(job_id: str) -> list[Path]:
    """Every flash image of a job on this node (one per slot that ever saved)."""
    return sorted(shm_root().glob(f"ftcoord-flash-{job_id}-slot*"))


class FlashCheckpoint(CheckpointStrategy):
    name = "flash"

    def __init__(self, root: Path, *, config_hash: str, keep: int, job_id: str) -> None:
        super().__init__(root, config_hash=config_hash, keep=keep, job_id=job_id)
        slot = os.environ.get("FTCOORD_SLOT", str(os.getpid()))
        self.directory = shm_root() / f"ftcoord-flash-{job_id}-slot{slot}"
        self._buffer: shm.SharedBuffer | None = None
        self._persister: subprocess.Popen[bytes] | None = None
        self._seq = 0

    def _start(self) -> None:
        """Create the image directory and the persister on first save (most ranks never save)."""
        self.directory.mkdir(mode=0o700, exist_ok=True)
        if self.directory.stat().st_uid != os.getuid():
            raise PermissionError(f"{self.directory} belongs to another user; refusing to use it")
        self._seq = max(shm.read_marker(self.directory, shm.REQUEST), shm.read_marker(self.directory, shm.PERSISTED))
        shm.write_marker(self.directory, shm.PERSISTED, self._seq)
        self._buffer = shm.SharedBuffer(self.directory)
        self._persister = subprocess.Popen(
            [sys.executable, "-m", "training.checkpoint.persister", "--shm", str(self.directory),
             "--root", str(self.root), "--keep", str(self.keep), "--owner-pid", str(os.getpid())],
            start_new_session=True,  # outlives this process: an in-flight persist still lands
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,  # holds no pipe of ours open
            stderr=open(self.directory / "persister.err", "ab"),  # noqa: SIM115 - the child owns it
        )

    def _wait_persisted(self, seq: int, timeout: float = PERSIST_WAIT_S) -> None:
        deadline = time.monotonic() + timeout
        while shm.read_marker(self.directory, shm.PERSISTED) < seq:
            if self._persister is not None and self._persister.poll() is not None:
                raise RuntimeError(f"the flash persister for {self.directory} exited "
                                   f"(code {self._persister.returncode}); see its log")
            if time.monotonic() > deadline:
                raise TimeoutError(f"flash checkpoint {seq} not persisted after {timeout:.0f}s")
            time.sleep(0.002)

    def save(self, state: TrainState, world_size: int) -> SaveStats:
        started = time.perf_counter()
        if self._buffer is None:
            self._start()
        self._wait_persisted(self._seq)  # backpressure: the persister still reads the buffer
        waited = time.perf_counter()
        tensors: list[torch.Tensor] = []
        skeleton = shm.flatten(state.capture(), tensors)
        layout, total = shm.layout_of(tensors)
        (self.directory / shm.META).unlink(missing_ok=True)  # a kill mid-copy leaves no valid image
        assert self._buffer is not None
        shm.write_image(self._buffer, tensors, layout, total)
        copied = time.perf_counter()
        self._seq += 1
        meta = {"seq": self._seq, "step": state.step, "world_size": world_size, "config_hash": self.config_hash,
                "layout": layout, "total": total, "skeleton": skeleton}
        temp = self.directory / f"{shm.META}.tmp"
        torch.save(meta, temp)
        os.replace(temp, self.directory / shm.META)
        shm.write_marker(self.directory, shm.REQUEST, self._seq)
        done = time.perf_counter()
        stats = SaveStats(state.step, self.name, snapshot_s=copied - waited,
                          enqueue_s=(waited - started) + (done - copied), stall_s=done - started, bytes=total)
        self.log.info("checkpoint_snapshot", **stats.to_dict())
        return stats

    def flush(self) -> None:
        if self._buffer is not None:
            self._wait_persisted(self._seq)

    def close(self, finished: bool = False) -> None:
        """Flush and stop the persister; a finished job also drops its image (no resume left)."""
        self.flush()
        if self._persister is not None:
            self._persister.terminate()
            self._persister.wait(30)
            self._persister = None
        if self._buffer is not None:
            self._buffer.close()
        if finished:
            for path in (self.directory / n for n in (shm.BUFFER, shm.META, shm.REQUEST, shm.PERSISTED,
                                                      "persister.err")):
                path.unlink(missing_ok=True)
            try:
                self.directory.rmdir()
            except OSError:
                pass

    def load(self, warm_start: bool = False) -> Loaded | None:
        """The newest of: a complete flash image on this node, the newest disk checkpoint."""
        started = time.perf_counter()
        on_disk = step_dirs(self.root)
        newest_disk = on_disk[0][0] if on_disk else -1
        best: tuple[dict, dict, Path] | None = None
        for directory in flash_dirs(self.job_id):
            try:
                image = shm.read_image(directory)
            except Exception as exc:  # a torn image: the disk has the previous state
                self.log.warning("flash_image_skipped", path=str(directory), reason=str(exc)[:200])
                continue
            if image is None or image[0]["config_hash"] != self.config_hash:
                continue
            if best is None or image[0]["step"] > best[0]["step"]:
                best = (image[0], image[1], directory)
        if best is not None and best[0]["step"] >= newest_disk:
            seconds = time.perf_counter() - started
            self.log.info("checkpoint_loaded", path=str(best[2]), step=best[0]["step"], seconds=round(seconds, 4),
                          source="flash")
            return Loaded(best[1], best[0]["step"], f"flash:{best[2]}", seconds)
        return load_latest(self.root, self.config_hash, warm_start)
