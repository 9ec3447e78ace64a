"""Every wait after a kill is bounded (ftcoord.host.reap)."""

from __future__ import annotations

import subprocess
import time

from ftcoord.host.reap import wait_killed


def test_a_process_that_does_not_exit_is_waited_for_a_bounded_time(capfd) -> None:  # noqa: ANN001
    process = subprocess.Popen(["sleep", "30"])  # stands in for one in uninterruptible sleep: not exiting
    try:
        started = time.monotonic()
        assert wait_killed(process, timeout=0.3) is None
        assert time.monotonic() - started < 2.0
        assert f"process {process.pid} did not exit" in capfd.readouterr().err
    finally:
        process.kill()
    assert wait_killed(process) == -9
