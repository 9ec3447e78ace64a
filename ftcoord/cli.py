"""`ftcoord`: operator commands for a node and its jobs.

    ftcoord gc [--dry-run]     list, then remove, this node's shared-memory scratch of jobs that
                               are not running here (flash checkpoint images a dead job left behind)

Exit codes: 0 done; 2 bad arguments.
"""

from __future__ import annotations

import argparse
import sys

from ftcoord import arguments, scratch


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
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "gc":
        return _gc(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
