"""`ftcoord-launch`: start a node's training processes and keep them alive.

    ftcoord-launch --store HOST:PORT --job-id J --nproc 4 [--spares 1] -- python train.py ARGS
    ftcoord-launch --embedded-store --job-id J --nproc 2 -- python -m training ...

One launcher per node, with torchrun's --nnodes and --node-rank (under SLURM, `srun --ntasks-per-node=1
ftcoord-launch ...` reads both from the step); several launchers on one machine work the same way.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from dataclasses import fields
from typing import Any

from ftcoord import arguments, env, log
from ftcoord.env import (
    DEFAULT_JOB_ID,
    DEFAULT_STORE_HOST,
    JOB_ID_ENV,
    SLURM_JOB_ID_ENV,
    STORE_ENV,
    store_timeout_from_env,
)
from ftcoord.errors import ConfigError, FtcoordError
from ftcoord.launcher.children_env import standby_env
from ftcoord.launcher.config import LaunchConfig
from ftcoord.launcher.standby_keeper import StandbyKeeper, standby_wanted
from ftcoord.launcher.standby_template import PythonCommand
from ftcoord.protocol.spares import MAX_SPARES, SPARE_SLOT_BASE

EXIT_FAILED = 1

DEFAULTS = {f.name: f.default for f in fields(LaunchConfig) if f.name not in ("command", "job_id", "store")}
"""LaunchConfig's defaults, which --help prints."""


def build_parser() -> argparse.ArgumentParser:
    parser = arguments.Parser(
        prog="ftcoord-launch",
        description="Start this node's training processes under ftcoord and restart them through faults. "
        "It takes torchrun's --nnodes, --node-rank, --nproc-per-node and --max-restarts (a fixed number of nodes).",
        epilog="Exit codes: 0 the job finished (or stopped cleanly after SIGTERM); 1 a failure; 2 bad "
        "arguments; 3 a slot (or the job) exhausted --max-restarts; 75 the store stayed unreachable past "
        "--store-timeout (every process wrote its emergency checkpoint first: restart the store, relaunch, and the "
        "job resumes from it); 143 children had to be killed after the grace period. Children get FTCOORD_STORE, "
        "FTCOORD_JOB_ID, FTCOORD_SLOT, FTCOORD_WORLD_SIZE, and as torchrun sets them at start LOCAL_RANK, "
        "LOCAL_WORLD_SIZE, RANK and WORLD_SIZE; after a change of generation call.rank and call.world_size are the "
        "truth. MASTER_ADDR and MASTER_PORT are not set: the process group is the generation's, made by "
        "call.init_process_group(). Under srun (one task per node) --nnodes and --node-rank come "
        f"from SLURM, and the job id from SLURM_JOB_ID. Spare slots are numbered from {SPARE_SLOT_BASE} + "
        f"--first-slot * {MAX_SPARES}.",
        formatter_class=arguments.DefaultsHelpFormatter,
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--store", default=None,
                       help=f"HOST:PORT of a running ftcoord-store (default: ${STORE_ENV}; one of the two is needed, "
                       "or --embedded-store)")
    where.add_argument("--embedded-store", action="store_true",
                       help="start a store server inside this launcher (single node)")
    parser.add_argument("--store-port", type=arguments.port, default=0, help="port of the embedded store (0: any free)")
    parser.add_argument("--store-host", default=DEFAULT_STORE_HOST, help="interface of the embedded store")
    parser.add_argument("--job-id", default=None,
                        help=f"names the job; its keys live under ftcoord/<job-id>/ (default: ${JOB_ID_ENV}, else "
                        f"${SLURM_JOB_ID_ENV}, else {DEFAULT_JOB_ID!r} with --embedded-store; needed with --store)")
    parser.add_argument("--nproc", "--nproc-per-node", "--nproc_per_node", dest="nproc", type=arguments.positive_int,
                        default=DEFAULTS["nproc"], help="training processes on this node")
    parser.add_argument("--nnodes", type=arguments.positive_int, default=None,
                        help="nodes of the job, each running one ftcoord-launch with the same --nproc-per-node "
                        "(default: SLURM's step, else 1)")
    parser.add_argument("--node-rank", "--node_rank", dest="node_rank", type=arguments.non_negative_int, default=None,
                        help="this node's index, 0 to --nnodes - 1 (default: SLURM's, else 0)")
    parser.add_argument("--spares", type=arguments.int_range(0, MAX_SPARES - 1), default=DEFAULTS["spares"],
                        help="hot spare processes on this node")
    parser.add_argument("--first-slot", type=arguments.non_negative_int, default=None,
                        help="slot of this node's first process (default: --node-rank * --nproc-per-node)")
    parser.add_argument("--world-size", type=arguments.positive_int, default=None,
                        help="target world size of the whole job (default: --nnodes * --nproc-per-node)")
    parser.add_argument("--max-restarts", type=arguments.non_negative_int, default=DEFAULTS["max_restarts"],
                        help="restarts per slot (slot policy) or of the whole job (job policy)")
    parser.add_argument("--restart-policy", choices=("slot", "job"), default=DEFAULTS["restart_policy"],
                        help="slot: restart only the dead process; job: restart every process of the job, on every "
                             "node (the classic baseline)")
    standby = parser.add_mutually_exclusive_group()
    standby.add_argument("--warm-standby", type=arguments.non_negative_int, default=DEFAULTS["warm_standby"],
                         help="1: keep a template process with torch (and the command's module) imported that forks "
                              "each slot's process in milliseconds; 0: start every process as a new interpreter")
    standby.add_argument("--no-warm-standby", dest="warm_standby", action="store_const", const=0,
                         help="the same as --warm-standby 0")
    parser.add_argument("--grace", type=arguments.non_negative_float, default=DEFAULTS["grace_s"],
                        help="seconds children get after SIGTERM before SIGKILL")
    parser.add_argument("--store-timeout", type=arguments.positive_float, default=None,
                        help="seconds the launcher and its processes ride through a store that went away (they "
                        "reconnect, and rebuild a restarted store) before they give up with exit code 75 "
                        f"(default: ${{FTCOORD_STORE_TIMEOUT}}, else {DEFAULTS['store_timeout_s']:g})")
    parser.add_argument("--log-dir", default=None, help="JSON-lines logs of the launcher and every process")
    parser.add_argument("--metrics-port", type=arguments.port, default=None,
                        help="serve Prometheus metrics at http://HOST:PORT/metrics (0: any free port, logged as "
                        "metrics_serving); off unless given")
    parser.add_argument("--metrics-host", default=DEFAULTS["metrics_host"],
                        help="interface of the metrics endpoint; 0.0.0.0 exposes it to the network")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command of one process")
    return parser


