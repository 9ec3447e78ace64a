"""The store server of one chaos run, and the faults aimed at it (store-restart, store-hang).

A run whose scenario faults the store runs it as its own process (`ftcoord-store`), so it can be SIGKILLed,
started again empty on the same port, or SIGSTOPped like any server; other runs keep it in the runner.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from ftcoord import StoreProcess, StoreServer
from ftcoord.log import get_logger
from ftcoord.reap import wait_killed

HOST = "127.0.0.1"


class RunStore:
    """One run's store: in this process, or a separate one that faults can reach."""

    def __init__(self, separate: bool) -> None:
        self._server: StoreServer | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._log = get_logger(component="chaos_store")
        if separate:
            started = StoreProcess.start(HOST, 0)
            self._process = started.process  # type: ignore[assignment]
            self.address = started.address
        else:
            self._server = StoreServer(HOST, 0)
            self.address = self._server.address
        self.port = int(self.address.rsplit(":", 1)[1])
        self.restarts = 0
        self._restart_due: float | None = None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def restarting(self) -> bool:
        """Killed, and its successor not started yet (`tick` starts it)."""
        return self._restart_due is not None

    def kill(self, down_s: float) -> int | None:
        """SIGKILL the server; a new, empty one starts on the same port `down_s` seconds from now (`tick`)."""
        assert self._process is not None, "store faults need the store in its own process"
        pid = self._process.pid
        self._process.kill()
        wait_killed(self._process)
        self._restart_due = time.monotonic() + down_s
        self._log.warning("store_killed", pid=pid, down_s=down_s)
        return pid

    def signal(self, signum: signal.Signals) -> int | None:
        assert self._process is not None, "store faults need the store in its own process"
        self._process.send_signal(signum)
        return self._process.pid

    def tick(self, now: float) -> None:
        """Start the new server once a restart is due (it binds its port first, then serves: clients that
        connect meanwhile wait in the listen queue)."""
        if self._restart_due is None or now < self._restart_due:
            return
        self._restart_due = None
        self._process = subprocess.Popen([sys.executable, "-m", "ftcoord.store_main", "--host", HOST,
                                          "--port", str(self.port), "--quiet"], stdout=subprocess.DEVNULL)
        self.restarts += 1
        self._log.warning("store_started_again", pid=self._process.pid, port=self.port, restarts=self.restarts)

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
        if self._process is not None and self._process.poll() is None:
            self._process.send_signal(signal.SIGCONT)
            self._process.terminate()
            try:
                self._process.wait(10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                wait_killed(self._process)
