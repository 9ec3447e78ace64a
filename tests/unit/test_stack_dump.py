"""A fenced process writes its stacks before the kill (ftcoord.host.stack_dump): real processes, real signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ftcoord.host import stack_dump
from ftcoord.host.process_state import stopped
from tests.helpers.cluster import REPO
from tests.helpers.wait import wait_until

pytestmark = pytest.mark.timeout(60)

FROZEN = """
import re, sys, threading, time
from ftcoord.host import stack_dump
stack_dump.install(sys.argv[1], 5)

def beat_forever():
    while True:
        time.sleep(0.01)

def frozen_here():
    print("frozen", flush=True)
    re.match(r"(a+)+$", "a" * 64 + "b")  # catastrophic backtracking: holds the GIL, every other thread stands

threading.Thread(target=beat_forever, name="heartbeat-like", daemon=True).start()
frozen_here()
"""


def _start(code: str, *args: str) -> subprocess.Popen[str]:
    process = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONPATH": str(REPO)})
    assert process.stdout is not None
    assert process.stdout.readline().strip() in ("frozen", "plain"), "the child did not start"
    return process


def _end(process: subprocess.Popen[str]) -> None:
    process.kill()
    process.wait(10)


def test_a_process_frozen_holding_the_gil_writes_every_stack_before_the_kill(tmp_path: Path) -> None:
    """Its Python code runs no more (no heartbeat, no log: ftcoord.liveness.still_stack cannot see it); faulthandler's
    handler,
    C without the GIL, still writes where each thread stands."""
    process = _start(FROZEN, str(tmp_path))
    try:
        path = stack_dump.dump_path(tmp_path, 5, process.pid)
        started = time.monotonic()
        assert stack_dump.dump(process.pid, path) == "dumped"
        assert time.monotonic() - started < stack_dump.DUMP_WAIT_S + 0.1
        assert process.poll() is None, "the dump ended the process"
        text = path.read_text()
        assert "in frozen_here" in text and "in beat_forever" in text, text
    finally:
        _end(process)


def test_a_stopped_process_or_one_without_the_handler_is_not_sent_the_signal(tmp_path: Path) -> None:
    """A SIGSTOPped process runs no handler: not waited for. One that never installed it (not a Wrapper's rank) would
    take the signal's default action, the end of the process: it is not sent."""
    plain = _start("import time\nprint('plain', flush=True)\ntime.sleep(60)\n")
    frozen = _start(FROZEN, str(tmp_path))
    try:
        assert stack_dump.dump(plain.pid, None) == "not_installed"
        with pytest.raises(subprocess.TimeoutExpired):  # a signal sent would end it at once
            plain.wait(0.2)
        os.kill(frozen.pid, signal.SIGSTOP)
        wait_until(lambda: stopped(frozen.pid), 10, "the process stopped")
        started = time.monotonic()
        assert stack_dump.dump(frozen.pid, stack_dump.dump_path(tmp_path, 5, frozen.pid)) == "stopped"
        assert time.monotonic() - started < 0.05
    finally:
        _end(plain)
        _end(frozen)
