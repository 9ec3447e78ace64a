"""Overlapped checkpoints: serialize on the training thread, write in a background process.

The writer process does file I/O only. At most `max_inflight` saves are in flight: a
save beyond that waits (backpressure), and that wait is counted as stall.
"""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

from training.checkpoint.base import CheckpointStrategy, SaveStats
from training.state import TrainState, serialize

FLUSH_TIMEOUT_S = 600.0


class OverlappedCheckpoint(CheckpointStrategy):
    name = "overlapped"

    def __init__(self, root: Path, *, config_hash: str, keep: int, job_id: str, max_inflight: int = 1) -> None:
        super().__init__(root, config_hash=config_hash, keep=keep, job_id=job_id)
        self.root.mkdir(parents=True, exist_ok=True)
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "training.checkpoint.writer", "--root", str(self.root), "--keep", str(keep)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        )
        self._slots = threading.Semaphore(max_inflight)
        self._pending = 0
        self._done = threading.Condition()
        self._queue: queue.Queue[tuple[bytes, bytes] | None] = queue.Queue()
        self.errors: list[str] = []
        threading.Thread(target=self._feed, name="ckpt-feeder", daemon=True).start()
        threading.Thread(target=self._read, name="ckpt-results", daemon=True).start()

    def save(self, state: TrainState, world_size: int) -> SaveStats:
        started = time.perf_counter()
        payload = serialize(state.capture())
        snapshot = time.perf_counter()
        self._slots.acquire()  # backpressure: wait for a free in-flight slot
        header = json.dumps({"step": state.step, "world_size": world_size, "config_hash": self.config_hash,
                             "size": len(payload)}).encode() + b"\n"
        with self._done:
            self._pending += 1
        self._queue.put((header, payload))
        done = time.perf_counter()
        stats = SaveStats(state.step, self.name, snapshot_s=snapshot - started, enqueue_s=done - snapshot,
                          stall_s=done - started, bytes=len(payload))
        self.log.info("checkpoint_enqueued", **stats.to_dict())
        return stats

    def _feed(self) -> None:
        assert self._proc.stdin is not None
        while (item := self._queue.get()) is not None:
            header, payload = item
            try:
                self._proc.stdin.write(header)
                self._proc.stdin.write(payload)
                self._proc.stdin.flush()
            except BrokenPipeError:
                self.errors.append("the checkpoint writer process died")
                return

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            reply = json.loads(line)
            if reply.get("ok"):
                self.log.info("checkpoint_committed", step=reply["step"], write_s=round(reply["write_s"], 4),
                              strategy=self.name)
            else:
                self.errors.append(reply.get("error", "unknown"))
                self.log.error("checkpoint_write_failed", step=reply["step"], error=reply.get("error"))
            self._slots.release()
            with self._done:
                self._pending -= 1
                self._done.notify_all()

    def flush(self, timeout: float = FLUSH_TIMEOUT_S) -> None:
        with self._done:
            if not self._done.wait_for(lambda: self._pending == 0 or self._proc.poll() is not None, timeout):
                raise TimeoutError(f"{self._pending} checkpoint(s) still being written after {timeout:.0f}s "
                                   f"in {self.root}")

    def close(self, finished: bool = False) -> None:
        self.flush()
        self._queue.put(None)
        if self._proc.stdin:
            try:
                self._proc.stdin.close()
            except BrokenPipeError:
                pass
        try:
            self._proc.wait(30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
