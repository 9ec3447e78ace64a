"""Deliberate training bugs, for the verifier's mutation tests only.

A verifier is only as good as the bugs it has been seen to catch. `FTCOORD_PLANTED_BUG` names
one of these; it is unset everywhere except in those tests, and then nothing here runs (the
loop tests one attribute per step).

  double-step-after-resume: the first optimizer step of every generation that starts from a
      resumed state (start step > 0) is applied twice, on every rank, so the ranks still agree
      with each other and the ledger looks perfect: only a check of the model can see it.
"""

from __future__ import annotations

import os

from training.errors import TrainingConfigError

PLANTED_BUG_ENV = "FTCOORD_PLANTED_BUG"
DOUBLE_STEP_AFTER_RESUME = "double-step-after-resume"
BUGS = (DOUBLE_STEP_AFTER_RESUME,)


def planted_bug() -> str | None:
    """The bug this process must plant, or None (the normal case)."""
    name = os.environ.get(PLANTED_BUG_ENV) or None
    if name is not None and name not in BUGS:
        raise TrainingConfigError(f"{PLANTED_BUG_ENV}={name!r} is not a known planted bug; one of {list(BUGS)}")
    return name
