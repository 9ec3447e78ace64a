"""The environment a launcher gives its processes (and the warm standby they are forked from).

Torch-free: the launcher starts its warm standby with it before it imports torch itself (ftcoord.launcher.main).
"""

from __future__ import annotations

import os

from ftcoord import env
from ftcoord.launcher.config import LaunchConfig


def omp_threads_per_process(nproc: int) -> str:
    """Cores // processes (at least 1): N processes each spinning up a thread per core would oversubscribe
    the machine, and every step would slow down many times over."""
    return str(max(1, (os.cpu_count() or 1) // max(1, nproc)))


def children_env(nproc: int) -> dict[str, str]:
    """The launcher's environment for its processes, with OMP_NUM_THREADS split over them unless
    the user set it (as torchrun does), and torch's C++ log level at ERROR unless the user set it:
    ftcoord's store waits end in a timeout by design (a probe not yet answered, a slice of a watch),
    and at torch's default level each one would print a c10d warning."""
    values = dict(os.environ)
    values.setdefault("OMP_NUM_THREADS", omp_threads_per_process(nproc))
    values.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    return values


def job_env(config: LaunchConfig) -> dict[str, str]:
    """What every process of a launcher is told about the job (the warm standby too: a module's preload function
    checks its command line against it, see ftcoord.launcher.standby_template)."""
    values = {
        env.STORE_ENV: config.store,
        env.JOB_ID_ENV: config.job_id,
        env.WORLD_SIZE_ENV: str(config.target_world_size),
        env.LAUNCHER_PID_ENV: str(os.getpid()),
        # In the job's environment, not only a child's: a Wrapper built when the standby imports the module reads
        # it then.
        env.STORE_TIMEOUT_ENV: str(config.store_timeout_s),
    }
    if config.log_dir:
        values[env.LOG_DIR_ENV] = config.log_dir
    # As torchrun sets them at start, for scripts that read them; after a change of generation the truth is
    # call.rank and call.world_size. No MASTER_ADDR/MASTER_PORT: a process group of the script's own over env://
    # would fail at once rather than be created on the job's store (call.init_process_group() makes the group).
    values[env.TORCHRUN_WORLD_SIZE_ENV] = str(config.target_world_size)
    values[env.TORCHRUN_LOCAL_WORLD_SIZE_ENV] = str(config.nproc)
    return values


def standby_env(config: LaunchConfig) -> dict[str, str]:
    """The warm standby's environment: the children's, with what every process is told about the job."""
    return {**children_env(config.nproc), **job_env(config)}
