"""Following a run while it happens: ledger tailing and the live terminal display."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO


@dataclass
class LedgerTail:
    """Reads new ledger lines as ranks append them (without re-reading whole files)."""

    directory: Path
    offsets: dict[Path, int] = field(default_factory=dict)
    step: int = -1
    """The highest committed step (0-based) seen so far."""
    generation: int = 0
    world_size: int = 0
    pid_of_slot: dict[int, int] = field(default_factory=dict)
    generation_at: list[tuple[float, int]] = field(default_factory=list)
    """(mono, generation) of every step line, to know what ran when a fault hit."""
    _pid_seen_at: dict[int, float] = field(default_factory=dict)
    members_of: dict[int, list[int]] = field(default_factory=dict)
    """generation -> its members (slots in rank order), from the ranks' generation lines."""

    def _read_new(self, path: Path) -> list[bytes]:
        offset = self.offsets.get(path, 0)
        with path.open("rb") as f:
            f.seek(offset)
            chunk = f.read()
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self.offsets[path] = offset + len(complete)
        return complete.splitlines()

    def poll(self) -> list[dict[str, Any]]:
        new: list[dict[str, Any]] = []
        for path in sorted(self.directory.glob("ledger-*.jsonl")):
            new += [json.loads(line) for line in self._read_new(path)]
        for path in sorted(self.directory.glob("launcher*.jsonl")):
            # The launcher names each slot's new process at once, before it trains (or logs) anything.
            for line in self._read_new(path):
                if b'"child_started"' in line:
                    event = json.loads(line)
                    self._saw_pid(event["slot"], event["pid"], event["mono"])
        for record in sorted(new, key=lambda r: r["mono"]):
            self._saw_pid(record["slot"], record["pid"], record["mono"])
            if record["kind"] == "generation":
                self.members_of[record["generation"]] = list(record["members"])
            if record["kind"] == "step":
                self.step = max(self.step, record["step"])
                if record["generation"] >= self.generation:
                    self.generation, self.world_size = record["generation"], record["world_size"]
                self.generation_at.append((record["mono"], record["generation"]))
        return new

    def _saw_pid(self, slot: int, pid: int, mono: float) -> None:
        """The newest process seen for a slot (a dead one's late lines do not bring it back)."""
        if mono >= self._pid_seen_at.get(slot, float("-inf")):
            self.pid_of_slot[slot] = pid
            self._pid_seen_at[slot] = mono

    def slot_of_rank(self, rank: int) -> int | None:
        """The slot holding `rank` in the newest generation that has started."""
        if not self.members_of:
            return None
        members = self.members_of[max(self.members_of)]
        return members[rank] if rank < len(members) else None

    def is_member(self, slot: int) -> bool | None:
        """Whether `slot` trains in the newest generation (None before any started)."""
        return slot in self.members_of[max(self.members_of)] if self.members_of else None

    def committed(self) -> int:
        return self.step + 1

    def generation_before(self, mono: float) -> int:
        running = 0
        for when, generation in self.generation_at:
            if when <= mono:
                running = max(running, generation)
        return running


class ProgressDisplay:
    """One status line: rewritten in place on a terminal, printed every few seconds otherwise."""

    def __init__(self, title: str, steps: int, faults: int, stream: TextIO | None = None, quiet: bool = False) -> None:
        self.title, self.steps, self.faults = title, steps, faults
        self.stream = stream or sys.stderr
        self.quiet = quiet
        self.started = time.monotonic()
        self._last_print = 0.0
        self._tty = self.stream.isatty()

    def update(self, tail: LedgerTail, faults_done: int, note: str = "") -> None:
        if self.quiet:
            return
        now = time.monotonic()
        if not self._tty and now - self._last_print < 5.0:
            return
        self._last_print = now
        done = tail.committed()
        elapsed = now - self.started
        eta = f"{elapsed / done * (self.steps - done):4.0f}s" if done > 0 else "   ?"
        width = 24
        filled = int(width * done / self.steps) if self.steps else width
        bar = "#" * filled + "-" * (width - filled)
        line = (f"{self.title} [{bar}] step {done}/{self.steps}  gen {tail.generation}  world {tail.world_size}  "
                f"faults {faults_done}/{self.faults}  {elapsed:5.1f}s  ETA {eta} {note}")
        if self._tty:
            self.stream.write("\r" + line[:160].ljust(160))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self._tty and not self.quiet:
            self.stream.write("\n")
            self.stream.flush()
