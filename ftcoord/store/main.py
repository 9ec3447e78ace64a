"""`ftcoord-store`: run the external TCPStore server from the command line."""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import sys
from pathlib import Path

from ftcoord import arguments, log
from ftcoord.env import DEFAULT_STORE_HOST, DEFAULT_STORE_PORT
from ftcoord.errors import ConfigError, PortInUse
from ftcoord.store.boot import default_state_file
from ftcoord.store.listen import bind_listen_socket

_CONNECTIONS_WANTED = 65536  # ~5 per process (ftcoord.wrapper.participant's clients, a launcher's) for 10k+ ranks


def open_files_limit() -> int:
    """The open-file limit raise_open_files sets here: the hard limit (_CONNECTIONS_WANTED when unlimited)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return max(soft, _CONNECTIONS_WANTED) if hard == resource.RLIM_INFINITY else hard


def raise_open_files() -> int:
    """Raise this process's open-file limit to its hard limit: every client connection is a descriptor, about five
    per rank's process (the default soft limit, often 1024, caps a job near 200 processes). The new soft limit."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    hard = open_files_limit()
    if soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return soft


def build_parser() -> argparse.ArgumentParser:
    """`ftcoord-store`'s command line."""
    parser = arguments.Parser(
        prog="ftcoord-store",
        description="Run the external TCPStore server that ftcoord jobs coordinate through. "
        "It outlives every rank; stop it with SIGTERM or Ctrl-C. Prints one JSON line "
        '{"event": "store_ready", "address": "HOST:PORT", ...} on stdout when it listens.',
        formatter_class=arguments.DefaultsHelpFormatter,
    )
    parser.add_argument("--host", default=DEFAULT_STORE_HOST,
                        help="interface to listen on; 0.0.0.0 exposes the store (no auth!) to the network")
    parser.add_argument("--port", type=arguments.port, default=DEFAULT_STORE_PORT,
                        help="TCP port; 0 picks a free one")
    state = parser.add_mutually_exclusive_group()
    state.add_argument("--state-file", type=Path, default=None,
                       help="the file that counts the server's lives, so a server started again on it never reuses "
                       "an epoch, whatever order a job's processes come back in (default: "
                       "$XDG_STATE_HOME/ftcoord/store-HOST-PORT.boot, ~/.local/state when unset); keep it on a disk "
                       "that outlives the server's host when the store may come back elsewhere")
    state.add_argument("--no-state", action="store_true",
                       help="keep no count: a restarted server is boot 0 again, and a job's epoch after a restart is "
                       "the one its first returning process proposes (see docs/store.md)")
    parser.add_argument("--log-file", default=None, help="also write JSON-lines events here")
    parser.add_argument("--quiet", action="store_true", help="no terminal log (stdout ready line only)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the store server until SIGTERM or Ctrl-C; the process's exit code."""
    args = build_parser().parse_args(argv)
    # SIGTERM and Ctrl-C are taken by sigwait below, never by a handler: a handler that sets an Event deadlocks on
    # the Event's own lock when it lands while this thread is inside Event.wait (as a SIGTERM sent right after the
    # ready line did). Blocked before any thread starts (TCPStore's), so that every thread inherits the mask.
    stop_signals = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)
    try:
        sock = bind_listen_socket(args.host, args.port)
    except PortInUse as exc:
        print(f"ftcoord-store: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"ftcoord-store: cannot listen on {args.host}:{args.port}: {exc.strerror}", file=sys.stderr)
        return 2
    from ftcoord.store.server import StoreServer  # torch: only once the port is ours

    log.configure(args.log_file, console=not args.quiet)
    logger = log.get_logger(component="store")
    open_files = raise_open_files()
    port = sock.getsockname()[1]
    state_file = None if args.no_state else args.state_file or default_state_file(args.host, port)
    try:
        server = StoreServer(args.host, port, sock=sock, state_file=state_file)
    except ConfigError as exc:
        print(f"ftcoord-store: {exc}", file=sys.stderr)
        return 2

    print(json.dumps({"event": "store_ready", "address": server.address, "host": server.host,
                      "port": server.port, "pid": os.getpid(), "max_connections": open_files,
                      "boot": server.boot.number, "state_file": str(state_file) if state_file else None}), flush=True)
    logger.info("store_ready", address=server.address, max_open_files=open_files, boot=server.boot.number,
                state_file=str(state_file) if state_file else None)
    if open_files < _CONNECTIONS_WANTED:
        logger.warning("store_open_files_low", max_open_files=open_files, processes=open_files // 5,
                       what_to_do="raise the hard limit (ulimit -Hn, LimitNOFILE=) for jobs of more processes")
    signal.sigwait(stop_signals)
    server.close()
    logger.info("store_stopped", address=server.address)
    return 0


if __name__ == "__main__":
    sys.exit(main())
