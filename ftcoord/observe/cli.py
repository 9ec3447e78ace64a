"""`ftcoord`: operator commands for a node and its jobs.

    ftcoord status [--store HOST:PORT] [--job J] [--watch] [--json]
                               the jobs on a store; one job's generation, members, leader, every slot's
                               heartbeat age, step, restarts and standby, and what each fault cost
    ftcoord gc [--dry-run]     list, then remove, this node's shared-memory scratch of jobs that
                               are not running here (flash checkpoint images a dead job left behind)

Exit codes: 0 done; 1 the store or the job cannot be read; 2 bad arguments.
"""

from __future__ import annotations

import argparse
import os
import sys

from ftcoord import arguments, env
from ftcoord.host import scratch


def _gc(args: argparse.Namespace) -> int:
    found = scratch.orphans()
    if not found:
        print(f"no orphaned job scratch under {scratch.root()}")
        return 0
    total = sum(o.bytes for o in found)
    for orphan in found:
        print(f"{'orphan' if args.dry_run else 'removing'}  {orphan.path}  job {orphan.job_id}  "
              f"{orphan.bytes / 2**20:.1f} MiB")
    if args.dry_run:
        print(f"{len(found)} orphaned job(s), {total / 2**20:.1f} MiB; run `ftcoord gc` to remove them")
        return 0
    removed = scratch.reap()
    print(f"removed {len(removed)} orphaned job(s), {sum(o.bytes for o in removed) / 2**20:.1f} MiB")
    return 0


def _status(args: argparse.Namespace) -> int:
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # before torch: c10d's warnings are not ours to show
    from ftcoord.errors import FtcoordError
    from ftcoord.observe.status_cli import show

    try:
        return show(args.store, args.job, watch=args.watch, as_json=args.json, refresh=args.refresh,
                    connect_timeout=args.connect_timeout)
    except FtcoordError as exc:
        print(f"ftcoord status: {exc}", file=sys.stderr)
        return 1


def build_parser() -> argparse.ArgumentParser:
    parser = arguments.Parser(prog="ftcoord", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    gc = sub.add_parser("gc", help="remove shared-memory scratch that jobs no longer running here left behind",
                        description="A job's node-local scratch (under /dev/shm, or $FTCOORD_SCRATCH_ROOT) is an "
                        "orphan when none of the processes that own it (its launchers) is alive. Launchers remove "
                        "their job's scratch when the job ends and reap other jobs' orphans when they start; this "
                        "command does the same by hand.")
    gc.add_argument("--dry-run", action="store_true", help="only list what would be removed")
    status = sub.add_parser(
        "status", help="show the jobs on a store and one job's generation, slots, restarts and incidents",
        formatter_class=arguments.DefaultsHelpFormatter,
        description="Reads the store only (it writes nothing). Heartbeat ages are this command's own "
        "observation (a one-shot read watches for two heartbeat intervals first); steps, restarts and "
        "incidents are what the job's processes and launchers publish.")
    status.add_argument("--store", default=env.store_from_env(), help="HOST:PORT of the store ($FTCOORD_STORE)")
    status.add_argument("--job", "--job-id", dest="job", default=None,
                        help="the job to show (needed when the store has several)")
    status.add_argument("--watch", action="store_true", help="redraw live until Ctrl-C")
    status.add_argument("--json", action="store_true", help="print one JSON object and exit")
    status.add_argument("--refresh", type=arguments.positive_float, default=0.5, help="seconds between redraws")
    status.add_argument("--connect-timeout", type=arguments.positive_float, default=3.0,
                        help="seconds to wait for the store")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "gc":
        return _gc(args)
    if args.command == "status":
        return _status(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