def _topology(args: argparse.Namespace) -> tuple[int, int]:
    """(first slot, target world size) from --nnodes, --node-rank, --first-slot and --world-size, or from SLURM's
    step when this node's place is not given (no --node-rank, no --first-slot, no --embedded-store): the values
    given must agree with each other."""
    nodes, node = args.nnodes, args.node_rank
    if node is None and args.first_slot is None and not args.embedded_store:
        slurm = env.slurm_nodes()
        if slurm is not None and nodes in (None, slurm[0]):
            nodes, node = slurm
    if node is not None and nodes is None:
        raise ConfigError(f"--node-rank {node} needs --nnodes: how many nodes the job runs on")
    if node is None and args.first_slot is None and nodes is not None and nodes > 1:
        raise ConfigError(f"--nnodes {nodes}: which node is this one? give --node-rank (0 to {nodes - 1}), or run "
                          f"under srun, which says")
    nodes = 1 if nodes is None else nodes
    node = 0 if node is None else node
    if node >= nodes:
        raise ConfigError(f"--node-rank {node} is not a node of --nnodes {nodes}: node ranks run from 0 to {nodes - 1}")
    first = node * args.nproc if args.first_slot is None else args.first_slot
    if args.first_slot is not None and args.node_rank is not None and first != node * args.nproc:
        raise ConfigError(f"--first-slot {first} disagrees with node {node} of {nodes} with {args.nproc} processes "
                          f"each (slot {node * args.nproc}): give --node-rank or --first-slot, not both")
    world = nodes * args.nproc if args.world_size is None else args.world_size
    if args.world_size is not None and nodes > 1 and world != nodes * args.nproc:
        raise ConfigError(f"--world-size {world} disagrees with --nnodes {nodes} x --nproc-per-node {args.nproc} = "
                          f"{nodes * args.nproc}: give one or the other")
    if first + args.nproc > world:
        raise ConfigError(f"this node's slots {first}..{first + args.nproc - 1} do not fit a job of world size "
                          f"{world}: raise --world-size (or --nnodes), or lower --first-slot")
    return first, world


def _script_missing(command: list[str]) -> str | None:
    """Why the command's Python script cannot run (it does not exist), or None: said once, before any process
    starts, rather than by every restart of every slot."""
    parsed = PythonCommand.parse(command)
    if parsed is None or parsed.script is None or os.path.isfile(parsed.script):
        return None
    return (f"the script {parsed.script!r} does not exist (looked in {os.getcwd()}); check the path after `--`, "
            f"or run the launcher from the script's directory")


