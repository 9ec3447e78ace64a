"""Whole-job restarts across launchers (`--restart-policy job`): one counter in the store.

The classic baseline restarts every process of the job when one dies. A launcher owns only its node's processes,
so the one that saw the death asks (an `add` to keys.JOB_RESTARTS) and restarts its own; every other launcher reads
the counter every FENCE_POLL_S and, finding it past the restarts it carried out, restarts its own too. They follow
long before the new processes of the launcher that asked come up (new interpreters: seconds), so no member's
state survives to heal the others, as in the classic restart. Two launchers that see deaths at once may both ask:
one restart too many, never one missing. A launcher that finds a restart asked and not carried out yet carries out
that one rather than asking again. The counter of an earlier run of the job (a relaunch) is not followed.
"""

from __future__ import annotations

import torch.distributed as dist

from ftcoord.config import FENCE_POLL_S
from ftcoord.protocol import keys
from ftcoord.store.client import get_or_none, raise_to


class JobRestarts:
    """This launcher's view of the job's restarts: how many it carried out, and whether another launcher asked
    for one more."""

    def __init__(self, store: dist.Store) -> None:
        self._store = store
        self.carried_out = asked(store)  # an earlier run's are not ours to follow
        self._due = 0.0

    def ask(self) -> tuple[int, bool]:
        """A process of this node died: the number of the restart to carry out, and whether this launcher asked
        for it (False: another launcher asked first, and this one had not carried it out yet)."""
        number = asked(self._store)
        if number > self.carried_out:
            self.carried_out = number
            return number, False
        # compare_set, not add: a request retried through a store hang must not ask for two restarts
        wanted = str(number + 1)
        found = self._store.compare_set(keys.JOB_RESTARTS, str(number) if number else "", wanted).decode()
        self.carried_out = int(found)
        return self.carried_out, found == wanted

    def asked_elsewhere(self, now: float) -> int | None:
        """The number of a restart another launcher asked for and this one has not carried out (read every
        FENCE_POLL_S of the monotonic `now`; None between reads and when there is none)."""
        if now < self._due:
            return None
        self._due = now + FENCE_POLL_S
        number = asked(self._store)
        if number <= self.carried_out:
            return None
        self.carried_out = number
        return number

    def rebuild(self, store: dist.Store) -> None:
        """The store came back empty: the count of restarts is not lowered (a launcher that asks next would
        otherwise ask for a number the others have carried out already, and they would not follow)."""
        if self.carried_out:
            raise_to(store, keys.JOB_RESTARTS, self.carried_out)


def asked(store: dist.Store) -> int:
    """How many whole-job restarts were asked in this job (read without creating the count: a job that never
    restarted leaves no key of it)."""
    return int(get_or_none(store, keys.JOB_RESTARTS) or 0)
