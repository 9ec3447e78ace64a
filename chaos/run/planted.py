"""Deliberate bugs and faults that chaos plants in a rank, for the verifier's mutation tests.

A verifier is only as good as the bugs it has been seen to catch. These act only through the
training hook `chaos.run.inject:hook`, which only chaos puts on a rank's command line:
`training/` and `ftcoord/` read none of these variables.

  PLANTED_BUG_ENV=double-step-after-resume: the first optimizer step of every generation that
      starts from a resumed state (start step > 0) is applied twice, on every rank, so the ranks
      still agree with each other and the ledger looks perfect: only a check of the model sees it.
  CKPT_CRASH_ENV="kill:MARKER[:MINSTEP]" dies half-way through one checkpoint payload write,
      "stop:MARKER[:MINSTEP]" hangs there (SIGSTOP of itself); the marker file makes it happen once.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from training.errors import TrainingConfigError

PLANTED_BUG_ENV = "FTCOORD_PLANTED_BUG"
CKPT_CRASH_ENV = "FTCOORD_FAULT_CKPT_WRITE"
DOUBLE_STEP_AFTER_RESUME = "double-step-after-resume"
BUGS = (DOUBLE_STEP_AFTER_RESUME,)


def planted_bug() -> str | None:
    """The bug this process must plant, or None (the normal case)."""
    name = os.environ.get(PLANTED_BUG_ENV) or None
    if name is not None and name not in BUGS:
        raise TrainingConfigError(f"{PLANTED_BUG_ENV}={name!r} is not a known planted bug; one of {list(BUGS)}")
    return name


def checkpoint_write_fault(step: int) -> None:
    """Half-way through a checkpoint's payload write: die or stop here once, as CKPT_CRASH_ENV says."""
    action, _, rest = os.environ.get(CKPT_CRASH_ENV, "").partition(":")
    if action not in ("kill", "stop"):
        return
    marker_text, _, min_step = rest.partition(":")
    if min_step and step < int(min_step):
        return
    try:
        fd = os.open(Path(marker_text), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return
    os.write(fd, f"{os.getpid()} {time.monotonic()}".encode())
    os.close(fd)
    if action == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)  # a hang in the middle of a commit
    else:
        os._exit(137)  # a torn write, as a crash would leave it
