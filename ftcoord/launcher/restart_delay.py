"""How long a launcher waits before it starts a slot's next process.

At once after a fault: a process that came up (it registered in the store) and then died, was killed or was
fenced is replaced immediately, however many faults its slot had before, so a slot's tenth recovery is as fast
as its first (the leader waits for a replacement on its way, so a delay here would stall every member). Only a
slot whose processes keep dying before they come up (a broken node, an import error, a device that is not there)
backs off, 0.25 s doubling up to 5 s from its second such death on, so it does not spin; `--max-restarts` ends it.
"""

from __future__ import annotations

import tenacity

_BACKOFF = tenacity.wait_exponential(multiplier=0.25, max=5.0)


class RestartDelay:
    """One slot's count of processes in a row that died before they came up, and the delay it asks for."""

    def __init__(self) -> None:
        self.young_deaths = 0

    def after(self, came_up: bool) -> float:
        """Seconds to wait before the next process, once one died (`came_up`: it had registered)."""
        if came_up:
            self.young_deaths = 0
            return 0.0
        self.young_deaths += 1
        if self.young_deaths == 1:
            return 0.0
        state = tenacity.RetryCallState(None, None, (), {})
        state.attempt_number = self.young_deaths - 1
        return float(_BACKOFF(state))
