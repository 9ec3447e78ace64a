"""A fenced process writes its stacks before the kill (ftcoord.host.stack_dump): real processes, real signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ftcoord.host import stack_dump
from ftcoord.host.process_state import blocking, stopped
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
        assert time.monotonic() - started < stack_dump.DUMP_WAIT_S + stack_dump.WRITE_WAIT_S
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
        assert time.monotonic() - started < stack_dump.DUMP_WAIT_S  # no signal sent, nothing waited for
    finally:
        _end(plain)
        _end(frozen)


SLOW_TO_DUMP = """
import re, sys, threading, time
from ftcoord.host import stack_dump
stack_dump.install(sys.argv[1], 5)
THREADS, DEPTH = 90, 90  # faulthandler writes at most 100 threads of 100 frames: a dump of some 300 KB
ready = threading.Barrier(THREADS + 1)

def deep(depth):
    if depth:
        return deep(depth - 1)
    ready.wait()
    time.sleep(3600)

for _ in range(THREADS):
    threading.Thread(target=deep, args=(DEPTH,), daemon=True).start()
ready.wait()

def frozen_here():
    print("frozen", flush=True)
    re.match(r"(a+)+$", "a" * 64 + "b")

frozen_here()
"""


def _stall_mid_dump(pid: int, path: Path, seen: dict[str, bool]) -> None:
    """Stop `pid` as soon as its dump has begun, note whether it was still writing, and continue it 0.1 s later."""
    while not (path.exists() and path.stat().st_size > 0):
        pass
    os.kill(pid, signal.SIGSTOP)
    wait_until(lambda: stopped(pid), 10, "the dumping process stopped", poll=0.001)
    seen["mid_dump"] = bool(blocking(pid, stack_dump.DUMP_SIGNAL)) and "in frozen_here" not in path.read_text()
    time.sleep(0.1)  # the planted stall: the handler's thread has no core for 0.1 s
    os.kill(pid, signal.SIGCONT)


def test_a_handler_that_loses_its_core_mid_dump_is_waited_for_to_the_end(tmp_path: Path) -> None:
    """On a busy node the thread writing the stacks may stand still in the middle (here: SIGSTOPped there for 0.1 s).
    A file that stops growing is no sign of the end: the fence waits until the handler returned, so the main thread,
    written last, is in the file."""
    for _attempt in range(5):  # the stop must land mid-dump; a dump done before it proves nothing and is tried again
        process = _start(SLOW_TO_DUMP, str(tmp_path))
        path = stack_dump.dump_path(tmp_path, 5, process.pid)
        seen: dict[str, bool] = {}
        staller = threading.Thread(target=_stall_mid_dump, args=(process.pid, path, seen), daemon=True)
        staller.start()
        try:
            outcome = stack_dump.dump(process.pid, path)
            staller.join(10)
            if not seen.get("mid_dump"):
                continue
            assert outcome == "dumped"
            assert not blocking(process.pid, stack_dump.DUMP_SIGNAL), "the handler was still running"
            text = path.read_text()
            assert "in frozen_here" in text and text.count("in deep") >= 90 * 90, text[-2000:]
            return
        finally:
            _end(process)
    raise AssertionError("in 5 tries the stop never landed while the stacks were being written")
