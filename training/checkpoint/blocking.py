"""Blocking checkpoints: serialize and write on the training thread (the baseline)."""

from __future__ import annotations

import time

from training.checkpoint import atomic
from training.checkpoint.base import CheckpointStrategy, SaveStats
from training.state import TrainState, serialize


class BlockingCheckpoint(CheckpointStrategy):
    """torch.save + fsync + atomic rename, all while training waits."""

    name = "blocking"

    def save(self, state: TrainState, world_size: int) -> SaveStats:
        self.raise_if_failing()
        started = time.perf_counter()
        payload = serialize(state.capture())
        serialized = time.perf_counter()
        try:
            atomic.commit(self.root, state.step, payload, world_size=world_size, config_hash=self.config_hash,
                          strategy=self.name, keep=self.keep, hooks=self.write_hooks)
            durable = True
        except OSError as exc:  # full disk, read-only, I/O error: counted, never an in-process restart
            self._failed(state.step, exc)
            self.raise_if_failing()
            durable = False
        done = time.perf_counter()
        stats = SaveStats(state.step, self.name, snapshot_s=serialized - started, write_s=done - serialized,
                          stall_s=done - started, bytes=len(payload))
        if durable:
            self._durable(stats)
        return stats
