"""The store link's watchdog: a store call left unanswered is cut, unless the store is slow rather than hung.

A TCPStore call to a server that stopped answering (SIGSTOP, a frozen host) blocks past every timeout of TCPStore's
own, so every call of a StoreLink (ftcoord.store.link) is watched. A call is cut (its sockets shut down, which
fails it, and the link reconnects) when it is overdue, `op_timeout` beyond its own wait, *and* the store has
answered nothing of this process for op_timeout: a hung store is silent, a slow one is not. A slow store (a long
queue: a burst of thousands of clients, a host starved of CPU) must not be cut, or every process reconnects at once
to a store that is already behind. Its call is looked at again when the silence could reach op_timeout, and cut
anyway SLOW_LIMIT op_timeouts beyond its own wait (its connection may be stuck on its own).
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections.abc import Callable
from typing import Any

from ftcoord.host import group_sockets

SLOW_LIMIT = 3
"""A call the store is slow to answer, while it answers this process's others, is cut after this many op_timeouts
beyond its own wait."""
UNANSWERED_OPS = ("set", "append")
"""TCPStore waits for no reply to these (ftcoord.store.link._REQUESTS): that they returned proves nothing."""


class _Watched:
    """One call: cut at `due` (its deadline; later while the store answers this process, up to `limit`)."""

    __slots__ = ("started", "deadline", "limit", "sockets", "before", "due")

    def __init__(self, started: float, deadline: float, limit: float, sockets: dict[int, str] | None,
                 before: dict[int, str]) -> None:
        self.started, self.deadline, self.limit, self.sockets, self.before = started, deadline, limit, sockets, before
        self.due = deadline


class CallWatch:
    """Watches one process's store calls (a thread of its own, which sleeps until a call may be overdue).

    Every store call of the process is watched and unwatched, so both are a dict's single operation, with no lock
    (atomic under the interpreter lock: a token from itertools.count, an insertion, a pop); the thread reads a copy
    of the watched calls (a list made in one operation), never the dict while others change it.

    Args:
        op_timeout: how long a call may go unanswered beyond its own wait, in seconds (Timing.store_op_timeout).
        closed: set when the link closes; the thread ends then.
        sockets_since: `sockets_since(before)`: the sockets to the store opened since `before` (a connection being
            made has no sockets of its own yet).
        log: the structlog logger that gets `store_call_slow` and `store_call_unanswered`.
    """

    def __init__(self, op_timeout: float, closed: threading.Event,
                 sockets_since: Callable[[dict[int, str]], dict[int, str]], log: Any) -> None:
        self.op_timeout = op_timeout
        self.answered_at = -math.inf
        """When the store last answered a call of this process (monotonic)."""
        self._closed = closed
        self._sockets_since = sockets_since
        self._log = log
        self._watched: dict[int, _Watched] = {}
        self._tokens = itertools.count(1)
        self._thread = threading.Thread(target=self._run, name="ftcoord-store-watch", daemon=True)

    def start(self) -> None:
        """Start the watching thread."""
        self._thread.start()

    def watch(self, seconds: float, sockets: dict[int, str] | None, before: dict[int, str]) -> int:
        """Watch a call: after `seconds` (the call's own wait plus op_timeout), once the store is silent, its
        sockets (or, for a connection being made, every socket to the store opened since `before`) are shut down,
        and the call fails. A token for `unwatch`."""
        now = time.monotonic()
        token = next(self._tokens)
        self._watched[token] = _Watched(now, now + seconds, now + seconds + (SLOW_LIMIT - 1) * self.op_timeout,
                                        sockets, before)
        return token

    def unwatch(self, token: int) -> None:
        """The call of `token` returned (or failed): it is not cut."""
        self._watched.pop(token, None)

    def answered(self) -> None:
        """The store answered a call of this process just now."""
        self.answered_at = time.monotonic()

    def until_due(self) -> float:
        """How long the thread may sleep: until the earliest time a call it watches may be cut, op_timeout when it
        watches none. Every call is watched for at least op_timeout from its start, so one that starts during the
        sleep is never due before the sleep ends: the thread wakes only when a call may be overdue, not every second
        (a thread per process, at scale)."""
        earliest = min((watched.due for watched in list(self._watched.values())), default=None)
        if earliest is None:
            return self.op_timeout
        return min(self.op_timeout, max(0.0, earliest - time.monotonic()))

    def _run(self) -> None:
        while not self._closed.wait(self.until_due()):
            now, heard = time.monotonic(), self.answered_at
            slow: list[_Watched] = []
            overdue: list[_Watched] = []
            for token, watched in list(self._watched.items()):
                if watched.due > now:
                    continue
                if now - heard < self.op_timeout and now < watched.limit:  # slow, not silent: look again
                    if watched.due == watched.deadline:
                        slow.append(watched)  # said once per call
                    watched.due = min(heard + self.op_timeout, watched.limit)
                    continue
                if self._watched.pop(token, None) is not None:  # else it returned meanwhile: nothing to cut
                    overdue.append(watched)
            for watched in slow:
                self._log.warning("store_call_slow", waited_s=round(now - watched.started, 3),
                                  answered_s_ago=round(now - heard, 3), op_timeout_s=self.op_timeout)
            for watched in overdue:
                sockets = watched.sockets if watched.sockets is not None else self._sockets_since(watched.before)
                cut = group_sockets.shut_down(dict(sockets))
                self._log.warning("store_call_unanswered", op_timeout_s=self.op_timeout, sockets_shut=cut,
                                  waited_s=round(now - watched.started, 3),
                                  silent_s=round(now - heard, 3) if heard > -math.inf else None)
