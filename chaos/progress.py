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

    def poll(self) -> list[dict[str, Any]]:
        new: list[dict[str, Any]] = []
        for path in sorted(self.directory.glob("ledger-*.jsonl")):
            offset = self.offsets.get(path, 0)
            with path.open("rb") as f:
                f.seek(offset)
                chunk = f.read()
            complete = chunk[: chunk.rfind(b"\n") + 1]
            self.offsets[path] = offset + len(complete)
            for line in complete.splitlines():
                new.append(json.loads(line))
        for record in sorted(new, key=lambda r: r["mono"]):
            self.pid_of_slot[record["slot"]] = record["pid"]
            if record["kind"] == "step":
                self.step = max(self.step, record["step"])
                if record["generation"] >= self.generation:
                    self.generation, self.world_size = record["generation"], record["world_size"]
                self.generation_at.append((record["mono"], record["generation"]))
        return new

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
