"""The simulated participants' worker processes of one `chaos bench --scale` size, seen from the driver.

A Swarm starts them (chaos.scale.worker, or chaos.scale.worker_events for the bulk with `--participants events`),
reads what they say (who joined which generation and when, their full collections, their problems), asks them for
their store requests and their stragglers' stacks, measures their CPU and memory, and SIGKILLs the kills' victims.

The store and every worker process each run in a session of their own (the driver stays in the caller's), so
the kernel's scheduler (autogroups) shares the cores between them as between hosts, not between threads: the
store's one thread must not be one among thousands, left unscheduled whenever an advance wakes the participants.
A worker writes its events from a thread of its own, so a driver that reads late holds no participant up.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from chaos.own_code import start_worker
from chaos.scale.layout import WorkerMemory
from ftcoord.config import Timing

PARTICIPANTS = {"threads": "chaos.scale.worker", "events": "chaos.scale.worker_events"}
"""How the bulk's participants run (--participants): each a process's threads, or greenlets of one event loop per
process (chaos.scale.worker_events). The leader and the two kill victims run as threads either way."""


@dataclass
class Worker:
    process: subprocess.Popen[str]
    first: int
    count: int
    events: queue.Queue[dict[str, Any]] = field(default_factory=queue.Queue)
    client: str = ""
    """How its participants' links open store clients, as it said once started."""


