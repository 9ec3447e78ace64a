"""How `chaos bench --scale` lays N simulated participants out on the host it runs on, and whether they fit.

The leader gets a process of its own, so does each of the two kill victims; the bulk shares processes,
`per_process` participants each, the fewest that fit (each process has one interpreter lock for hundreds of
threads). A size must fit four budgets: memory (a worker's own, each participant's, and torch's shared libraries
counted once: WorkerMemory), the kernel's threads (THREADS_PER_PARTICIPANT), the store's descriptors
(CONNECTIONS_PER_PARTICIPANT, within its hard open-file limit) and the CPU its participants keep busy at steady
state (at most CPU_SHARE of the cores: past it heartbeats are late and every figure measures the host, not the
protocol). A size that fits no layout is refused before anything starts (DoesNotFit says what it would need and
what to do), never killed for memory halfway through.
"""

from __future__ import annotations

import gc
import math
import os
from dataclasses import dataclass
from pathlib import Path

from ftcoord.store.main import open_files_limit

PER_PROCESS = (64, 128, 256, 512)
"""Simulated participants per bulk worker process, in the order tried: the first that fits."""
THREADS_PER_PARTICIPANT = 6
CONNECTIONS_PER_PARTICIPANT = 4
STORE_AND_DRIVER_MB = 1536  # the store process (torch too, plus a connection per client) and this driver
HEADROOM = 0.9  # of the memory available: the page cache, the kernel's own share
PARTICIPANT_CORES = 0.00025
"""The CPU a simulated participant keeps busy at steady state, in cores, until a run measured it (its threads wake
for ~3 store requests a second)."""
CPU_SHARE = {"threads": 0.4, "events": 0.6}
"""Of the host's cores, what the simulated participants may keep busy at steady state, by how they run. Events
(chaos.scale.worker_events) may take more: a few dozen processes, not thousands of threads, so the store is never
one thread among thousands that the kernel shares the cores between."""


class DoesNotFit(Exception):
    """N participants cannot be simulated on the host: the message says what they need and what to do."""


@dataclass(frozen=True)
class WorkerMemory:
    """What worker processes cost the host's memory, in MB (defaults until a run measured them)."""

    process_mb: float = 320.0
    """A worker process's own memory with no participant (torch's import)."""
    participant_mb: float = 0.6
    """Each simulated participant's own memory (its threads' stacks, clients, state)."""
    shared_mb: float = 400.0
    """File-backed pages every worker maps (torch's libraries): paid once."""

    def need_mb(self, n: int, per_process: int) -> float:
        return (worker_processes(n, per_process) * self.process_mb + n * self.participant_mb + self.shared_mb
                + STORE_AND_DRIVER_MB)

    @classmethod
    def measured(cls, single_pid: int, bulk: list[tuple[int, int]]) -> WorkerMemory:
        """From live workers: `single_pid` simulates one participant; `bulk` is (pid, participants) of the others."""
        own = status_mb(single_pid, "RssAnon")
        per = [(status_mb(pid, "RssAnon") - own) / max(count - 1, 1) for pid, count in bulk if count > 1]
        return cls(process_mb=own, participant_mb=max(max(per, default=0.0), 0.1),
                   shared_mb=status_mb(single_pid, "RssFile"))


def worker_processes(n: int, per_process: int = PER_PROCESS[0]) -> int:
    """How many processes simulate `n` participants: the leader's, the bulk's, the two victims'."""
    return 3 + math.ceil((n - 3) / per_process)


@dataclass(frozen=True)
class Machine:
    """What the host can give a simulation."""

    available_mb: float
    free_tasks: int
    open_files: int
    cores: int

    @classmethod
    def now(cls) -> Machine:
        # the store's open-file limit: ftcoord-store raises its soft limit to the hard one
        return cls(available_mb(), free_tasks(), open_files_limit(), os.cpu_count() or 1)


