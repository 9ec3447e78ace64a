"""The overlapped strategy's writer process: file I/O only, no torch.

Reads from stdin: a JSON header line {"step", "world_size", "config_hash", "size"} then
`size` bytes of payload; commits each with the atomic protocol and answers one JSON line on stdout:
{"step", "ok": true, "write_s"}, or {"step", "ok": false, "path", "errno", "error", "free_bytes"} when
the disk refused it (nothing of it is left there). EOF in the middle of a payload (the trainer died)
means that save never happened: nothing is committed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from training.checkpoint import atomic
from training.hooks import load_write_hooks


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--root", required=True)
    parser.add_argument("--keep", type=int, required=True)
    parser.add_argument("--strategy", default="overlapped")
    parser.add_argument("--hook", action="append", default=[], help="MODULE:FACTORY (training.hooks)")
    args = parser.parse_args()
    hooks = load_write_hooks(args.hook)
    stdin, stdout = sys.stdin.buffer, sys.stdout
    while True:
        header_line = stdin.readline()
        if not header_line:
            return 0
        header = json.loads(header_line)
        payload = stdin.read(header["size"])
        if len(payload) != header["size"]:
            return 0  # the trainer died mid-transfer: this save never happened
        started = time.perf_counter()
        try:
            atomic.commit(Path(args.root), header["step"], payload, world_size=header["world_size"],
                          config_hash=header["config_hash"], strategy=args.strategy, keep=args.keep, hooks=hooks)
            reply = {"step": header["step"], "write_s": time.perf_counter() - started, "ok": True}
        except OSError as exc:
            reply = {"step": header["step"], "ok": False, **atomic.describe_failure(Path(args.root), exc)}
        stdout.write(json.dumps(reply) + "\n")
        stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
