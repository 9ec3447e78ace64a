"""What every checkpoint strategy shares: save statistics, the loader, the factory."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ftcoord.log import get_logger
from training.checkpoint import atomic
from training.errors import CheckpointCorrupt, ConfigMismatch
from training.state import TrainState, deserialize


@dataclass
class SaveStats:
    """Where a save spent the training thread's time (stall_s is what training lost)."""

    step: int
    strategy: str
    snapshot_s: float = 0.0
    """Copying the state out of the live tensors (and serializing, where the strategy does)."""
    enqueue_s: float = 0.0
    """Handing it to the background writer, including waiting for a free slot (backpressure)."""
    write_s: float = 0.0
    """File I/O on the training thread (blocking only; the others write in the background)."""
    stall_s: float = 0.0
    bytes: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Loaded:
    payload: dict[str, Any]
    step: int
    source: str
    """"disk:<path>" or "flash:<dir>"."""
    seconds: float = 0.0
    skipped: list[str] = field(default_factory=list)
    warm: bool = False
    """Written under another configuration and accepted as a warm start: use the weights only."""


class CheckpointStrategy:
    """Base: a blocking-style interface; subclasses move work off the training thread."""

    name = "base"

    def __init__(self, root: Path, *, config_hash: str, keep: int, job_id: str) -> None:
        self.root = Path(root)
        self.config_hash = config_hash
        self.keep = keep
        self.job_id = job_id
        self.log = get_logger(component="checkpoint", strategy=self.name)

    def save(self, state: TrainState, world_size: int) -> SaveStats:
        raise NotImplementedError

    def flush(self) -> None:
        """Block until every save handed to the background is durable."""

    def close(self, finished: bool = False) -> None:
        """Flush; `finished` (the job completed) lets a strategy drop what only a resume needs."""
        self.flush()

    def load(self, warm_start: bool = False) -> Loaded | None:
        return load_latest(self.root, self.config_hash, warm_start)


def load_latest(root: Path, config_hash: str, warm_start: bool = False) -> Loaded | None:
    """`latest`, else the newest valid `step_<N>`; corrupt or torn ones are skipped.

    Raises:
        ConfigMismatch: the checkpoint was written under another configuration (and this is
            not a warm start).
        CheckpointCorrupt: a checkpoint is owned by another user (refused, not skipped).
    """
    log = get_logger(component="checkpoint")
    started = time.perf_counter()
    skipped: list[str] = []
    for path in atomic.candidates(Path(root)):
        try:
            manifest, data = atomic.verify(path)
            payload = deserialize(data)
        except PermissionError as exc:
            raise CheckpointCorrupt(str(exc)) from exc
        except Exception as exc:  # torn, truncated, corrupt, unreadable: try the previous one
            skipped.append(str(path))
            log.warning("checkpoint_skipped", path=str(path), reason=str(exc)[:300])
            continue
        if manifest.config_hash != config_hash and not warm_start:
            raise ConfigMismatch(
                f"checkpoint {path} was written with config hash {manifest.config_hash}, this run has "
                f"{config_hash}: the model, data, batch, seed or optimizer changed. Resume with the "
                f"original settings, point --ckpt-dir elsewhere, or pass --warm-start to load only "
                f"the weights"
            )
        seconds = time.perf_counter() - started
        log.info("checkpoint_loaded", path=str(path), step=manifest.step, seconds=round(seconds, 4),
                 warm_start=warm_start and manifest.config_hash != config_hash)
        return Loaded(payload, manifest.step, f"disk:{path}", seconds, skipped,
                      warm=manifest.config_hash != config_hash)
    return None


def make_strategy(name: str, root: str | Path | None, *, config_hash: str, keep: int,
                  job_id: str) -> CheckpointStrategy | None:
    """The strategy named on the command line (None for "none")."""
    if name == "none" or root is None:
        return None
    kwargs = {"config_hash": config_hash, "keep": keep, "job_id": job_id}
    if name == "blocking":
        from training.checkpoint.blocking import BlockingCheckpoint

        return BlockingCheckpoint(Path(root), **kwargs)
    if name == "overlapped":
        from training.checkpoint.overlapped import OverlappedCheckpoint

        return OverlappedCheckpoint(Path(root), **kwargs)
    if name == "flash":
        from training.checkpoint.flash import FlashCheckpoint

        return FlashCheckpoint(Path(root), **kwargs)
    raise ValueError(f"unknown checkpoint strategy {name!r}")
