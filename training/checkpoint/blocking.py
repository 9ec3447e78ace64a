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
        started = time.perf_counter()
        payload = serialize(state.capture())
        serialized = time.perf_counter()
        atomic.commit(self.root, state.step, payload, world_size=world_size, config_hash=self.config_hash,
                      strategy=self.name, keep=self.keep)
        done = time.perf_counter()
        stats = SaveStats(state.step, self.name, snapshot_s=serialized - started, write_s=done - serialized,
                          stall_s=done - started, bytes=len(payload))
        self.log.info("checkpoint_committed", **stats.to_dict())
        return stats
