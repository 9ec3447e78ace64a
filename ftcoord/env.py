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
STORE_TIMEOUT_ENV: str = "FTCOORD_STORE_TIMEOUT"  # seconds a process rides through a store that is away
STORE_INSTANCE_ENV: str = "FTCOORD_STORE_INSTANCE"  # "epoch:nonce" of the store as the launcher knows it

# Fallbacks set by torchrun / SLURM.
TORCHRUN_RANK_ENV: str = "RANK"
TORCHRUN_WORLD_SIZE_ENV: str = "WORLD_SIZE"
TORCHRUN_MASTER_ADDR_ENV: str = "MASTER_ADDR"
TORCHRUN_MASTER_PORT_ENV: str = "MASTER_PORT"
TORCHRUN_LOCAL_WORLD_SIZE_ENV: str = "LOCAL_WORLD_SIZE"
SLURM_PROCID_ENV: str = "SLURM_PROCID"
SLURM_NTASKS_ENV: str = "SLURM_NTASKS"
SLURM_NODEID_ENV: str = "SLURM_NODEID"  # this node's index in the allocation (or the srun step)
SLURM_NNODES_ENV: str = "SLURM_NNODES"  # nodes of the allocation
SLURM_STEP_NUM_NODES_ENV: str = "SLURM_STEP_NUM_NODES"  # nodes of this srun step
SLURM_STEP_NUM_TASKS_ENV: str = "SLURM_STEP_NUM_TASKS"  # tasks of this srun step

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


def store_source() -> str:
    """Where `store_from_env()` got its answer, in words a person can act on."""
    if _first(STORE_ENV):
        return f"from {STORE_ENV}"
    return f"the default: {STORE_ENV} is not set"


TORCHRUN_AGENT_ENV: str = "TORCHELASTIC_RESTART_COUNT"  # set by torchrun's elastic agent for its workers


def torchrun_refusal() -> str | None:
    """Why ftcoord will not run as a worker of torchrun's elastic agent, or None when it is not one.

    The agent watches its workers and, when one dies, stops every worker of the group and starts them
    all again (or, with --max-restarts 0, fails the job): the survivors' live state, which ftcoord
    keeps training and heals replacements from, is thrown away, and the group redoes everything since
    its last snapshot. The two cannot both own recovery; ftcoord-launch does what the agent does
    (start, watch, replace) without stopping the survivors.
    """
    if not os.environ.get(TORCHRUN_AGENT_ENV) or os.environ.get(LAUNCHER_PID_ENV):
        return None
    return ("ftcoord does not run under torchrun: its agent stops and restarts every worker when one dies, "
            "throwing away the survivors' state that ftcoord recovers from. Start the same command with "
            "ftcoord-launch instead, with torchrun's flags: `ftcoord-launch --embedded-store --job-id NAME "
            "--nproc-per-node N -- python SCRIPT ARGS` (one node), or `ftcoord-launch --store HOST:PORT --job-id NAME "
            "--nnodes N --node-rank I --nproc-per-node P -- ...` on each node")


def store_timeout_from_env(default: float) -> float:
    """FTCOORD_STORE_TIMEOUT (seconds, > 0), else `default`."""
    raw = os.environ.get(STORE_TIMEOUT_ENV)
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise ConfigError(f"{STORE_TIMEOUT_ENV}={raw!r} must be a positive number of seconds: how long a process "
                          f"rides through a store that is away before it writes an emergency checkpoint and exits")
    return value


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


def launched() -> bool:
    """This process was started by ftcoord-launch, which kills it when the leader fences it."""
    return bool(os.environ.get(LAUNCHER_PID_ENV))


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


def slurm_nodes() -> tuple[int, int] | None:
    """(nodes, this node's index) of the srun step this process runs in, or None outside SLURM.

    ftcoord-launch runs one task per node (`srun --ntasks-per-node=1`): a step with more tasks than nodes would
    start several launchers per node, each believing it is the node, and is refused.
    """
    if not os.environ.get(SLURM_JOB_ID_ENV) or not os.environ.get(SLURM_NODEID_ENV):
        return None
    if not os.environ.get(SLURM_STEP_NUM_NODES_ENV):  # the batch script itself, not an srun step: one node
        return None
    names = (SLURM_STEP_NUM_NODES_ENV, SLURM_NNODES_ENV, SLURM_NODEID_ENV, SLURM_STEP_NUM_TASKS_ENV)
    raw = {name: os.environ.get(name, "") for name in names}
    try:
        nodes = int(raw[SLURM_STEP_NUM_NODES_ENV])
        index = int(raw[SLURM_NODEID_ENV])
        tasks = int(raw[SLURM_STEP_NUM_TASKS_ENV] or nodes)
    except ValueError:
        raise ConfigError(f"SLURM's variables do not read as numbers: {raw}; run ftcoord-launch under srun, or "
                          f"give --nnodes and --node-rank") from None
    if not 0 <= index < nodes:
        raise ConfigError(f"{SLURM_NODEID_ENV}={index} is not a node of the {nodes} in this step; give --nnodes and "
                          f"--node-rank")
    if tasks != nodes:
        raise ConfigError(f"this srun step runs {tasks} tasks on {nodes} nodes: ftcoord-launch runs one per node "
                          f"and starts the node's processes itself (srun --ntasks-per-node=1 ftcoord-launch "
                          f"--nproc-per-node P ...)")
    return nodes, index

