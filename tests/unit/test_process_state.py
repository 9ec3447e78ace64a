"""ftcoord.host.process_state against real processes: a stopped child is told from a running or sleeping one."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from ftcoord.host.process_state import stopped
from tests.helpers.wait import wait_until

pytestmark = pytest.mark.timeout(20)


def test_a_child_is_stopped_between_sigstop_and_sigcont_only() -> None:
    # a name with a space and a parenthesis: the state is read after the last ")" of /proc/<pid>/stat
    child = subprocess.Popen([sys.executable, "-c", "import time, ctypes; "
                              "ctypes.CDLL(None).prctl(15, b'odd name) x', 0, 0, 0); time.sleep(60)"])
    try:
        wait_until(lambda: "odd name" in open(f"/proc/{child.pid}/stat").read(), 5, "the child to rename itself")
        assert not stopped(child.pid)
        child.send_signal(signal.SIGSTOP)
        wait_until(lambda: stopped(child.pid), 5, "the child to show as stopped")
        child.send_signal(signal.SIGCONT)
        wait_until(lambda: not stopped(child.pid), 5, "the child to run again")
    finally:
        child.kill()
        child.wait()
    assert not stopped(child.pid), "a process that is gone is not stopped"
