"""An Event for greenlets whose timed wait ends without an exception: chaos.scale.worker_events' `threading.Event`.

gevent's Event ends a wait that times out by throwing a Timeout exception into the waiting greenlet and catching it
there (gevent.timeout.Timeout._on_expiration), which costs more CPU than a wait that a timer wakes. A
thread's timed wait that runs out (a futex's timeout) throws nothing. A simulated participant waits out a timeout
several times a second at steady state (its heartbeat, its leader duty's looks, its trainer's steps), so in
`chaos bench --scale --participants events` the exceptions would be a cost of the simulation, not of ftcoord,
taking cores from the store and the leader that a real job's hosts would not share.
"""

from __future__ import annotations

import gevent.event
from gevent.hub import Waiter, get_hub


class TimedEvent(gevent.event.Event):
    """gevent's Event (the one monkey patching makes `threading.Event`), but a timed wait is woken by a timer, the
    way `gevent.sleep` is, not ended by a Timeout thrown in. Returns what `threading.Event.wait` returns: whether
    the flag is set."""

    def wait(self, timeout: float | None = None) -> bool:
        if timeout is None or self.is_set():
            return bool(super().wait(timeout))
        if timeout <= 0:
            return False
        hub = get_hub()
        waiter = Waiter(hub)
        wake = waiter.switch  # one bound method: rawlink and unlink must be given the same
        timer = hub.loop.timer(timeout)
        self.rawlink(wake)  # called with this event once it is set
        # From now, not from the loop's idea of now: that is the time the loop last ran, which a greenlet busy since
        # (an import, a long computation) left behind; a timer counted from it can run out at once.
        # gevent's own Timeout updates it too.
        timer.start(wake, None, update=True)
        try:
            waiter.get()
        finally:
            timer.close()
            self.unlink(wake)
        return self.is_set()
