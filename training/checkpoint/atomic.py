"""Crash-safe checkpoint directories: `step_<N>/` + manifest, a `latest` symlink, retention.

Commit protocol (a crash at any point leaves the previous checkpoint loadable):
write `step_<N>.tmp-<pid>/state.pt` and `manifest.json` → fsync each → fsync the temp
dir → rename to `step_<N>/` → fsync the root → point a temp symlink at it → rename over
`latest` → fsync the root → delete checkpoints beyond the last `keep`.

This module needs no torch on the write side, so the overlapped writer process stays light.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

MANIFEST = "manifest.json"
PAYLOAD = "state.pt"
LATEST = "latest"
STEP_DIR = re.compile(r"^step_(\d{8,})$")
FORMAT_VERSION = 1
CRASH_ENV = "FTCOORD_FAULT_CKPT_WRITE"  # "kill:MARKER[:MINSTEP]": die half-way through one write (chaos)


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


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_file(path: Path, data: bytes | memoryview, crash_half_way: bool = False) -> None:
    with open(path, "wb") as f:
        if crash_half_way:
            f.write(data[: len(data) // 2])
            f.flush()
            os._exit(137)  # planted fault: a torn write, as a crash would leave it
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def commit(root: Path, step: int, payload: bytes | memoryview, *, world_size: int, config_hash: str,
           strategy: str, keep: int) -> Manifest:
    """Write a checkpoint with the commit protocol above; return its manifest."""
    root.mkdir(parents=True, exist_ok=True)
    final = root / step_dir_name(step)
    temp = root / f"{final.name}.tmp-{os.getpid()}"
    if temp.exists():
        shutil.rmtree(temp)
    temp.mkdir(mode=0o700)
    _write_file(temp / PAYLOAD, payload, crash_half_way=_planted_crash(step))
    manifest = Manifest(step=step, world_size=world_size, config_hash=config_hash,
                        sha256=hashlib.sha256(payload).hexdigest(), size=len(payload), time=time.time(),
                        strategy=strategy)
    _write_file(temp / MANIFEST, json.dumps(manifest.__dict__, indent=1).encode())
    _fsync_dir(temp)
    if final.exists():  # a replay of a step that was saved before (after a resume)
        shutil.rmtree(final)
    os.rename(temp, final)
    _fsync_dir(root)
    link = root / f"{LATEST}.tmp-{os.getpid()}"
    if link.is_symlink() or link.exists():
        link.unlink()
    os.symlink(final.name, link)  # relative: the directory can be moved
    os.replace(link, root / LATEST)
    _fsync_dir(root)
    prune(root, keep)
    return manifest


def _planted_crash(step: int) -> bool:
    """A fault planted by chaos: crash once during a payload write (a marker file says once)."""
    spec = os.environ.get(CRASH_ENV, "")
    if not spec.startswith("kill:"):
        return False
    marker_text, _, min_step = spec[len("kill:"):].partition(":")
    if min_step and step < int(min_step):
        return False
    marker = Path(marker_text)
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.close(fd)
    return True


def step_dirs(root: Path) -> list[tuple[int, Path]]:
    """Committed step directories, newest first."""
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := STEP_DIR.match(p.name)) and p.is_dir()]
    return sorted(found, reverse=True)


def prune(root: Path, keep: int) -> None:
    """Keep the newest `keep` checkpoints (never the one `latest` points at); drop stale temps."""
    latest = (root / LATEST).resolve() if (root / LATEST).is_symlink() else None
    for _, path in step_dirs(root)[keep:]:
        if latest is None or path.resolve() != latest:
            shutil.rmtree(path, ignore_errors=True)
    for path in root.glob("*.tmp-*"):
        pid = path.name.rsplit("-", 1)[-1]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def candidates(root: Path) -> list[Path]:
    """Where to look, in order: `latest`, then every step directory, newest first."""
    order: list[Path] = []
    link = root / LATEST
    if link.is_symlink() and link.resolve().is_dir():
        order.append(link.resolve())
    for _, path in step_dirs(root):
        if path.resolve() not in order:
            order.append(path.resolve())
    return order


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
