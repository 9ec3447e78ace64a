"""Events from many processes on one terminal: each is a whole line, whatever the interpreter's buffering."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from tests.helpers.cluster import REPO

EVENTS = 3000
WRITER = f"""
from ftcoord import log
log.configure()
logger = log.get_logger(component="writer", writer=int(__import__("sys").argv[1]))
for n in range({EVENTS}):
    logger.info("event_written", n=n)
"""
LINE = re.compile(r"\[info +\] event_written +component=writer n=(\d+) time=\S+ writer=(\d)")


def test_processes_sharing_an_unbuffered_terminal_write_whole_lines() -> None:
    """Under PYTHONUNBUFFERED=1 print() writes a line and its newline apart, so two ranks' events merged into one
    line (`...world_size=2[info ] generation_joined ...`) and the second never matched."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO)}
    read, write = os.pipe()
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(w)], stderr=write, stdout=subprocess.DEVNULL,
                                env=env) for w in range(2)]
    os.close(write)
    with os.fdopen(read, encoding="utf-8") as pipe:
        lines = pipe.read().splitlines()
    assert [w.wait(60) for w in writers] == [0, 0]
    malformed = [line for line in lines if not LINE.fullmatch(line)]
    assert not malformed, f"{len(malformed)} of {len(lines)} lines are not one whole event: {malformed[:3]}"
    seen = sorted((int(writer), int(n)) for n, writer in (LINE.fullmatch(line).groups() for line in lines))
    assert seen == [(w, n) for w in range(2) for n in range(EVENTS)]
