"""Where a still training thread stands: its stack, logged once, before the leader can fence it.

A rank whose training thread stands still for progress_timeout, not waiting on its peers, is fenced as hung and its
launcher SIGKILLs it at once, leaving nothing to ask where it was. So the heartbeat thread logs that thread's stack
once it stood still for half the progress timeout without waiting on its peers (the fence follows the timeout within
a beat, and the stack must be in the log before the kill): `training_thread_still`, with `at` (the innermost frame),
`stack`, and `thread` (the kernel's view: in its stack, a thread stuck in native code looks like one computing
there); `ftcoord status` shows `at` until the thread moves. Once per stillness. A thread that waits on its peers, in
a collective or in ftcoord's join or finish (`waits_on_peers`, which the leader's culprit rule reads too), logs none.
"""

from __future__ import annotations

import math
import os
import time
import traceback
from collections.abc import Callable
from types import FrameType

from structlog.typing import FilteringBoundLogger

from ftcoord.host.process_state import thread_state

WAITING_MODULES = ("/torch/distributed/", "/torch/autograd/", "/torch/nn/parallel/", "/torch/cuda/")
"""Where a training thread sits while it waits for its peers in a collective: among its innermost frames. Under NCCL
a collective returns at once and the wait lands on a device synchronisation (torch.cuda.synchronize, as in
CallWrapper.wait_for_device): a rank waiting there is waiting on its peers."""
WAITING_DEPTH = 4
"""How many of the innermost frames are looked at for those: a collective's call is within the first few."""
JOINING_MODULE = "/ftcoord/wrapper/generation_client.py"
"""ftcoord's join of a generation, and its finish (waiting for the others to finish): anywhere in the stack, as the
store's wait is several frames below it (ftcoord.store.client, ftcoord.store.link) and no user code runs under it."""
STACK_FRAMES = 40
"""The innermost frames logged: enough for a training loop inside a framework's, bounded for the log line."""


def waits_on_peers(frame: FrameType | None) -> bool:
    """Is a thread whose innermost frame is `frame` waiting on its peers: in a collective (torch.distributed,
    autograd, DDP) or in ftcoord's join or finish?

    When one rank is stuck, its peers block in their next collective and stop pinging too; this tells the leader
    which of the still ranks is the culprit. The join is looked for anywhere in the stack (JOINING_MODULE): its wait
    is in the store client, frames below it, so a spare waiting for its generation, or a member that finished and
    waits for the others, is not taken for a stuck one.
    """
    depth = 0
    while frame is not None:
        name = frame.f_code.co_filename.replace("\\", "/")
        if JOINING_MODULE in name or (depth < WAITING_DEPTH and any(part in name for part in WAITING_MODULES)):
            return True
        frame, depth = frame.f_back, depth + 1
    return False


def where(frame: FrameType) -> str:
    """`path:line in function` of a frame."""
    return f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"


class StillStack:
    """Logs a still training thread's stack once per stillness, once it stood still for `after` seconds (half the
    progress timeout; math.inf: never) without waiting on its peers.

    A stillness starts when the thread last moved: a ping, or a generation joined (a thread stuck in its first step
    after a join, before any ping, is still from the join). It is looked at once, however long it lasts: a thread
    that waits in a join or a collective for minutes (a spare; every participant of `chaos bench --scale`) costs one
    snapshot of the process's frames, not one a beat."""

    def __init__(self, after: float, log: FilteringBoundLogger, clock: Callable[[], float] = time.monotonic) -> None:
        self.after = after
        self._log = log
        self._clock = clock
        self._since = clock()
        self._looked = False
        self.at: str | None = None
        """Where the thread stood when logged, until it moves (`ftcoord status` shows it: SlotReport.still_at)."""

    @classmethod
    def for_progress_timeout(cls, progress_timeout: float, log: FilteringBoundLogger) -> StillStack:
        return cls(progress_timeout / 2 if math.isfinite(progress_timeout) else math.inf, log)

    def moved(self) -> None:
        """The training thread moved (a ping, a join): its stillness starts again."""
        self._since, self._looked, self.at = self._clock(), False, None

    def due(self) -> bool:
        """Has the thread stood still `after` seconds, and this stillness not been looked at yet?"""
        return not self._looked and self._clock() - self._since >= self.after

    def look(self, frame: FrameType | None, step: int, native_id: int | None = None) -> None:
        """Log where the thread whose innermost frame is `frame` (`threading.get_native_id()`: `native_id`) stands,
        unless it waits on its peers."""
        self._looked = True
        if frame is None or waits_on_peers(frame):
            return
        stack = traceback.StackSummary.extract(traceback.walk_stack(frame), limit=STACK_FRAMES)
        stack.reverse()  # outermost first, as a traceback prints it
        self.at = where(frame)
        self._log.warning("training_thread_still", still_s=round(self._clock() - self._since, 3), step=step,
                          at=self.at, stack="".join(stack.format()).rstrip("\n"), thread=_kernels_view(native_id),
                          why="no progress (call.ping) and not waiting on its peers; the leader fences it once "
                              "it stood still for progress_timeout")


def _kernels_view(native_id: int | None) -> str | None:
    """`ThreadState.line()` of this process's thread `native_id`; None when unknown."""
    state = thread_state(os.getpid(), native_id) if native_id is not None else None
    return state.line() if state is not None else None