def per_process(n: int, memory: WorkerMemory, machine: Machine,
                participant_cores: float = PARTICIPANT_CORES, measured_at: int | None = None,
                participants: str = "threads") -> int:
    """The participants per bulk process for `n` (the fewest that fit), or DoesNotFit.

    `participant_cores`: what one simulated participant keeps busy at steady state (measured at `measured_at`
    participants, when a smaller size ran first); `participants`: how they run (CPU_SHARE)."""
    busy, share = n * participant_cores, CPU_SHARE[participants]
    if busy > share * machine.cores:
        source = f"measured at {measured_at}" if measured_at else "this machine's usual"
        raise DoesNotFit(
            f"{n} participants would keep ~{busy:.1f} of this machine's {machine.cores} cores busy at steady state "
            f"alone ({participant_cores * 1000:.2f} ms of CPU per participant per second, {source}), more than the "
            f"{share:.0%} they may take as {participants} (the store, the leader and the advances need the rest; past "
            f"it, heartbeats are late and every figure measures the machine, not the protocol): run this size on a "
            f"machine with more cores, or leave it out of --sizes")
    return layout(n, memory, machine)


def layout(n: int, memory: WorkerMemory, machine: Machine) -> int:
    """The participants per bulk process for `n` (the fewest that fit the store's descriptors, the kernel's threads
    and the memory), or DoesNotFit; the steady state's CPU aside (per_process checks it first): the floor of a size
    too busy to simulate is laid out as the size would have been (chaos.scale.bench)."""
    connections = n * CONNECTIONS_PER_PARTICIPANT + 64  # the driver's, the store's own
    if connections > machine.open_files:
        raise DoesNotFit(
            f"{n} participants need ~{connections} connections to the store ({CONNECTIONS_PER_PARTICIPANT} each) "
            f"but a process may open {machine.open_files} files here (ulimit -Hn): raise the hard limit "
            f"(LimitNOFILE=, /etc/security/limits.conf), or leave {n} out of --sizes")
    tasks = n * THREADS_PER_PARTICIPANT
    if tasks > machine.free_tasks:
        raise DoesNotFit(
            f"{n} participants need ~{tasks} threads ({THREADS_PER_PARTICIPANT} each) but the kernel allows "
            f"{machine.free_tasks} more on this machine (kernel.pid_max, kernel.threads-max): raise them with "
            f"sysctl, or leave {n} out of --sizes")
    for count in PER_PROCESS:
        if memory.need_mb(n, count) <= HEADROOM * machine.available_mb:
            return count
    most = PER_PROCESS[-1]
    raise DoesNotFit(
        f"{n} participants need ~{memory.need_mb(n, most) / 1024:.1f} GiB even at {most} per process "
        f"({worker_processes(n, most)} worker processes x {memory.process_mb:.0f} MB of their own, "
        f"{memory.participant_mb:.1f} MB per participant, {memory.shared_mb:.0f} MB shared, plus the store) but "
        f"{machine.available_mb / 1024:.1f} GiB is available: run this size on a machine with more memory, or "
        f"leave it out of --sizes")


def freeze_startup_objects() -> None:
    """Take what a worker process made at start (torch's import: ~200,000 objects; its participants or clients)
    out of the garbage collector's full collections, once it started: call it then.

    Every worker allocates alike, so their full collections come due together; each walks every object in its
    process holding the interpreter's lock, and their participants stand still meanwhile. A real rank collects on
    its own host, with one participant's threads waiting, not sixty-four; frozen, a full collection here walks only
    what was made since (`gc.freeze`)."""
    gc.collect()
    gc.freeze()


def status_mb(pid: int, field: str) -> float:
    """A memory field of /proc/<pid>/status (VmRSS, RssAnon, RssFile), in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return round(int(line.split()[1]) / 1024, 1)
    return math.nan


def available_mb() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    return math.inf


def free_tasks() -> int:
    """How many more threads the kernel lets the host start (pid_max and threads-max, less those running)."""
    limits = []
    for name in ("pid_max", "threads-max"):
        try:
            limits.append(int(Path(f"/proc/sys/kernel/{name}").read_text()))
        except (OSError, ValueError):
            pass
    try:
        running = int(Path("/proc/loadavg").read_text().split()[3].split("/")[1])
    except (OSError, ValueError, IndexError):
        running = 0
    return (min(limits) if limits else 1 << 22) - running
