"""Named points of the protocol where a test can pause a thread or a whole process.

Safety under pauses (SIGSTOP, a cgroup freeze, swapping, a long GC, a debugger) is shown by reproducing each
interleaving, not by arguing about it. The protocol calls `reached(NAME)` at each point where a pause is
dangerous; unarmed (the normal case) that is one test of a module-level boolean. A point is armed
- for a process, by PAUSE_AT_ENV and MARKERS_ENV in its environment: the first process to reach it writes its
  pid to the markers directory and SIGSTOPs itself (every thread halts); the test sends SIGCONT, or kills it;
- for a thread, in-process (unit tests with threads against a real store), by `hold(NAME)`: the first thread
  to reach NAME blocks there until the Gate's `release()`.
"""

from __future__ import annotations

import os
import signal
import threading
from dataclasses import dataclass, field

PAUSE_AT_ENV = "FTCOORD_PAUSE_AT"
"""`NAME[@SLOT][,...]`: the points at which this process stops itself (NAME@SLOT: only the process of that slot)."""
MARKERS_ENV = "FTCOORD_PAUSE_MARKERS"
"""A directory: a process that stops at NAME first writes its pid to DIR/NAME, so a point fires once per
directory (a replacement does not stop again). Unset: each process armed for the point stops there once."""

# The points (each is named where it is reached).
LEADER_CHECKED = "leader.after_leadership_check"
"""The leader confirmed its claim and read what it decides on; its writes come next."""
LEADER_BEFORE_RECORD = "leader.before_record_write"
"""The leader computed a record and is about to write it."""
JOIN_ANNOUNCED = "join.announced"
"""A process announced itself for a generation and is about to wait for its record."""
BEFORE_RENDEZVOUS = "call.before_rendezvous"
"""A member of a decided generation is about to meet the others in the process-group rendezvous."""
IN_RENDEZVOUS = "call.in_rendezvous"
"""Every member of a decided generation reached its rendezvous; this one is about to create the process group
(publish its address, connect to the others), which blocks in C++ until they answer."""
POINTS = (LEADER_CHECKED, LEADER_BEFORE_RECORD, JOIN_ANNOUNCED, BEFORE_RENDEZVOUS, IN_RENDEZVOUS)


@dataclass
class Gate:
    """A thread-level pause at a named point: the first thread to reach it waits for `release()`."""

    name: str
    reached: threading.Event = field(default_factory=threading.Event)
    released: threading.Event = field(default_factory=threading.Event)
    thread: str | None = None

    def wait_reached(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for a thread to reach the point; True when one did."""
        return self.reached.wait(timeout)

    def release(self) -> None:
        """Let the paused thread go on, and disarm the point (unless a newer hold() armed it again)."""
        self.released.set()
        if _gates.get(self.name) is self:  # a newer hold() of the same point stays armed
            del _gates[self.name]
        _rearm()


_process_points = {p.strip() for p in os.environ.get(PAUSE_AT_ENV, "").split(",") if p.strip()}
"""NAME or NAME@SLOT entries."""
_gates: dict[str, Gate] = {}
_armed = bool(_process_points)
_lock = threading.Lock()


def _rearm() -> None:
    global _armed
    _armed = bool(_process_points or _gates)


def hold(name: str) -> Gate:
    """Arm `name` for the next thread that reaches it (see the module docstring)."""
    if name not in POINTS:
        raise ValueError(f"unknown pause point {name!r}; known: {', '.join(POINTS)}")
    gate = Gate(name)
    _gates[name] = gate
    _rearm()
    return gate


def reached(name: str) -> None:
    """Called by the protocol at the point `name`: pauses here when a test armed it."""
    if not _armed:
        return
    with _lock:
        gate = _gates.get(name)
        if gate is not None and gate.reached.is_set():
            gate = None  # only the first thread pauses
        if gate is not None:
            gate.thread = threading.current_thread().name
            gate.reached.set()
        entry = _process_entry(name)
        if entry is not None:
            _process_points.discard(entry)
            _rearm()
    if gate is not None:
        gate.released.wait()
    if entry is not None and _first_in_job(name):
        os.kill(os.getpid(), signal.SIGSTOP)


def _process_entry(name: str) -> str | None:
    """The armed entry of this process for `name` (NAME, or NAME@SLOT with this process's slot)."""
    slot = os.environ.get("FTCOORD_SLOT")
    for entry in (name, f"{name}@{slot}"):
        if entry in _process_points:
            return entry
    return None


def _first_in_job(name: str) -> bool:
    """Claim the point's marker (its pid inside); False when another process already stopped there."""
    directory = os.environ.get(MARKERS_ENV)
    if not directory:
        return True
    try:
        fd = os.open(os.path.join(directory, name), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    return True
