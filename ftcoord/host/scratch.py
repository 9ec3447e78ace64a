"""Node-local scratch space of a job (shared memory), owned by the launchers that run it.

A job's processes may keep state in memory that outlives them on purpose (training's flash checkpoints: an image
in /dev/shm that a restarted process on the same node loads in a fraction of a second). Such state must not
outlive the job: it is large (a model and its optimizer), and a later run must never mistake it for its own.
`<root>/ftcoord-<job>/` holds a job's scratch on this node, `slot<S>/` one slot's. Whoever uses it records itself
as an owner (`claim`); a launcher removes its slots' scratch when its job ends, success or failure (`release`);
a job directory none of whose owners is alive is an orphan (`orphans`, `reap`).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

PREFIX = "ftcoord-"
OWNER_GLOB = "owner-*.json"
USER_GLOB = "user-*.json"
USER_WAIT_S = 30.0
"""How long `release` waits, in seconds, for a slot's registered users to exit before it removes the slot's scratch."""
SCRATCH_ROOT_ENV = "FTCOORD_SCRATCH_ROOT"  # tests point it elsewhere; default /dev/shm


def root() -> Path:
    """Where every job's scratch lives: /dev/shm (memory), else the temp directory."""
    configured = os.environ.get(SCRATCH_ROOT_ENV)
    if configured:
        return Path(configured)
    return Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())


def job_dir(job_id: str) -> Path:
    """The job's scratch directory on this node: `<root>/ftcoord-<job>/`."""
    return root() / f"{PREFIX}{job_id}"


def slot_dir(job_id: str, slot: int) -> Path:
    """One slot's scratch directory: `slot<S>/` in the job's."""
    return job_dir(job_id) / f"slot{slot}"


def process_start_time(pid: int) -> int | None:
    """The kernel's start time of a process (clock ticks since boot), None when it does not exist."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError, PermissionError):
        return None
    if fields[0] == "Z":
        return None  # a zombie has exited
    return int(fields[19])


def _stamp(directory: Path, kind: str, pid: int) -> Path:
    path = directory / f"{kind}-{pid}.json"
    temp = path.with_suffix(".tmp")
    temp.write_text(json.dumps({"pid": pid, "start": process_start_time(pid)}))
    os.replace(temp, path)
    return path


def claim(job_id: str, pid: int | None = None) -> Path:
    """Record `pid` (default: this process) as an owner of the job's scratch on this node.

    Every launcher that uses the scratch claims it, and so does a process running without one. The claim is
    `owner-<pid>.json`, with the pid and the process's start time, so a reused pid is not mistaken for the owner.
    """
    directory = job_dir(job_id)
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    if directory.stat().st_uid != os.getuid():
        raise PermissionError(f"{directory} belongs to uid {directory.stat().st_uid}, not to this user; "
                              f"remove it or set {SCRATCH_ROOT_ENV} to another directory")
    _stamp(directory, "owner", os.getpid() if pid is None else pid)
    return directory


def register_user(directory: Path) -> Path:
    """This process works in `directory` (a slot's scratch) and may outlive its trainer (a flash persister
    finishing a write): `release` waits for it to exit, up to USER_WAIT_S, before it removes anything."""
    return _stamp(directory, "user", os.getpid())


def _owner_alive(path: Path) -> bool:
    try:
        owner = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return owner.get("start") is not None and process_start_time(int(owner["pid"])) == owner["start"]


def release(job_id: str, slots: list[int], pid: int | None = None) -> list[Path]:
    """Remove `slots`' scratch and this owner's claim; the job directory goes when nothing is left."""
    directory = job_dir(job_id)
    removed = []
    paths = [slot_dir(job_id, slot) for slot in slots if slot_dir(job_id, slot).exists()]
    deadline = time.monotonic() + USER_WAIT_S
    while any(_owner_alive(u) for p in paths for u in p.rglob(USER_GLOB)) and time.monotonic() < deadline:
        time.sleep(0.05)  # a persister finishing its last write: let it land
    for path in paths:
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    (directory / f"owner-{os.getpid() if pid is None else pid}.json").unlink(missing_ok=True)
    try:
        if directory.is_dir() and not any(_owner_alive(p) for p in directory.glob(OWNER_GLOB)) \
                and not any(p.name.startswith("slot") for p in directory.iterdir()):
            shutil.rmtree(directory, ignore_errors=True)
    except OSError:
        pass
    return removed


@dataclass(frozen=True)
class Orphan:
    path: Path
    job_id: str
    bytes: int


def _size(path: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                pass
    return total


def orphans(keep_job: str | None = None) -> list[Orphan]:
    """This user's job scratch directories that no live process owns (except `keep_job`'s).

    A launcher reaps the orphans of *other* jobs when it starts on a node: a relaunch of the same job after a
    whole-job kill -9 keeps its own, which is what makes resuming from memory possible. `ftcoord gc` lists and
    removes them too.
    """
    found = []
    base = root()
    if not base.is_dir():
        return []
    for path in sorted(base.glob(f"{PREFIX}*")):
        try:
            if not path.is_dir() or path.is_symlink() or path.stat().st_uid != os.getuid():
                continue
        except OSError:
            continue
        job_id = path.name[len(PREFIX):]
        if job_id == keep_job or any(_owner_alive(p) for p in path.glob(OWNER_GLOB)):
            continue
        found.append(Orphan(path, job_id, _size(path)))
    return found


def reap(keep_job: str | None = None) -> list[Orphan]:
    """Remove every orphan (see `orphans`); returns what was removed."""
    removed = []
    for orphan in orphans(keep_job):
        shutil.rmtree(orphan.path, ignore_errors=True)
        removed.append(orphan)
    return removed
