"""The launcher's warm standby, kept: one template process (ftcoord.launcher.standby_template) alive and warm.

While the job runs it forks each slot's process in milliseconds. The launcher starts it before it imports torch
itself (ftcoord.launcher.main), so that the standby's import (torch, the command's modules) and the launcher's run
side by side, not one after the other: this module, and what it imports, stays torch-free.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ftcoord.host.process_state import stopped
from ftcoord.launcher.config import LaunchConfig
from ftcoord.launcher.standby_client import ForkedProcess, ForkFailed, PendingFork, WarmStandby
from ftcoord.launcher.standby_template import PythonCommand
from ftcoord.protocol import launcher_report

STANDBY_WAIT_S = 60.0  # how long a start waits for a warming standby before it starts a new interpreter


def standby_wanted(config: LaunchConfig) -> bool:
    """A launcher keeps a warm standby when asked to (--warm-standby, the default) and it can serve the command
    (`python -m MOD` or `python FILE.py`), except for the whole-job restart baseline, which starts every process
    afresh."""
    return bool(config.warm_standby and PythonCommand.parse(config.command)) and config.restart_policy != "job"


class StandbyKeeper:
    """Starts the standby, restarts it when it died, says when it is ready, asks it for forks."""

    def __init__(self, command: list[str], enabled: bool, log: object) -> None:
        self._command = command
        self.enabled = enabled
        self._log = log
        self.standby: WarmStandby | None = None
        self._forks: dict[int, PendingFork] = {}
        self._started: float | None = None

    def refresh(self, env: dict[str, str], on_ready: Callable[[], None]) -> None:
        """Keep one warm standby (`env`: the job's environment), started again when it died (`start`); call
        `on_ready` when it became ready."""
        if not self.enabled:
            return
        log = self._log
        if self.standby is not None and not self.standby.alive:
            log.warning("standby_died", pid=self.standby.process.pid, code=self.standby.process.returncode)
            self.standby = None  # not closed: what it forked trains on, and its lifeline stays open with this launcher
        self.start(env)
        assert self.standby is not None
        was_ready = self.standby.ready
        self.standby.pump()
        if self.standby.ready and not was_ready:
            on_ready()
            log.info("standby_ready", pid=self.standby.process.pid, preloaded=self.standby.refused is None,
                     warmup_s=round(time.monotonic() - (self._started or 0.0), 3))
            if self.standby.refused is not None:
                log.warning("standby_preload_refused", reason=self.standby.refused,
                            why="the command's module refused its command line; its processes will say why")

    def start(self, env: dict[str, str]) -> None:
        """Start a standby with `env` when there is none; it warms up on its own (`refresh` says when it is ready).

        The first one warms up at normal priority: the node's ranks are forked from it, nothing else runs yet. One
        started again later (the first died) warms up niced, beside training."""
        if not self.enabled or self.standby is not None:
            return
        first = self._started is None
        self.standby = WarmStandby.start(self._command, env, niced=not first)
        self._started = time.monotonic()
        self._log.info("standby_started", pid=self.standby.process.pid, niced=not first)

    def warming(self) -> bool:
        """The standby is alive, not ready yet, has not taken longer than STANDBY_WAIT_S, and is not stopped (a
        stopped one warms no further: a start waited for it up to STANDBY_WAIT_S)."""
        return (self.standby is not None and self.standby.alive and not self.standby.ready
                and self._started is not None and time.monotonic() - self._started < STANDBY_WAIT_S
                and not stopped(self.standby.process.pid))

    def ready(self) -> bool:
        """The standby is alive and warm: it forks what it is asked for."""
        return self.standby is not None and self.standby.ready and self.standby.alive

    def ask(self, key: int, env: dict[str, str]) -> bool:
        """Ask the ready standby for a process with `env` added, collected under `key` (a slot) at later ticks
        (collect); False when none is ready."""
        pending = self.standby.request_fork(env) if self.standby is not None else None
        if pending is not None:
            self._forks[key] = pending
        return pending is not None

    def forking(self, key: int) -> bool:
        """A process asked for under `key` is on its way."""
        return key in self._forks

    def collect(self, key: int) -> ForkedProcess | None:
        """The process asked for under `key`, once forked; None while on its way. Raises ForkFailed when none will
        come (ftcoord.launcher.standby_client.PendingFork.collect)."""
        try:
            forked = self._forks[key].collect()
        except ForkFailed:
            del self._forks[key]
            raise
        if forked is not None:
            del self._forks[key]
        return forked

    def abandon_forks(self) -> None:
        """Collect none of the processes on their way (the launcher stops, or starts every process afresh): the
        standby forks nothing for them, or they are killed."""
        for pending in self._forks.values():
            pending.abandon()
        self._forks.clear()

    def sleep(self, timeout: float) -> None:
        """Sleep `timeout`; less when a process is on its way and the standby answers sooner."""
        if self._forks and self.standby is not None:
            self.standby.wait_answer(timeout)
        else:
            time.sleep(timeout)

    def state(self) -> str:
        """For the launcher's report (ftcoord.protocol.launcher_report)."""
        standby = self.standby
        return launcher_report.standby_state(self.enabled, standby is not None and standby.alive,
                                             standby is not None and standby.ready)

    def release(self, timeout: float = 10.0) -> None:
        """Let the standby go (killed after `timeout`: 0 for a launcher that gives up before it started anything)."""
        self.abandon_forks()
        if self.standby is not None:
            self.standby.close(timeout)
            self.standby = None
