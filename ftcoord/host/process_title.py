"""A process's title, as `ps` and `top` show it: which job and slot a training process holds.

Every process forked from a launcher's warm standby starts with the standby's command line; the title tells
them apart. The title keeps the command the process runs, after the job and slot.
"""

from __future__ import annotations

import os
import sys

import setproctitle


def rank_title(job_id: str, slot: int) -> str:
    """`ftcoord <job> slot <slot>: <interpreter> <the script's argv>`.

    Args:
        job_id: the job the process belongs to.
        slot: the slot it holds.
    """
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    command = ["-m", spec.name.removesuffix(".__main__"), *sys.argv[1:]] if spec is not None else sys.argv
    return f"ftcoord {job_id} slot {slot}: {' '.join([os.path.basename(sys.executable), *command])}"


def set_title(title: str) -> None:
    """Set this process's title (its command line in `ps`, its name in `top`).

    Args:
        title: the new title; long ones are cut to what the process's original command line had room for.
    """
    setproctitle.setproctitle(title)
