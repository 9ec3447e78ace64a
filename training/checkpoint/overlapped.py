"""Overlapped checkpoints: serialize on the training thread, write in a background process.

The writer process does file I/O only. At most `max_inflight` saves are in flight: a
save beyond that waits (backpressure), and that wait is counted as stall. A save is durable
when the writer says so; a refused write (or a writer that died) counts as a failed save.
"""

from __future__ import annotations

import json
import queue
import subprocess
import threading
import time
from pathlib import Path

from ftcoord.host.interpreter import module_command
from training.checkpoint.base import CheckpointStrategy, SaveStats
from training.errors import CheckpointFailed
from training.hooks import hook_args
from training.state import TrainState, serialize

FLUSH_TIMEOUT_S = 600.0


class OverlappedCheckpoint(CheckpointStrategy):
    name = "overlapped"

    def __init__(self, root: Path, *, config_hash: str, keep: int, job_id: str, max_failures: int,
                 max_inflight: int = 1, hooks: tuple[str, ...] = (), write_hooks: tuple[object, ...] = ()) -> None:
        super().__init__(root, config_hash=config_hash, keep=keep, job_id=job_id, max_failures=max_failures,
                         hooks=hooks, write_hooks=write_hooks)
        self.root.mkdir(parents=True, exist_ok=True)
        self._proc = subprocess.Popen(
            module_command("training.checkpoint.writer", "--root", str(self.root), "--keep", str(keep),
                           *hook_args(hooks)),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        )
        self._slots = threading.Semaphore(max_inflight)
        self._done = threading.Condition()
        self._queue: queue.Queue[tuple[int, bytes, bytes] | None] = queue.Queue()
        self._in_flight: dict[int, SaveStats] = {}
        threading.Thread(target=self._feed, name="ckpt-feeder", daemon=True).start()
        threading.Thread(target=self._read, name="ckpt-results", daemon=True).start()

    def save(self, state: TrainState, world_size: int) -> SaveStats:
        self.raise_if_failing()
        started = time.perf_counter()
        payload = serialize(state.capture())
        snapshot = time.perf_counter()
        self._slots.acquire()  # backpressure: wait for a free in-flight slot
        try:  # the save in flight while this one waited may have been the failure that ends it
            self.raise_if_failing()
        except CheckpointFailed:
            self._slots.release()
            raise
        header = json.dumps({"step": state.step, "world_size": world_size, "config_hash": self.config_hash,
                             "size": len(payload)}).encode() + b"\n"
        done = time.perf_counter()
        stats = SaveStats(state.step, self.name, snapshot_s=snapshot - started, enqueue_s=done - snapshot,
                          stall_s=done - started, bytes=len(payload))
        with self._done:
            self._in_flight[state.step] = stats
        self._queue.put((state.step, header, payload))
        self.log.info("checkpoint_enqueued", **stats.to_dict())
        return stats

    def _settle(self, step: int, reply: dict[str, object] | None, error: str = "") -> None:
        """One save's outcome: durable, or failed (and its in-flight slot freed either way)."""
        with self._done:
            stats = self._in_flight.pop(step, None)
        if stats is None:
            return  # settled already
        if reply is not None and reply.get("ok"):
            stats.write_s = round(float(reply["write_s"]), 4)  # type: ignore[arg-type]
            self._durable(stats)
        elif reply is not None:
            self._failed(step, str(reply.get("error", "unknown")),
                         {k: reply.get(k) for k in ("path", "errno", "error", "free_bytes")})
        else:
            self._failed(step, error)
        self._slots.release()
        with self._done:
            self._done.notify_all()

    def _feed(self) -> None:
        assert self._proc.stdin is not None
        while (item := self._queue.get()) is not None:
            step, header, payload = item
            try:
                self._proc.stdin.write(header)
                self._proc.stdin.write(payload)
                self._proc.stdin.flush()
            except BrokenPipeError:
                self._settle(step, None, f"the checkpoint writer process died (exit code {self._proc.poll()})")

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            reply = json.loads(line)
            self._settle(int(reply["step"]), reply)
        for step in list(self._in_flight):  # the writer exited with these in flight: never on disk
            self._settle(step, None, f"the checkpoint writer process exited (code {self._proc.wait()}) before "
                                     f"step {step} reached disk")

    def flush(self, timeout: float = FLUSH_TIMEOUT_S) -> None:
        with self._done:
            if not self._done.wait_for(lambda: not self._in_flight, timeout):
                raise TimeoutError(f"{len(self._in_flight)} checkpoint(s) still being written after {timeout:.0f}s "
                                   f"in {self.root}")
        self.raise_if_failing()

    def close(self, finished: bool = False) -> None:
        try:
            self.flush()
        except CheckpointFailed:
            pass  # reported where it was raised
        finally:
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
