"""`python -m chaos.scale.worker_events`: chaos.scale.worker's simulated participants, on one event loop per process.

What `chaos bench --scale --participants events` runs for the bulk of its participants (the leader and the two
kill victims stay processes of threads). Each participant is ftcoord's own code, unchanged, its threads greenlets
(gevent's monkey patching) and every store client chaos.scale.wire_store's. It saves the host's CPU, not the
protocol's: a greenlet switched to costs less than a thread woken by the kernel. What it changes: a greenlet that
computes holds its whole process up, a heartbeat waits behind its process's other participants, and a straggler's
report shows no stacks (the interpreter sees one thread). Timed waits throw no exception when they run out
(chaos.scale.timed_event), and the kernel may fire timers a little late so that one wake-up serves several
(coalesce_timers).
"""

from gevent import monkey

monkey.patch_all()  # before anything imports threading, socket or time's users

import ctypes  # noqa: E402
import socket  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402

import gevent  # noqa: E402
from gevent.hub import Waiter  # noqa: E402

from chaos.scale.timed_event import TimedEvent  # noqa: E402

threading.Event = TimedEvent  # type: ignore[misc]  # timed waits that run out throw nothing (chaos.scale.timed_event)

from gevent.fileobject import FileObjectPosix  # noqa: E402

from chaos.scale import floor, worker  # noqa: E402
from chaos.scale.wire_store import WireStore  # noqa: E402
from ftcoord.config import Timing  # noqa: E402
from ftcoord.store.address import StoreAddress  # noqa: E402
from ftcoord.store.link import StoreLink  # noqa: E402

# a floor client's connection (torch's, in the floor's threads: ftcoord.store.client.connect's deadline)
_CONNECT_S = 30.0
_PR_SET_TIMERSLACK = 29  # linux/prctl.h
TIMER_SLACK_S = 0.05
"""The most the kernel may fire a participant's timer late, in seconds (a fifth of a tick at most: coalesce_timers)."""


def coalesce_timers(timing: Timing) -> None:
    """Let the kernel fire this process's timers up to TIMER_SLACK_S late (prctl's timer slack; Linux's default is 50
    us), or a fifth of the participants' tick if that is less (on Linux: nothing elsewhere).

    A worker of 128 participants has ~400 timers due a second at the default timing (each participant's heartbeat,
    its looks at the leader, its trainer's steps), at moments spread at random: at the default slack nearly each is
    a wake-up of its own, a context switch and a pass of the event loop for one greenlet. A host's participant wakes
    for its own timers alone. With the slack, one wake-up serves the timers due within it, or comes with a socket's.
    Nothing in a participant waits for a timer to hear of a change (a store's answer, an event set: they wake it at
    once); a timer paces it (a beat, a look), and 50 ms is a tenth of the default heartbeat interval and a hundredth
    of its timeout; the participants whose timing the bench measures (the leader, the kills' victims) are processes of
    threads, without it."""
    if not sys.platform.startswith("linux"):
        return
    slack_ns = round(min(TIMER_SLACK_S, timing.tick / 5) * 1e9)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_TIMERSLACK, ctypes.c_ulong(slack_ns), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl(PR_SET_TIMERSLACK, {slack_ns}) failed")


_OS_SOCKET = monkey.get_original("socket", "socket")
_READ, _WRITE = 1, 2  # libev's EV_READ, EV_WRITE


class LoopWaits:
    """chaos.scale.wire_store's waits for one connection on this process's event loop: the operating system's socket,
    non-blocking, and a watcher each for reading and writing. A wait ends when its watcher or its timer fires, with no
    exception thrown (chaos.scale.timed_event, for the same reason). A connection cut from another greenlet (its socket
    shut down: ftcoord.store.link, the call watch) wakes its reader, which then reads the end."""

    def __init__(self, cooperative: socket.socket) -> None:
        self.sock = _OS_SOCKET(fileno=cooperative.detach())  # the same descriptor: the link's cuts find it
        self.sock.setblocking(False)
        self._hub = gevent.get_hub()
        self._reading = self._hub.loop.io(self.sock.fileno(), _READ)
        self._writing = self._hub.loop.io(self.sock.fileno(), _WRITE)

    def readable(self, timeout: float | None) -> bool:
        if timeout is None:
            self._hub.wait(self._reading)
            return True
        waiter = Waiter(self._hub)
        timer = self._hub.loop.timer(max(timeout, 0.0))
        self._reading.start(waiter.switch, True)
        timer.start(waiter.switch, False, update=True)
        try:
            return bool(waiter.get())
        finally:
            self._reading.stop()
            timer.close()

    def writable(self) -> None:
        self._hub.wait(self._writing)


def wire_on_loop(address: StoreAddress, timeout: float) -> WireStore:
    """A participant's store client: chaos.scale.wire_store's, waited on by this process's event loop (LoopWaits)."""
    return WireStore.connect(address, timeout, LoopWaits)


def main(argv: list[str] | None = None) -> int:
    """Simulated participants (chaos.scale.worker's arguments); after "floor", the floor's bare clients
    (chaos.scale.floor's)."""
    argv = sys.argv[1:] if argv is None else argv
    # The driver's pipes, read and written without blocking the loop (a full pipe would stop every participant).
    sys.stdin = FileObjectPosix(sys.stdin.fileno(), "r", close=False)
    sys.stdout = FileObjectPosix(sys.stdout.fileno(), "w", close=False)
    if argv[:1] == ["floor"]:
        return floor.worker(argv[1:],
                                  client=lambda address: wire_on_loop(StoreAddress.parse(address), _CONNECT_S))
    StoreLink.open_client = staticmethod(wire_on_loop)
    return worker.main(argv, prepare=coalesce_timers)


if __name__ == "__main__":
    raise SystemExit(main())
