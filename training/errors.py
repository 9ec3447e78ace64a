"""Error types of the training package; messages name the value, the limit and the fix."""

from __future__ import annotations

from ftcoord.errors import FatalError


class TrainingConfigError(FatalError, ValueError):
    """A training setting cannot work (sizes, paths, names)."""


class CheckpointCorrupt(FatalError):
    """A checkpoint failed its checksum or could not be read."""


class CheckpointFailed(FatalError):
    """Checkpoints keep failing to reach disk (full, read-only, broken): the job stops rather than
    train on with nothing saved."""


class ConfigMismatch(FatalError):
    """A checkpoint was written under a different training configuration."""


class DatasetNotFound(TrainingConfigError, FileNotFoundError):
    """A dataset folder that was named does not exist or holds no data."""
