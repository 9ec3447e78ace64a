"""The store server of one chaos run, and the faults aimed at it (store-restart, store-hang).

A run whose scenario faults the store runs it as its own process (`ftcoord-store`), so it can be SIGKILLed,
started again empty on the same port, or SIGSTOPped like any server; other runs keep it in the runner. Each of its
servers counts its lives in the run's state file, as a deployed `ftcoord-store` does.

A restart's outage is the fault's `duration` and then the new server's own start (Python and torch: seconds, more
than a short outage asks for): each outage is timed to the new server's ready line, and the run's report says how
long the store was away, not only how long was asked (`Outage.note`).
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from chaos.own_code import start_worker
from ftcoord import StoreProcess, StoreServer
from ftcoord.host.reap import wait_killed
from ftcoord.log import get_logger
from ftcoord.store.server import state_arguments

HOST = "127.0.0.1"


@dataclass
class Outage:
    """One store-restart: killed at `killed_at` (monotonic), a new server asked for `down_s` later, serving at
    `serving_at` (None until its ready line came)."""

    down_s: float
    killed_at: float
    started_at: float | None = None
    serving_at: float | None = None

    @property
    def away_s(self) -> float | None:
        """Kill to the new server's ready line; None until it came."""
        return None if self.serving_at is None else self.serving_at - self.killed_at

    @property
    def start_s(self) -> float | None:
        """The new server's own start, spawn to ready line; None until it came."""
        return None if self.serving_at is None or self.started_at is None else self.serving_at - self.started_at

    def note(self) -> str:
        """The fault's note in the run's report: how long the store was away, of which how long it was asked."""
        if self.away_s is None or self.start_s is None:
            return f"store down {self.down_s}s asked; no new server answered before the run ended"
        return (f"store away {self.away_s:.2f}s ({self.down_s}s down, then {self.start_s:.2f}s for the new server "
                "to start)")


class RunStore:
    """One run's store: in this process, or a separate one that faults can reach.

    Args:
        separate: run it as its own process (a scenario that faults the store).
        state_file: where a separate server counts its lives (ftcoord.store.boot); None: it keeps no count.
        host: the address it listens on (a network run's: chaos.run.network.STORE_HOST).
    """

    def __init__(self, separate: bool, state_file: Path | None = None, host: str = HOST) -> None:
        self.host = host
        self._server: StoreServer | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._state_file = state_file
        self._log = get_logger(component="chaos_store")
        if separate:
            started = StoreProcess.start(host, 0, state_file=state_file)
            self._process = started.process  # type: ignore[assignment]
            self.address = started.address
        else:
            self._server = StoreServer(host, 0)
            self.address = self._server.address
        self.port = int(self.address.rsplit(":", 1)[1])
        self.restarts = 0
        self.outages: list[Outage] = []
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
        killed = time.monotonic()
        self._restart_due = killed + down_s
        self.outages.append(Outage(down_s, killed))
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
        outage = self.outages[-1]
        outage.started_at = time.monotonic()
        self._process = start_worker("ftcoord.store.main", ["--host", self.host, "--port", str(self.port), "--quiet",
                                                            *state_arguments(self._state_file)],
                                     stdout=subprocess.PIPE)
        self.restarts += 1
        self._log.warning("store_started_again", pid=self._process.pid, port=self.port, restarts=self.restarts)
        threading.Thread(target=self._await_ready, args=(self._process, outage), daemon=True,
                         name="chaos-store-ready").start()

    def _await_ready(self, process: subprocess.Popen[bytes], outage: Outage) -> None:
        """Time the new server's ready line (ftcoord-store prints it once it serves), then drain its stdout."""
        assert process.stdout is not None
        if process.stdout.readline():
            outage.serving_at = time.monotonic()
            self._log.info("store_serving_again", pid=process.pid, away_s=round(outage.away_s or 0.0, 3),
                           start_s=round(outage.start_s or 0.0, 3))
        for _ in process.stdout:
            pass

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