class Swarm:
    """The worker processes of one size, and what they say."""

    def __init__(self, address: str, job: str, n: int, log: TextIO, step_s: float, per_process: int,
                 participants: str = "threads", timing: Timing | None = None) -> None:
        self.n = n
        self.joined: dict[int, dict[int, float]] = defaultdict(dict)  # generation -> slot -> when
        self.worlds: dict[int, int] = {}
        self.problems: list[str] = []
        self.incarnations: dict[int, int] = {}
        self._lock = threading.Lock()
        self._counts: queue.Queue[dict[str, Any]] = queue.Queue()
        self._stacks: queue.Queue[dict[str, Any]] = queue.Queue()
        self.collections: list[tuple[float, float, int]] = []  # workers' full collections: (when, seconds, worker)
        self.started = 0
        self.workers: list[Worker] = []
        self.killed: set[int] = set()  # slots this driver SIGKILLed
        timing = timing or Timing()
        arguments = ["--store", address, "--job", job, "--target", str(n), "--step-s", str(step_s),
                     "--heartbeat-interval", str(timing.heartbeat_interval),
                     "--heartbeat-timeout", str(timing.heartbeat_timeout)]
        command = ["chaos.scale.worker", *arguments]
        bulk_command = [PARTICIPANTS[participants], *arguments]
        # Slot 0 gets a process of its own and starts first: it leads, as a rank on a host of its own would (not
        # sharing an interpreter with dozens of simulated participants). The last two slots each get a process
        # of their own too, started last (so neither leads): the kills' victims. The bulk runs at the same CPU
        # priority: a lower one starves its participants, which then straggle in every re-form.
        try:
            self._spawn(command, 0, 1, log)
            self.wait_for(lambda: self.started == 1, 60, "the first participant to start")
            bulk = [(first, min(per_process, n - 2 - first)) for first in range(1, n - 2, per_process)]
            for first, count in bulk:
                self._spawn(bulk_command, first, count, log)
            self.wait_for(lambda: self.started == 1 + len(bulk), 60 + n / 4, f"{n - 2} participants to start")
            for first in (n - 2, n - 1):
                self._spawn(command, first, 1, log)
        except BaseException:
            self.close()  # no worker outlives a swarm that could not start
            raise

    def _spawn(self, command: list[str], first: int, count: int, log: TextIO) -> None:
        """A worker: `command` is its module and arguments (chaos.own_code.start_worker)."""
        process = start_worker(command[0], command[1:] + ["--first", str(first), "--count", str(count)],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, bufsize=1,
                               start_new_session=True, text=True)
        worker = Worker(process, first, count)
        self.workers.append(worker)
        threading.Thread(target=self._read, args=(worker,), daemon=True).start()

    def _read(self, worker: Worker) -> None:
        assert worker.process.stdout is not None
        for line in worker.process.stdout:
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            kind = event["event"]
            with self._lock:
                if kind == "joined":
                    self.joined[event["generation"]][event["slot"]] = event["t"]
                    self.worlds[event["generation"]] = event["world"]
                elif kind == "started":
                    self.started += 1
                    worker.client = event.get("client", "")
                    self.incarnations.update({int(s): i for s, i in event["incarnations"].items()})
                elif kind == "collected":
                    self.collections.append((event["t"], event["s"], worker.first))
                elif kind in ("left", "helper_failed"):
                    self.problems.append(f"slot {event['slot']}: {kind}: {event['reason']}")
            if kind == "counts":
                self._counts.put(event)
            elif kind == "stacks":
                self._stacks.put(event)

    def wait_for(self, condition: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                if condition():
                    return
            died = [w for w in self.workers if w.process.poll() is not None and w.first not in self.killed]
            if died:  # never waited out: a worker that died takes its participants with it
                raise RuntimeError(f"{what}: the worker process of slots {died[0].first}-"
                                   f"{died[0].first + died[0].count - 1} exited with {died[0].process.returncode} "
                                   f"({len(died)} worker(s) in all); its error is in workers.log")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: not within {timeout:.0f}s ({len(self.problems)} problems: "
                                   f"{self.problems[:3]})")
            time.sleep(0.01)

    def everyone_in(self, after: int, slots: set[int]) -> int | None:
        """The newest generation after `after` that every slot of `slots` joined, with exactly them."""
        for generation in sorted(self.joined, reverse=True):
            if generation > after and set(self.joined[generation]) >= slots and self.worlds[generation] == len(slots):
                return generation
        return None

    def collections_since(self, t0: float) -> list[tuple[float, float, int]]:
        """The workers' full collections since `t0`: (seconds after t0, how long, the worker's first slot)."""
        with self._lock:
            return [(round(t - t0, 3), s, first) for t, s, first in self.collections if t >= t0]

    def worker_of(self, slot: int) -> int:
        """The first slot of the worker that simulates `slot`."""
        return next(w.first for w in self.workers if w.first <= slot < w.first + w.count)

    def stragglers(self, after: int, slots: set[int]) -> list[int]:
        """The slots of `slots` that joined no generation after `after` yet."""
        with self._lock:
            joined = set().union(*(set(s) for g, s in self.joined.items() if g > after))
        return sorted(slots - joined)

    def stacks(self, slots: list[int]) -> dict[str, Any]:
        """Where the named participants' threads are now (by thread name), from their workers."""
        asked = 0
        for worker in self.workers:
            mine = [s for s in slots if worker.first <= s < worker.first + worker.count]
            if mine and worker.process.poll() is None and worker.process.stdin is not None:
                worker.process.stdin.write("stacks " + " ".join(map(str, mine)) + "\n")
                worker.process.stdin.flush()
                asked += 1
        found: dict[str, Any] = {}
        for _ in range(asked):
            try:
                event = self._stacks.get(timeout=30)
            except queue.Empty:
                break
            found.update(event["threads"])
            found.update({f"state-{slot}": state for slot, state in event["state"].items()})
        return found

    def counts(self) -> tuple[Counter[str], float | None]:
        """Store requests by role/op over all workers, and the leader duty's CPU seconds (scale_worker.leader_cpu)."""
        live = [w for w in self.workers if w.process.poll() is None]
        for worker in live:
            assert worker.process.stdin is not None
            worker.process.stdin.write("counts\n")
            worker.process.stdin.flush()
        total: Counter[str] = Counter()
        leader_cpu = None
        for _ in live:
            event = self._counts.get(timeout=60)
            total.update(event["requests"])
            if event["leader_cpu_s"] is not None:
                leader_cpu = event["leader_cpu_s"]
        return total, leader_cpu

    def cpu_s(self) -> float:
        """CPU seconds the live worker processes used (the simulated participants' own cost, on the host)."""
        total = 0.0
        for worker in self.workers:
            try:
                total += process_cpu_s(worker.process.pid)
            except OSError:
                pass
        return total

    def memory(self) -> WorkerMemory:
        """What these workers cost the host's memory (the leader's process simulates one participant)."""
        return WorkerMemory.measured(self.workers[0].process.pid,
                                     [(w.process.pid, w.count) for w in self.workers if w.count > 1])

    def kill(self, slot: int) -> None:
        worker = next(w for w in self.workers if w.first == slot and w.count == 1)
        self.killed.add(slot)
        worker.process.send_signal(signal.SIGKILL)
        worker.process.wait()

    def close(self) -> None:
        for worker in self.workers:
            if worker.process.poll() is None and worker.process.stdin is not None:
                try:
                    worker.process.stdin.write("stop\n")
                    worker.process.stdin.flush()
                except OSError:
                    pass
        for worker in self.workers:
            try:
                worker.process.wait(10)
            except subprocess.TimeoutExpired:
                worker.process.kill()
                worker.process.wait()


def process_cpu_s(pid: int) -> float:
    """CPU seconds a process has used (user and system), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
