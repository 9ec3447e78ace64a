"""In-process participants joining a generation together, as separate processes would."""

from __future__ import annotations

import threading

from ftcoord.wrapper.participant import Participant


def join_together(*members: Participant, timeout: float = 10.0) -> None:
    """Every one joins the next generation at once, each in a thread; waits up to `timeout` for each thread."""
    threads = [threading.Thread(target=p.join, args=(0,), daemon=True) for p in members]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
