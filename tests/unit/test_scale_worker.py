"""chaos.scale.worker: a simulated participant never waits for the bench's driver to read what it says."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from chaos.own_code import start_worker

pytestmark = pytest.mark.timeout(60)

_EMIT_MORE_THAN_A_PIPE_HOLDS = """
import os, sys, threading, time
from chaos.scale import worker as scale_worker
threading.Thread(target=scale_worker._write_events, daemon=True).start()
started = time.monotonic()
for i in range(400):  # ~400 KB: a pipe holds 64 KB
    scale_worker.emit("joined", slot=i, pad="x" * 1000)
print(f"{time.monotonic() - started:.3f}", file=sys.stderr, flush=True)
os._exit(0)  # not the interpreter's exit, which flushes stdout into the full pipe
"""


def test_a_participant_emits_at_once_while_the_driver_reads_nothing() -> None:
    """Seen at 1,024 simulated participants: the driver, starved of CPU, read a worker's pipe late, and trainers
    stood still in a full pipe's write for seconds, their rendezvous and rejoins with them. Emitting is a put on a
    queue; a thread of its own writes. (Written by the caller, this blocks for good after 64 KB: the test times out.)"""
    read_end, write_end = os.pipe()  # nobody reads it
    try:
        process = subprocess.Popen([sys.executable, "-c", _EMIT_MORE_THAN_A_PIPE_HOLDS], stdout=write_end,
                                   stderr=subprocess.PIPE, text=True)
        os.close(write_end)
        try:
            _, err = process.communicate(timeout=45)
        finally:
            process.kill()
        took = float(err.strip().splitlines()[-1])
        assert took < 5.0, err
    finally:
        os.close(read_end)


_EMIT_THEN_STOP = """
import threading
from chaos.scale import worker as scale_worker
writer = threading.Thread(target=scale_worker._write_events)
writer.start()
for i in range(3000):
    scale_worker.emit("joined", slot=i)
scale_worker._OUT.put(None)
writer.join(30)
"""


def test_every_event_reaches_the_driver_whole_and_in_order() -> None:
    """The writer sends what is queued in one write: every line, whole, in the order emitted, up to the end."""
    done = subprocess.run([sys.executable, "-c", _EMIT_THEN_STOP], capture_output=True, text=True, timeout=45)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [json.loads(line)["slot"] for line in lines] == list(range(3000))


@pytest.mark.parametrize(("interval", "slack_ns"), [(None, 50_000_000), (0.05, 5_000_000)], ids=["default", "fast"])
def test_an_event_loop_worker_lets_the_kernel_gather_its_timers_by_a_fifth_of_a_tick_at_most(
        interval: float | None, slack_ns: int) -> None:
    """An event-loop worker's timers (a few hundred due a second: its participants' beats, looks and steps) may fire
    up to 50 ms late, so that one wake-up of the process serves several; a fifth of the participants' tick at most
    (5 ms for a beat every 50 ms). Read from the running worker (/proc: the kernel's own figure)."""
    pytest.importorskip("gevent")
    from ftcoord.store.server import StoreProcess

    server = StoreProcess.start("127.0.0.1", 0)
    timing = [] if interval is None else ["--heartbeat-interval", str(interval), "--heartbeat-timeout",
                                          str(10 * interval)]
    process = start_worker("chaos.scale.worker_events",
                           ["--store", str(server.address), "--job", "slack", "--first", "0", "--count", "2",
                            "--target", "2", *timing], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None and process.stdin is not None
        for line in process.stdout:  # until its participants started (bounded by the test's timeout)
            if json.loads(line)["event"] == "started":
                break
        assert int(Path(f"/proc/{process.pid}/timerslack_ns").read_text()) == slack_ns
        process.stdin.write("stop\n")
        process.stdin.flush()
        process.wait(30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        server.stop()
