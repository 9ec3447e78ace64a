"""One slot of a launcher's node (ftcoord.launcher.supervisor): its process, its restarts, its replacement.

A launcher says a replacement is coming *before* the death is known (a fenced process not yet reaped, an exit not
yet marked) and keeps saying it (`keys.replacing`, a beat every REPLACING_BEAT_S) until the replacement registers.
The leader waits for a replacement while this beat moves (up to barrier_timeout): a cold start on a busy node can
take many seconds, and deciding without it would shrink the world and grow it back a moment later. A launcher that
dies or gives up stops beating, and so does one whose replacement is stopped (SIGSTOP) before it registered
(ftcoord.host.process_state): the leader stops waiting one heartbeat timeout later. Continued, that replacement
grows the job back.
"""

from __future__ import annotations

import subprocess
from collections import Counter
from dataclasses import dataclass, field

import torch.distributed as dist

from ftcoord.host.process_state import stopped
from ftcoord.launcher.restart_delay import RestartDelay
from ftcoord.launcher.standby_client import ForkedProcess
from ftcoord.protocol import keys
from ftcoord.protocol.launcher_report import Exit
from ftcoord.store.client import read_int

REPLACING_BEAT_S = 0.1  # how often a launcher repeats that a replacement is on its way


@dataclass
class SlotProcess:
    """The process currently holding a slot on this node."""

    slot: int
    local_rank: int
    process: subprocess.Popen[bytes] | ForkedProcess | None = None
    incarnation: int = 0  # the incarnation the process gets when it registers
    restarts: int = 0
    restart_kinds: Counter[str] = field(default_factory=Counter)
    """Restarts by what ended the process before (ftcoord.protocol.launcher_report.RESTART_KINDS)."""
    restart_due: float | None = None
    forking_incarnation: int = 0
    """The incarnation of its process asked of the standby and not collected yet: read before the request, as that
    process may register before the launcher collects it."""
    from_standby: bool = False
    finished: bool = False
    fence_killed: bool = False
    last_exit: Exit | None = None
    """How its last process ended (published in its launcher report)."""
    fence_ignored: bytes = b""
    """A fence of a deposed leader's term, not carried out (see Supervisor._fence)."""
    replacing: int = 0
    """The incarnation announced as on its way (keys.replacing) until it registers; 0 when none."""
    replacing_beat: int = 0
    replacing_beat_at: float = 0.0
    delay: RestartDelay = field(default_factory=RestartDelay)
    """Before its next process: at once after a fault, backing off only while its processes die before they
    come up (ftcoord.launcher.restart_delay)."""

    def replacement_coming(self, store: dist.Store, registered: int) -> None:
        """Say that incarnation `registered` + 1 is on its way (see the module docstring)."""
        if self.replacing != registered + 1:
            self.replacing, self.replacing_beat = registered + 1, 0
            store.set(keys.replacing(self.slot), f"{self.replacing}:0")

    def beat_replacement(self, store: dist.Store, now: float) -> None:
        """Say again that the replacement is on its way (every REPLACING_BEAT_S), until it registers."""
        if not self.replacing or now - self.replacing_beat_at < REPLACING_BEAT_S:
            return
        if self.process is not None and stopped(self.process.pid):
            return
        if read_int(store, keys.incarnation(self.slot)) >= self.replacing:
            self.replacing = 0  # it registered: its own heartbeat speaks for it now
            return
        self.replacing_beat += 1
        self.replacing_beat_at = now
        store.set(keys.replacing(self.slot), f"{self.replacing}:{self.replacing_beat}")