def parse_config(argv: list[str] | None) -> tuple[LaunchConfig, argparse.Namespace]:
    parser = build_parser()
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("missing the command to run after `--` (e.g. -- python train.py)")
    try:
        arguments.executable(command[0])
    except argparse.ArgumentTypeError as exc:
        parser.error(str(exc))
    from ftcoord.store.address import StoreAddress, check_job_id

    if not args.embedded_store:
        args.store = args.store or os.environ.get(STORE_ENV) or None
        if args.store is None:
            parser.error(f"where is the store? give --store HOST:PORT (or set {STORE_ENV}), or --embedded-store to "
                         f"run one inside this launcher (one node)")
    args.job_id = args.job_id or os.environ.get(JOB_ID_ENV) or os.environ.get(SLURM_JOB_ID_ENV)
    if not args.job_id and args.embedded_store:
        args.job_id = DEFAULT_JOB_ID  # the store is this launcher's own: no other job can share it
    if not args.job_id:
        parser.error(f"which job on the store at {args.store}? give --job-id NAME (or set {JOB_ID_ENV}; under SLURM, "
                     f"{SLURM_JOB_ID_ENV} is used), so that two jobs sharing a store never mix their keys")
    try:
        check_job_id(args.job_id)
        if args.store:
            StoreAddress.parse(args.store)
        store_timeout_from_env(DEFAULTS["store_timeout_s"])
        first_slot, world_size = _topology(args)
    except FtcoordError as exc:
        parser.error(str(exc))
    missing = _script_missing(command)
    if missing:
        parser.error(missing)
    config = LaunchConfig(
        command=command, job_id=args.job_id, store=args.store or "", nproc=args.nproc, spares=args.spares,
        first_slot=first_slot, world_size=world_size, max_restarts=args.max_restarts,
        restart_policy=args.restart_policy, warm_standby=args.warm_standby, grace_s=args.grace,
        log_dir=os.path.abspath(args.log_dir) if args.log_dir else None,
        metrics_port=args.metrics_port, metrics_host=args.metrics_host,
        store_timeout_s=args.store_timeout if args.store_timeout is not None
        else store_timeout_from_env(DEFAULTS["store_timeout_s"]),
    )
    return config, args


def main(argv: list[str] | None = None) -> int:
    config, args = parse_config(argv)
    log.configure(os.path.join(config.log_dir, "launcher.jsonl") if config.log_dir else None)
    logger = log.get_logger(component="launcher")
    standby = _start_standby(config, logger) if not args.embedded_store else None  # embedded: no address yet
    from ftcoord.config import Timing
    from ftcoord.launcher.supervisor import EXIT_USAGE, Supervisor
    from ftcoord.store.link import StoreLink
    from ftcoord.store.server import StoreServer

    server = None
    try:
        if args.embedded_store:
            server = StoreServer(args.store_host, args.store_port)
            config = LaunchConfig(**{**config.__dict__, "store": server.address})
            logger.info("embedded_store_ready", address=server.address)
        link = StoreLink(config.store, config.job_id, store_timeout=config.store_timeout_s,
                         op_timeout=Timing().store_op_timeout, settles_counted=True)
        client = link.connect()
    except FtcoordError as exc:
        print(f"ftcoord-launch: {exc}", file=sys.stderr)
        if standby is not None:
            standby.release(timeout=0)
        return EXIT_FAILED
    supervisor = Supervisor(config, client, early_standby=standby)
    link.on_new_instance(supervisor.rebuild)
    if config.metrics_port is not None:
        from ftcoord.observe.metrics import LauncherMetrics

        metrics = LauncherMetrics(link.client(), config.job_id, config.slots,
                                  lambda: {s.slot: dict(s.restart_kinds) for s in supervisor.slots.values()})
        try:
            metrics.serve(config.metrics_port, config.metrics_host)
        except FtcoordError as exc:
            print(f"ftcoord-launch: {exc}", file=sys.stderr)
            supervisor.standby.release(timeout=0)
            return EXIT_USAGE
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda s, _: supervisor.signalled(s))
    logger.info("launcher_started", nproc=config.nproc, spares=config.spares, slots=config.slots,
                policy=config.restart_policy, warm_standby=config.warm_standby, store=config.store)
    try:
        return supervisor.run()
    finally:
        if server is not None:
            server.close()


def _start_standby(config: LaunchConfig, logger: Any) -> StandbyKeeper:
    """The node's warm standby, started before this process imports torch: its import (torch, torch._dynamo, the
    command's modules) and this launcher's own (before it can reach the store) run side by side, not one after the
    other, so the job's first step comes sooner."""
    keeper = StandbyKeeper(config.command, standby_wanted(config), logger.bind(job_id=config.job_id))
    keeper.start(standby_env(config))
    return keeper


def console_main() -> None:
    """`ftcoord-launch`: main, then exit without the interpreter's teardown of torch, which takes long and does
    nothing needed: every log line is already written."""
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    console_main()
