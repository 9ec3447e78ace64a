"""The jobs on a store, and what an observer needs to know about each (`ftcoord status`, metrics).

Every job lists itself once in the store's index, the one key outside any job's prefix (every process
tries when it registers; the first to set the job's `listed` key appends). Launchers do not: a
job whose command line its processes refuse never registers, and leaves no trace in the index.

A job's `info` holds the timing its first process ran with (so an observer knows how long a live
heartbeat can be silent); `first_commit`, the wall time of its first committed step (display only:
the effective-training-time ratio; nothing decides on it).
"""

from __future__ import annotations

import json
import secrets
import time
from typing import Any

import torch.distributed as dist

from ftcoord.config import Timing
from ftcoord.protocol import keys
from ftcoord.store.client import get_or_none

INDEX = "ftcoord-index/jobs"
"""Append-only "job,job,..." of every job that ever ran on this store."""
FIRST_COMMIT = "first_commit"
"""Wall time (time.time()) of the job's first committed step, set once."""


def list_job(base: dist.Store, job: dist.Store, job_id: str) -> None:
    """Put the job in the store's index (once, whoever comes first: a retried request finds its own token)."""
    token = secrets.token_hex(8)
    if job.compare_set(keys.LISTED, "", token).decode() == token:
        base.append(INDEX, f"{job_id},")


def describe(job: dist.Store, timing: Timing) -> None:
    """Say how the job's heartbeats are timed (the first process to start decides; all share it)."""
    info = {"heartbeat_interval": timing.heartbeat_interval, "heartbeat_timeout": timing.heartbeat_timeout,
            "started_unix": round(time.time(), 3)}
    job.compare_set(keys.INFO, "", json.dumps(info, separators=(",", ":")))


def note_first_commit(job: dist.Store) -> None:
    """Set FIRST_COMMIT to now, unless a process of the job set it already."""
    job.compare_set(FIRST_COMMIT, "", f"{time.time():.3f}")


def listed(base: dist.Store) -> list[str]:
    """Every job on the store, in the order they first ran."""
    raw = get_or_none(base, INDEX)
    return list(dict.fromkeys(j for j in (raw or b"").decode().split(",") if j))


def info(job: dist.Store) -> dict[str, Any]:
    """The job's `info` (its heartbeat timing, when it started) and `first_commit_unix` (None before a first commit)."""
    raw = get_or_none(job, keys.INFO)
    found: dict[str, Any] = json.loads(raw) if raw else {}
    first = get_or_none(job, FIRST_COMMIT)
    found["first_commit_unix"] = float(first) if first else None
    return found
