"""ftcoord: fault-tolerant coordination for PyTorch data-parallel training.

Names are imported on first use (PEP 562): `import ftcoord.arguments` or a command's `--help` does
not pay for importing torch, and a bad command line is answered in a fraction of a second.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_WHERE = {
    "CallWrapper": "ftcoord.wrapper.call", "GenerationInterrupted": "ftcoord.wrapper.call",
    "QuorumPolicy": "ftcoord.config", "Timing": "ftcoord.config",
    "ConfigError": "ftcoord.errors", "FatalError": "ftcoord.errors", "FtcoordError": "ftcoord.errors",
    "JobFailed": "ftcoord.errors", "JobFinished": "ftcoord.errors", "PortInUse": "ftcoord.errors",
    "QuorumTimeout": "ftcoord.errors", "StoreUnavailable": "ftcoord.errors",
    "mark_dead": "ftcoord.liveness.heartbeat",
    "Participant": "ftcoord.wrapper.participant",
    "GenerationRecord": "ftcoord.protocol.record",
    "StoreProcess": "ftcoord.store.server", "StoreServer": "ftcoord.store.server",
    "StoreAddress": "ftcoord.store.address", "connect": "ftcoord.store.client", "job_store": "ftcoord.store.client",
    "RestartsExhausted": "ftcoord.wrapper.decorator", "Wrapper": "ftcoord.wrapper.decorator",
}

__all__ = [
    "CallWrapper", "ConfigError", "FatalError", "FtcoordError", "GenerationInterrupted", "GenerationRecord",
    "JobFailed", "JobFinished", "Participant", "PortInUse", "QuorumPolicy", "QuorumTimeout", "RestartsExhausted",
    "StoreAddress", "StoreProcess", "StoreServer", "StoreUnavailable", "Timing", "Wrapper", "connect", "job_store",
    "mark_dead",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'ftcoord' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:
    from ftcoord.config import QuorumPolicy, Timing
    from ftcoord.errors import (
        ConfigError,
        FatalError,
        FtcoordError,
        JobFailed,
        JobFinished,
        PortInUse,
        QuorumTimeout,
        StoreUnavailable,
    )
    from ftcoord.liveness.heartbeat import mark_dead
    from ftcoord.protocol.record import GenerationRecord
    from ftcoord.store.address import StoreAddress
    from ftcoord.store.client import connect, job_store
    from ftcoord.store.server import StoreProcess, StoreServer
    from ftcoord.wrapper.call import CallWrapper, GenerationInterrupted
    from ftcoord.wrapper.decorator import RestartsExhausted, Wrapper
    from ftcoord.wrapper.participant import Participant
