"""The step ledger: one JSON line per committed step per rank (what the verifier reads).

A "step" line holds kind="step", job, generation, rank, slot, world_size, step (the 0-based global step committed),
epoch, cursor (step within the epoch), window_hash (sha1 prefix of the global window's sample ids), shard_hash,
shard_count, shard_ids (this rank's sample ids), loss (this rank's shard loss), lr, mono/ts (monotonic and wall
clock) and pid. Other kinds: "generation" (a generation started here, with how it healed), "checkpoint" (a save and
its stall), "final" (the parameter digest when the run completed), "stopped". Lines are written with one write()
each, so a SIGKILL loses no committed line; only a death inside that write leaves a torn last line, and
`scan_ledgers` reports any torn line (the verifier decides whether a death explains it).
"""

from __future__ import annotations

import fnmatch
import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class Ledger:
    def __init__(self, directory: str | Path | None, job_id: str, slot: int) -> None:
        self.job_id = job_id
        self.slot = slot
        self._file = None
        self._lock = threading.Lock()  # checkpoint lines come from background threads when durable
        self.directory: Path | None = None
        if directory is not None:
            path = self.directory = Path(directory)
            path.mkdir(parents=True, exist_ok=True)
            self.path = path / f"ledger-slot{slot}-{os.getpid()}.jsonl"
            self._file = self.path.open("a", buffering=1, encoding="utf-8")

    def write(self, kind: str, **facts: Any) -> None:
        if self._file is None:
            return
        record = {"kind": kind, "job": self.job_id, "slot": self.slot, "pid": os.getpid(),
                  "mono": time.monotonic(), "ts": time.time(), **facts}
        with self._lock:
            if self._file is not None:
                self._file.write(json.dumps(record, separators=(",", ":")) + "\n")

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


@dataclass(frozen=True)
class TornLine:
    """A ledger line that is not a complete JSON record."""

    path: Path
    line: int
    """1-based line number."""
    last: bool
    """The file's last line (what a process killed inside its write leaves behind)."""
    pid: int | None
    """The writer's pid, from the file name."""


@dataclass
class LedgerScan:
    records: list[dict[str, Any]] = field(default_factory=list)
    torn: list[TornLine] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)


def files_under(directory: str | Path, pattern: str) -> list[Path]:
    """The files under a directory (recursively) whose names match `pattern`, sorted.

    A run directory is read while the run writes into it: a checkpoint's temporary directory can be
    renamed or removed between listing its parent and opening it, and that is no error (where `rglob` would raise
    FileNotFoundError). A missing directory holds no files, as with `rglob`: the callers judge what
    an empty result means (to the verifier, missing evidence is a failure).
    """
    root = Path(directory)

    def vanished_is_fine(error: OSError) -> None:
        if not isinstance(error, FileNotFoundError):
            raise error

    return sorted(Path(parent) / name
                  for parent, _, names in os.walk(root, onerror=vanished_is_fine)
                  for name in fnmatch.filter(names, pattern))


def scan_ledgers(directory: str | Path) -> LedgerScan:
    """Every ledger line under a directory (recursively), in time order, and every torn line."""
    scan = LedgerScan()
    for path in files_under(directory, "ledger-*.jsonl"):
        scan.files.append(path)
        text = path.read_text(errors="replace")
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()  # the newline that ends the last complete line
        pid_text = path.stem.rsplit("-", 1)[-1]
        for number, line in enumerate(lines, 1):
            try:
                record = json.loads(line)
                complete = isinstance(record, dict) and (number < len(lines) or text.endswith("\n"))
            except ValueError:
                complete = False
            if complete:
                scan.records.append(record)
            else:
                scan.torn.append(TornLine(path, number, number == len(lines),
                                          int(pid_text) if pid_text.isdigit() else None))
    scan.records.sort(key=lambda r: r["mono"])
    return scan


def read_ledgers(directory: str | Path) -> list[dict[str, Any]]:
    """Every complete ledger line under a directory (recursively), in time order."""
    return scan_ledgers(directory).records
