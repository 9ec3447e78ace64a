"""Error types of ftcoord. Each message names the value, the limit and what to do."""

from __future__ import annotations


class FtcoordError(Exception):
    """Base class of every error ftcoord raises on purpose."""


class FatalError(FtcoordError):
    """An error no restart can fix (bad configuration, refused checkpoint).

    Raised inside the wrapped function it ends the whole job: every process exits with
    it and launchers do not restart them.
    """


class JobFailed(FatalError):
    """Another process of the job hit a fatal error; its message is carried here."""


class ConfigError(FatalError, ValueError):
    """A setting is out of range or inconsistent with another one."""


class StoreUnavailable(FtcoordError):
    """The TCPStore server could not be reached within the connect deadline."""


class StoreLost(FtcoordError):
    """The store stayed unreachable longer than store_timeout: the job cannot coordinate any more (its
    processes write an emergency checkpoint and exit with EXIT_STORE_LOST)."""


EXIT_STORE_LOST = 75
"""EX_TEMPFAIL: every process and launcher of a job whose store stayed away past store_timeout; relaunch it
once the store is back (it resumes from its last checkpoint)."""


class PortInUse(FtcoordError):
    """The store server cannot listen because the port is taken."""


class QuorumTimeout(FtcoordError):
    """Too few processes joined a generation within barrier_timeout."""


class JobFinished(FtcoordError):
    """The job was marked done while this process was waiting to join."""


class Superseded(FtcoordError):
    """A newer incarnation of this process's slot registered (this one was paused, or partitioned away,
    long enough to be replaced): it must exit, not take part again."""
