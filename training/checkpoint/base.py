"""What every checkpoint strategy shares: save statistics, failure accounting, the loader, the factory.

A save either becomes durable or is an error someone hears: every failed save logs one
`checkpoint_failed` event (path, errno, free space) and leaves nothing behind; after `max_failures`
consecutive failures the job stops with `CheckpointFailed` (a FatalError: every rank exits non-zero
with the message) rather than train on with nothing saved. A save is reported durable (the
`on_durable` callback: the ledger's checkpoint line) only once it is on disk, for the asynchronous
strategies when their background write completed.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ftcoord.log import get_logger
from training.checkpoint import atomic
from training.errors import CheckpointCorrupt, CheckpointFailed, ConfigMismatch
from training.state import TrainState, deserialize

DEFAULT_MAX_FAILURES = 3


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
    """Checkpoints newer than this one that failed verification (set aside as step_<N>.rejected)."""
    warm: bool = False
    """Written under another configuration and accepted as a warm start: use the weights only."""


class CheckpointStrategy:
    """Base: a blocking-style interface; subclasses move work off the training thread."""

    name = "base"

    def __init__(self, root: Path, *, config_hash: str, keep: int, job_id: str,
                 max_failures: int = DEFAULT_MAX_FAILURES, hooks: tuple[str, ...] = (),
                 write_hooks: tuple[Any, ...] = ()) -> None:
        self.root = Path(root)
        self.hooks = hooks
        """The `--hook` specs of the hooks that act inside a checkpoint write, for a writer process to load
        (training.hooks.load_write_hooks)."""
        self.write_hooks = write_hooks
        """The same hooks as loaded in this process, for a commit written here (the blocking strategy)."""
        self.config_hash = config_hash
        self.keep = keep
        self.job_id = job_id
        self.max_failures = max_failures
        self.consecutive_failures = 0
        self.on_durable: Callable[[SaveStats], None] | None = None
        """Called (from any thread) once a save is on disk."""
        self._fatal: CheckpointFailed | None = None
        self._lock = threading.Lock()
        self.log = get_logger(component="checkpoint", strategy=self.name)

    def save(self, state: TrainState, world_size: int) -> SaveStats:
        raise NotImplementedError

    def prepare(self) -> None:
        """This process will save (it is rank 0): start what saving needs, ahead of the first save."""

    def flush(self) -> None:
        """Block until every save handed to the background is durable or failed."""

    def close(self, finished: bool = False) -> None:
        """Flush; `finished` (the job completed) lets a strategy drop what only a resume needs."""
        with contextlib.suppress(CheckpointFailed):  # reported where it was raised
            self.flush()

    def load(self, warm_start: bool = False, start_over: bool = False) -> Loaded | None:
        return load_latest(self.root, self.config_hash, warm_start, start_over)

    # -- outcomes ------------------------------------------------------------------------

    def _durable(self, stats: SaveStats) -> None:
        with self._lock:
            self.consecutive_failures = 0
        self.log.info("checkpoint_committed", **stats.to_dict())
        if self.on_durable is not None:
            self.on_durable(stats)

    def _failed(self, step: int, exc: BaseException | str, facts: dict[str, Any] | None = None) -> None:
        """One failed save: logged, counted; `max_failures` in a row make the next call raise."""
        facts = facts or atomic.describe_failure(self.root, exc if isinstance(exc, BaseException) else OSError(exc))
        with self._lock:
            self.consecutive_failures += 1
            count = self.consecutive_failures
        self.log.error("checkpoint_failed", step=step, consecutive=count, max_failures=self.max_failures, **facts)
        if count >= self.max_failures and self._fatal is None:
            free = facts.get("free_bytes")
            space = f"; {free / 2**20:.1f} MiB free there" if isinstance(free, int) else ""
            last = atomic.step_dirs(self.root)
            resume = f"step {last[0][0]}, the newest that reached disk" if last else "the start (none reached disk)"
            self._fatal = CheckpointFailed(
                f"{count} checkpoints in a row could not be written to {self.root} (last: {facts.get('error')}"
                f"{space}); stopping rather than train on with nothing saved. Free space there or point "
                f"--ckpt-dir at a disk with room (--ckpt-max-failures {self.max_failures} sets how many failures "
                f"in a row are tolerated); a relaunch resumes from {resume}")

    def raise_if_failing(self) -> None:
        """Raise CheckpointFailed once `max_failures` saves in a row failed (training thread)."""
        if self._fatal is not None:
            raise self._fatal


def load_latest(root: Path, config_hash: str, warm_start: bool = False, start_over: bool = False) -> Loaded | None:
    """The newest checkpoint that verifies; the ones newer than it that do not are set aside.

    Raises:
        ConfigMismatch: the checkpoint was written under another configuration (and this is
            not a warm start).
        CheckpointCorrupt: checkpoints exist and none can be loaded (listing each and why), unless
            `start_over`; or a checkpoint is owned by another user. Nothing is deleted either way.
    """
    log = get_logger(component="checkpoint")
    started = time.perf_counter()
    rejected: list[tuple[Path, str]] = []
    root = Path(root)
    if not root.is_dir():
        return None
    with atomic.locked(root, shared=True):
        for path in atomic.candidates(root):
            try:
                manifest, data = atomic.verify(path)
                payload = deserialize(data)
            except PermissionError as exc:
                raise CheckpointCorrupt(str(exc)) from exc
            except Exception as exc:  # torn, truncated, corrupt, unreadable: try the previous one
                rejected.append((path, str(exc)[:300]))
                log.warning("checkpoint_skipped", path=str(path), reason=str(exc)[:300])
                continue
            if manifest.config_hash != config_hash and not warm_start:
                raise ConfigMismatch(
                    f"checkpoint {path} was written with config hash {manifest.config_hash}, this run has "
                    f"{config_hash}: the model, data, batch, seed or optimizer changed. Resume with the "
                    f"original settings, point --ckpt-dir elsewhere, or pass --warm-start to load only "
                    f"the weights"
                )
            skipped = _set_aside(rejected, log)
            seconds = time.perf_counter() - started
            log.info("checkpoint_loaded", path=str(path), step=manifest.step, seconds=round(seconds, 4),
                     warm_start=warm_start and manifest.config_hash != config_hash, skipped=skipped)
            return Loaded(payload, manifest.step, f"disk:{path}", seconds, skipped,
                          warm=manifest.config_hash != config_hash)
    if rejected and not start_over:
        listing = "; ".join(f"{path.name}: {reason}" for path, reason in rejected)
        raise CheckpointCorrupt(
            f"none of the {len(rejected)} checkpoint(s) in {root} can be loaded ({listing}). Nothing was deleted "
            f"or overwritten. Restore a good copy, point --ckpt-dir elsewhere, or pass --ckpt-start-over to "
            f"train from step 0 (the unreadable checkpoints are then kept aside as step_<N>.rejected)")
    if rejected:
        log.warning("checkpoints_start_over", root=str(root), rejected=_set_aside(rejected, log))
    return None


def _set_aside(rejected: list[tuple[Path, str]], log: Any) -> list[str]:
    """Rename checkpoints that failed verification: kept, but never loaded, pruned or overwritten."""
    moved = []
    for path, reason in rejected:
        try:
            target = atomic.reject(path)
        except OSError as exc:  # another loader moved it first, or the directory is read-only
            log.warning("checkpoint_reject_failed", path=str(path), error=str(exc))
            continue
        log.warning("checkpoint_rejected", path=str(path), kept_as=str(target), reason=reason)
        moved.append(str(target))
    return moved


def make_strategy(name: str, root: str | Path | None, *, config_hash: str, keep: int, job_id: str,
                  max_failures: int = DEFAULT_MAX_FAILURES, hooks: tuple[str, ...] = (),
                  write_hooks: tuple[Any, ...] = ()) -> CheckpointStrategy | None:
    """The strategy named on the command line (None for "none"). `hooks`: the specs of the hooks with
    `checkpoint_half_written`, which a writer process loads again (its factory gets None); `write_hooks`: those
    hooks as loaded in this process, used when this process writes."""
    if name == "none" or root is None:
        return None
    kwargs: dict[str, Any] = {"config_hash": config_hash, "keep": keep, "job_id": job_id,
                              "max_failures": max_failures, "hooks": tuple(hooks), "write_hooks": tuple(write_hooks)}
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
