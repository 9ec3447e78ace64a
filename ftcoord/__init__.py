"""ftcoord: fault-tolerant coordination for PyTorch data-parallel training."""

from ftcoord.call import CallWrapper, GenerationInterrupted
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
from ftcoord.heartbeat import mark_dead
from ftcoord.participant import Participant
from ftcoord.record import GenerationRecord
from ftcoord.server import StoreProcess, StoreServer
from ftcoord.store import StoreAddress, connect, job_store
from ftcoord.wrapper import RestartsExhausted, Wrapper

__all__ = [
    "CallWrapper",
    "GenerationInterrupted",
    "RestartsExhausted",
    "Wrapper",
    "ConfigError",
    "FatalError",
    "FtcoordError",
    "JobFailed",
    "GenerationRecord",
    "JobFinished",
    "Participant",
    "PortInUse",
    "QuorumPolicy",
    "QuorumTimeout",
    "StoreAddress",
    "StoreProcess",
    "StoreServer",
    "StoreUnavailable",
    "Timing",
    "connect",
    "job_store",
    "mark_dead",
]
