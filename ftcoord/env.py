"""Environment variables ftcoord reads, in one place.

The launcher sets them for its children; torchrun and SLURM set the fallbacks.
"""

from __future__ import annotations

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

DEFAULT_STORE: str = "127.0.0.1:29600"
DEFAULT_JOB_ID: str = "default"
