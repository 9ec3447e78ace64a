"""Crash-safe checkpoint directories: `step_<N>/` + manifest, a `latest` symlink, retention.

Commit protocol (a crash at any point leaves the previous checkpoint loadable): write `step_<N>.tmp-<host>-<pid>/`
(state.pt, manifest.json), fsync each and the temp dir, rename to `step_<N>/`, fsync the root, rename a temp symlink
over `latest`, fsync the root, delete checkpoints beyond the last `keep`. A commit lands whole or raises `OSError`
having removed what it wrote. `latest` only moves forward. A checkpoint that failed verification is renamed
`step_<N>.rejected`, never loaded, pruned or overwritten. Pruning takes the directory's lock exclusively and loading
shared, so a loader never sees a checkpoint vanish. Temp directories are reaped only when written on the same host
by a process that is gone. `lineage` names the directory's history: a flash image is only loaded into a run of the
same directory. The write side needs no torch, so the overlapped writer process stays light.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
import socket
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from training.errors import TrainingConfigError

MANIFEST = "manifest.json"
PAYLOAD = "state.pt"
LATEST = "latest"
LOCK = ".lock"
LINEAGE = "lineage"
REJECTED = ".rejected"
STEP_DIR = re.compile(r"^step_(\d{8,})$")
TEMP = re.compile(r"^.+\.tmp-(?:(?P<host>.+)-)?(?P<pid>\d+)$")
FORMAT_VERSION = 1


@dataclass(frozen=True)
class Manifest:
    step: int
    world_size: int
    config_hash: str
    sha256: str
    size: int
    time: float
    strategy: str
    format_version: int = FORMAT_VERSION

    @classmethod
    def read(cls, path: Path) -> Manifest:
        return cls(**json.loads(path.read_text()))


def step_dir_name(step: int) -> str:
    return f"step_{step:08d}"


def _host() -> str:
    return socket.gethostname().replace("-", "_") or "localhost"


def temp_name(final: str) -> str:
    return f"{final}.tmp-{_host()}-{os.getpid()}"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_file(path: Path, data: bytes | memoryview, halfway: Sequence[Callable[[], None]] = ()) -> None:
    """Write and fsync `path`; with `halfway` callbacks, they run once half of `data` is written and flushed."""
    with open(path, "wb") as f:
        if halfway:
            view = memoryview(data)
            half = len(view) // 2
            f.write(view[:half])
            f.flush()
            for callback in halfway:
                callback()
            data = view[half:]
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def free_bytes(path: Path) -> int | None:
    """Free space where `path` lives (its nearest existing parent), None when unknown."""
    for candidate in (path, *path.parents):
        with contextlib.suppress(OSError):
            if candidate.exists():
                return shutil.disk_usage(candidate).free
    return None


def describe_failure(root: Path, exc: BaseException) -> dict[str, object]:
    """The facts of a failed save, for its `checkpoint_failed` event and the error a person reads."""
    code = getattr(exc, "errno", None)
    return {"path": str(root), "errno": errno.errorcode.get(code, code) if code else None,
            "error": str(exc)[:300], "free_bytes": free_bytes(root)}


def commit(root: Path, step: int, payload: bytes | memoryview, *, world_size: int, config_hash: str,
           strategy: str, keep: int, hooks: Sequence[Any] = ()) -> Manifest:
    """Write a checkpoint with the commit protocol above; return its manifest.

    Args:
        root: the checkpoint directory.
        step: the committed step the payload holds.
        payload: the serialized state.
        world_size: the world size that saved it.
        config_hash: the training configuration's hash (a load checks it).
        strategy: the strategy's name, for the manifest.
        keep: how many checkpoints to keep.
        hooks: objects whose `checkpoint_half_written(step)` runs half-way through the payload's write
            (training.hooks; chaos plants a crash or a hang there).

    Raises:
        OSError: the checkpoint could not be made durable (full disk, read-only, I/O error); nothing
            of this attempt is left in `root`.
    """
    root.mkdir(parents=True, exist_ok=True)
    final = root / step_dir_name(step)
    temp = root / temp_name(final.name)
    link = root / temp_name(LATEST)
    try:
        if temp.exists():
            shutil.rmtree(temp)
        temp.mkdir(mode=0o700)
        _write_file(temp / PAYLOAD, payload, [lambda hook=hook: hook.checkpoint_half_written(step) for hook in hooks])
        manifest = Manifest(step=step, world_size=world_size, config_hash=config_hash,
                            sha256=hashlib.sha256(payload).hexdigest(), size=len(payload), time=time.time(),
                            strategy=strategy)
        _write_file(temp / MANIFEST, json.dumps(manifest.__dict__, indent=1).encode())
        _fsync_dir(temp)
        _replace_dir(temp, final)
        _fsync_dir(root)
        if _latest_step(root) <= step:  # a replay of an older step never moves `latest` back
            if link.is_symlink() or link.exists():
                link.unlink()
            os.symlink(final.name, link)  # relative: the directory can be moved
            os.replace(link, root / LATEST)
            _fsync_dir(root)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        with contextlib.suppress(OSError):
            link.unlink()
        raise
    prune(root, keep)
    return manifest


def _replace_dir(new: Path, final: Path) -> None:
    """Rename `new` to `final`; an existing `final` (this step saved before, by a replay) goes after."""
    if not final.exists():
        os.rename(new, final)
        return
    old = final.with_name(temp_name(final.name) + ".old")
    os.rename(final, old)
    os.rename(new, final)
    shutil.rmtree(old, ignore_errors=True)


def _latest_step(root: Path) -> int:
    """The step `latest` points at, -1 when it points nowhere (missing, dangling, rejected)."""
    link = root / LATEST
    if not link.is_symlink():
        return -1
    match = STEP_DIR.match(os.readlink(link))
    return int(match.group(1)) if match and (root / os.readlink(link)).is_dir() else -1


def step_dirs(root: Path) -> list[tuple[int, Path]]:
    """Committed step directories, newest first."""
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := STEP_DIR.match(p.name)) and p.is_dir()]
    return sorted(found, reverse=True)


@contextlib.contextmanager
def locked(root: Path, shared: bool, wait: bool = True) -> Iterator[bool]:
    """The directory's lock: shared for loading, exclusive for pruning. Yields whether it was had."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / LOCK, "a") as lock:
        flags = (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | (0 if wait else fcntl.LOCK_NB)
        try:
            fcntl.flock(lock, flags)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def prune(root: Path, keep: int) -> None:
    """Keep the newest `keep` checkpoints (never the one `latest` points at); drop dead writers' temps."""
    with locked(root, shared=False, wait=False) as have:
        if not have:
            return  # a loader is reading: prune at the next commit
        latest = (root / LATEST).resolve() if (root / LATEST).is_symlink() else None
        for _, path in step_dirs(root)[keep:]:
            if latest is None or path.resolve() != latest:
                shutil.rmtree(path, ignore_errors=True)
        reap_temps(root)


def reap_temps(root: Path) -> list[Path]:
    """Remove temp entries left by dead writers on the local host; others may still be writing."""
    removed = []
    for path in root.glob("*.tmp-*"):
        match = TEMP.match(path.name.removesuffix(".old"))
        if not match:
            continue
        host, pid = match.group("host"), int(match.group("pid"))
        if (host is None or host == _host()) and pid != os.getpid() and not _alive(pid):
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def candidates(root: Path) -> list[Path]:
    """Where to look, in order: every step directory, newest first.

    `latest` names the newest committed one; a newer one that a crash left before `latest` moved is
    complete (it was renamed into place after its fsync), so it comes first.
    """
    return [path.resolve() for _, path in step_dirs(root)]


def verify(path: Path) -> tuple[Manifest, bytes]:
    """Read a checkpoint directory and check it; raises ValueError/OSError naming the problem."""
    manifest_path, payload_path = path / MANIFEST, path / PAYLOAD
    for file in (manifest_path, payload_path):
        if not file.is_file():
            raise ValueError(f"{file} is missing")
        if file.stat().st_uid != os.getuid():
            raise PermissionError(f"{file} is owned by uid {file.stat().st_uid}, not by this user "
                                  f"({os.getuid()}); refusing to load it")
    try:
        manifest = Manifest.read(manifest_path)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{manifest_path} is not a valid manifest ({exc})") from exc
    data = payload_path.read_bytes()
    if len(data) != manifest.size:
        raise ValueError(f"{payload_path} has {len(data)} bytes, the manifest says {manifest.size} (truncated)")
    if hashlib.sha256(data).hexdigest() != manifest.sha256:
        raise ValueError(f"{payload_path} does not match its sha256 (corrupt)")
    return manifest, data


def reject(path: Path) -> Path:
    """Set a checkpoint that failed verification aside as `step_<N>.rejected` (kept, never loaded again)."""
    target = path.with_name(path.name + REJECTED)
    n = 1
    while target.exists():
        n += 1
        target = path.with_name(f"{path.name}{REJECTED}{n}")
    os.rename(path, target)
    return target


def require_writable(root: Path) -> None:
    """Before step 0: the checkpoint directory exists (or can be made) and takes a file (its lineage)."""
    try:
        lineage(root)
    except OSError as exc:
        raise TrainingConfigError(f"--ckpt-dir {root}: cannot write checkpoints there ({exc}); create it, fix its "
                                  f"permissions, or point --ckpt-dir at a writable directory") from exc


def lineage(root: Path) -> str:
    """This checkpoint directory's lineage token, made on first use (see the module docstring)."""
    root.mkdir(parents=True, exist_ok=True)
    path = root / LINEAGE
    if path.is_file():
        return path.read_text().strip()
    temp = root / temp_name(LINEAGE)
    token = uuid.uuid4().hex
    _write_file(temp, token.encode())
    try:
        os.link(temp, path)  # atomic and exclusive: of two first users, one token wins, complete
    except FileExistsError:
        pass
    finally:
        temp.unlink(missing_ok=True)
    return path.read_text().strip()
