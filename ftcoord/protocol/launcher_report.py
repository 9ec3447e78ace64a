"""What a launcher tells observers about the slots it runs (`ftcoord status`, its own metrics).

One JSON value per slot under `slot/<s>/launcher`, written when a process starts and when its warm
standby changes state: the node, the launcher's pid, the slot's restarts by kind, and the standby.
"""

from __future__ import annotations

import json
import os
import signal
import socket
from collections import Counter
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from ftcoord.protocol import keys

if TYPE_CHECKING:  # the launcher starts its warm standby before it imports torch (ftcoord.launcher.main)
    import torch.distributed as dist

RESTART_KINDS = ("fenced", "signal", "exit", "job")
"""Why a slot's process was replaced: the leader fenced it (hung, stalled, a hung outsider) and its
launcher killed it; it died of a signal (SIGKILL, the OOM killer, a segfault); it exited non-zero (an
exception, `sys.exit(1)`); or the whole job was restarted (--restart-policy job)."""


def exit_kind(code: int, fenced: bool) -> str:
    """The RESTART_KINDS entry of a process that exited with `code` (negative: the signal that killed it)."""
    if fenced and code == -signal.SIGKILL:
        return "fenced"
    return "signal" if code < 0 else "exit"


def standby_state(enabled: bool, alive: bool, ready: bool) -> str:
    """The slot's warm standby, in a word: "off", "none" (not running), "warming" or "ready"."""
    if not enabled:
        return "off"
    return "ready" if alive and ready else "warming" if alive else "none"


@dataclass(frozen=True)
class Exit:
    """How a slot's process ended, as its launcher saw it."""

    incarnation: int
    code: int
    """Its exit code; negative: the signal that killed it."""
    kind: str
    """Its RESTART_KINDS entry ("fenced", "signal", "exit")."""

    def describe(self) -> str:
        """In a few words: "died (SIGKILL)", "exited with code 1", "was fenced and killed"."""
        if self.kind == "fenced":
            return "was fenced and killed"
        if self.code < 0:
            try:
                return f"died ({signal.Signals(-self.code).name})"
            except ValueError:
                return f"died (signal {-self.code})"
        return f"exited with code {self.code}"


def publish(store: dist.Store, slot: int, pid: int | None, restarts: Counter[str], standby: str,
            last_exit: Exit | None = None) -> None:
    """Write the slot's report under keys.launcher(slot): this node, this launcher's pid, the slot's process (`pid`),
    its restarts by kind, its standby's state and how its last process ended (the leader names it as the cause of
    the generation change: ftcoord.leader.attribution)."""
    value: dict[str, object] = {"host": socket.gethostname(), "launcher_pid": os.getpid(), "pid": pid,
                                "restarts": {kind: restarts.get(kind, 0) for kind in RESTART_KINDS},
                                "standby": standby}
    if last_exit is not None:
        value["last_exit"] = asdict(last_exit)
    store.set(keys.launcher(slot), json.dumps(value, separators=(",", ":")))


def last_exit(raw: bytes | None, incarnation: int) -> Exit | None:
    """How incarnation `incarnation` of a slot ended, from the slot's report (`raw`, keys.launcher); None when the
    report says nothing of it (no report, another incarnation's exit, a process still running)."""
    if raw is None:
        return None
    try:
        said = json.loads(raw).get("last_exit")
        exit_ = Exit(**said) if said else None
    except (ValueError, TypeError, AttributeError):
        return None
    if exit_ is None or not isinstance(exit_.code, int) or not isinstance(exit_.kind, str):
        return None  # a report this code did not write
    return exit_ if exit_.incarnation == incarnation else None
