"""Environment variables ftcoord reads, in one place.

The launcher sets them for its children; torchrun and SLURM set the fallbacks.
"""

from __future__ import annotations

import os
import sys

from ftcoord.errors import ConfigError

STORE_ENV: str = "FTCOORD_STORE"  # "host:port" of the external TCPStore
JOB_ID_ENV: str = "FTCOORD_JOB_ID"
SLOT_ENV: str = "FTCOORD_SLOT"
WORLD_SIZE_ENV: str = "FTCOORD_WORLD_SIZE"  # target world size of the job
LOG_DIR_ENV: str = "FTCOORD_LOG_DIR"

# Fallbacks set by torchrun / SLURM.
TORCHRUN_RANK_ENV: str = "RANK"
TORCHRUN_WORLD_SIZE_ENV: str = "WORLD_SIZE"
TORCHRUN_MASTER_ADDR_ENV: str = "MASTER_ADDR"
TORCHRUN_MASTER_PORT_ENV: str = "MASTER_PORT"
SLURM_PROCID_ENV: str = "SLURM_PROCID"
SLURM_NTASKS_ENV: str = "SLURM_NTASKS"

DEFAULT_STORE_HOST: str = "127.0.0.1"  # loopback: the store has no authentication
DEFAULT_STORE_PORT: int = 29600
DEFAULT_STORE: str = f"{DEFAULT_STORE_HOST}:{DEFAULT_STORE_PORT}"
DEFAULT_JOB_ID: str = "default"

LOCAL_RANK_ENV: str = "LOCAL_RANK"
TORCHELASTIC_RUN_ID_ENV: str = "TORCHELASTIC_RUN_ID"
SLURM_JOB_ID_ENV: str = "SLURM_JOB_ID"


def _first(*names: str) -> str | None:
    for name in names:
        value = os.environ.get(name)
        if value:
            return value
    return None


def store_from_env() -> str:
    """FTCOORD_STORE, else 127.0.0.1:29600 (ftcoord-store's default)."""
    return _first(STORE_ENV) or DEFAULT_STORE


def job_id_from_env() -> str:
    """FTCOORD_JOB_ID, else torchrun's run id, else SLURM's job id, else "default"."""
    return _first(JOB_ID_ENV, TORCHELASTIC_RUN_ID_ENV, SLURM_JOB_ID_ENV) or DEFAULT_JOB_ID


def _int_from_env(names: tuple[str, ...], default: int, low: int) -> int:
    """The first set variable of `names` as an integer >= low; a clear ConfigError naming it otherwise."""
    for name in names:
        value = os.environ.get(name)
        if value:
            if not value.strip().lstrip("-").isdigit() or int(value) < low:
                raise ConfigError(f"{name}={value!r} must be an integer >= {low} (it is set in this process's "
                                  f"environment; ftcoord-launch sets it for its children)")
            return int(value)
    return default


def slot_from_env() -> int:
    """FTCOORD_SLOT, else RANK (torchrun), else SLURM_PROCID, else 0."""
    return _int_from_env((SLOT_ENV, TORCHRUN_RANK_ENV, SLURM_PROCID_ENV), 0, 0)


def world_size_from_env() -> int:
    """The job's target world size: FTCOORD_WORLD_SIZE, else WORLD_SIZE, else SLURM_NTASKS."""
    return _int_from_env((WORLD_SIZE_ENV, TORCHRUN_WORLD_SIZE_ENV, SLURM_NTASKS_ENV), 1, 1)

LAUNCHER_PID_ENV: str = "FTCOORD_LAUNCHER_PID"


def die_with_launcher() -> None:
    """Ask Linux to SIGKILL this process when its launcher dies (no orphaned ranks).

    Only when this process's parent is the launcher that started it; elsewhere a no-op.
    """
    launcher = os.environ.get(LAUNCHER_PID_ENV)
    if not launcher or int(launcher) != os.getppid() or not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    pr_set_pdeathsig = 1
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != int(launcher):  # the launcher died before prctl took effect
        os.kill(os.getpid(), signal.SIGKILL)
