"""The launcher names a forked process's incarnation before it asks its standby for it (real store, real standby,
the launcher's own start and fence): the process may register before the launcher collects it."""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path

import pytest

from ftcoord import StoreServer, connect, job_store
from ftcoord.host.reap import wait_killed
from ftcoord.launcher.config import LaunchConfig
from ftcoord.launcher.slot_process import SlotProcess
from ftcoord.launcher.supervisor import Supervisor
from ftcoord.protocol import keys
from ftcoord.protocol.slots import register
from tests.helpers.wait import wait_until

pytestmark = pytest.mark.timeout(60)


def test_a_fork_that_registers_before_it_is_collected_is_the_process_its_fences_name(
        store_server: StoreServer, job_id: str, tmp_path: Path) -> None:
    """A fork takes milliseconds, the launcher collects it at its next tick: a process quick to register (or a launcher
    slow to tick) registers first. Read at the collection, the incarnation would be one too many: the launcher would
    take that process for the next one, and carry out none of its fences (a hung rank left running, its peers
    waiting on it until the collective's timeout)."""
    script = tmp_path / "sleeper.py"
    script.write_text("import time\ntime.sleep(60)\n")
    store = job_store(connect(store_server.address), job_id)
    supervisor = Supervisor(LaunchConfig([sys.executable, str(script)], job_id, store_server.address), store)
    slot = supervisor.slots[0] = SlotProcess(0, 0)
    try:
        wait_until(lambda: supervisor._refresh_standby() or supervisor.standby.ready(), 45, "the standby to warm up")
        supervisor._start(slot)
        assert slot.process is None and supervisor.standby.forking(0), "asked of the standby, collected later"
        assert register(store, 0) == 1  # the forked process registers before its launcher looks again
        wait_until(lambda: supervisor._start(slot) or slot.process is not None, 10, "the fork to be collected")
        assert slot.incarnation == 1
        store.set(keys.fence(0), "1:1")  # the leader fences incarnation 1: this process
        supervisor._fence(time.monotonic())
        assert slot.fence_killed, "the launcher ignored the fence of the process it started"
        wait_until(lambda: slot.process.poll() is not None, 5, "the fenced process to die")
    finally:
        if slot.process is not None and slot.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                slot.process.kill()
                wait_killed(slot.process)
        supervisor.standby.release(timeout=0)
