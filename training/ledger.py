"""The step ledger: one JSON line per committed step per rank (what the verifier reads).

Fields of a "step" line:
  kind="step", job, generation, rank, slot, world_size, step (0-based global step that was
  committed), epoch, cursor (step within the epoch), window_hash (sha1 prefix of the global
  window's sample ids), shard_hash, shard_count, shard_ids (this rank's sample ids), loss
  (this rank's shard loss), lr, mono/ts (monotonic and wall clock), pid.
Other kinds: "generation" (a generation started here, with how it healed), "checkpoint"
(a save and its stall), "final" (the parameter digest when the run completed), "stopped".
Lines are written with one write() each, so a SIGKILL loses no committed line.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any


class Ledger:
    def __init__(self, directory: str | Path | None, job_id: str, slot: int) -> None:
        self.job_id = job_id
        self.slot = slot
        self._file = None
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
        self._file.write(json.dumps(record, separators=(",", ":")) + "\n")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def read_ledgers(directory: str | Path) -> list[dict[str, Any]]:
    """Every ledger line under a directory (recursively), in time order."""
    records = []
    for path in sorted(Path(directory).rglob("ledger-*.jsonl")):
        for line in path.read_text().splitlines():
            if line.endswith("}"):
                records.append(json.loads(line))
    return sorted(records, key=lambda r: r["mono"])
