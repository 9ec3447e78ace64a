"""The TCPStore server of a job: in this process (`StoreServer`) or in a child process (`StoreProcess`).

The server outlives every rank. It binds its own listening socket to the configured host (127.0.0.1 unless told
otherwise) and hands it to TCPStore as `master_listen_fd`: left alone, TCPStore would listen on every interface,
and the store has no authentication. It publishes its boot (ftcoord.store.boot) before it prints its ready line.
The `ftcoord-store` command (ftcoord.store.main) runs a StoreServer.
"""

from __future__ import annotations

import json
import socket
import subprocess
import threading
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

from ftcoord.env import DEFAULT_STORE_HOST, DEFAULT_STORE_PORT
from ftcoord.errors import StoreUnavailable
from ftcoord.host.interpreter import module_command
from ftcoord.host.reap import wait_killed
from ftcoord.store.boot import BOOT_KEY, next_boot
from ftcoord.store.listen import bind_listen_socket

DEFAULT_HOST = DEFAULT_STORE_HOST
DEFAULT_PORT = DEFAULT_STORE_PORT


class StoreServer:
    """A TCPStore server in this process, listening on a socket we bound ourselves.

    Args:
        host: the interface to listen on (default 127.0.0.1: the store has no authentication).
        port: the TCP port (default 29600; 0 picks a free one); ignored when `sock` is given (its port is used).
        sock: a socket already listening on host:port (ftcoord.store.listen.bind_listen_socket), which TCPStore
            owns from then on; None: one is bound here.
        state_file: the file that counts this server's lives (ftcoord.store.boot), so a server started again with
            the same file never reuses an epoch; None: no count is kept (boot 0 each time).

    Raises:
        PortInUse: the port is taken on that host (only when `sock` is None).
        ConfigError: the state file holds something else than a boot number, or cannot be written.
    """

    def __init__(self, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, sock: socket.socket | None = None,
                 state_file: Path | None = None) -> None:
        self.boot = next_boot(state_file)  # a bad state file fails here, before anything is served
        sock = sock or bind_listen_socket(host, port)
        self.host = host
        self.port: int = sock.getsockname()[1]
        # TCPStore owns the descriptor from here on (and closes it).
        self._store = dist.TCPStore(
            host,
            self.port,
            is_master=True,
            master_listen_fd=sock.detach(),
            wait_for_workers=False,
            timeout=timedelta(seconds=30),
            use_libuv=True,
        )
        self._store.set(BOOT_KEY, str(self.boot))  # a client that came first waits for it (ftcoord.store.link)

    @property
    def address(self) -> str:
        """"host:port" ("[host]:port" for IPv6) that clients connect to."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def close(self) -> None:
        """Stop serving (clients see DistNetworkError within milliseconds)."""
        del self._store


@dataclass
class StoreProcess:
    """A store server in a child process (embedded store for launchers, tests, demos)."""

    process: subprocess.Popen[str]
    """The child process, `python -m ftcoord.store.main` (its stdout a pipe that carried its ready line)."""
    address: str
    """"host:port" the server listens on, as its ready line said (the port it picked when asked for 0)."""

    @classmethod
    def start(cls, host: str = DEFAULT_HOST, port: int = 0, timeout: float = 60.0,
              own_session: bool = False, state_file: Path | None = None) -> StoreProcess:
        """Start `python -m ftcoord.store.main` and wait for its ready line.

        Args:
            host: the interface to listen on (default 127.0.0.1).
            port: the TCP port (default 0: a free one).
            timeout: how long to wait for the ready line, in seconds (default 60).
            own_session: run it in a session of its own, so the kernel's scheduler (autogroups) shares the CPU
                between it and the caller's session as between two hosts, not between its one thread and every
                thread of the caller's (as `chaos bench --scale` needs).
            state_file: the file that counts the server's lives (see StoreServer); None: none is kept.

        Raises:
            StoreUnavailable: no ready line came within `timeout` (the child is killed).
        """
        process = subprocess.Popen(
            module_command("ftcoord.store.main", "--host", host, "--port", str(port), "--quiet",
                           *state_arguments(state_file)),
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=own_session,
        )
        ready: dict[str, str] = {}

        def read_ready_line() -> None:
            assert process.stdout is not None
            line = process.stdout.readline()
            if line:
                ready.update(json.loads(line))

        reader = threading.Thread(target=read_ready_line, daemon=True)
        reader.start()
        reader.join(timeout)
        if "address" not in ready:
            process.kill()
            wait_killed(process)
            raise StoreUnavailable(
                f"the store server on {host}:{port} did not start within {timeout:.0f}s "
                f"(exit code {process.returncode}); run `ftcoord-store --host {host} "
                f"--port {port}` by hand to see why"
            )
        return cls(process, ready["address"])

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server: SIGTERM, then SIGKILL if it has not exited in time; nothing when it has exited already.

        Args:
            timeout: how long to wait for it to exit after SIGTERM, in seconds (default 10).
        """
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                wait_killed(self.process)


def state_arguments(state_file: Path | None) -> list[str]:
    """`ftcoord-store`'s arguments for a state file (None: `--no-state`)."""
    return ["--state-file", str(state_file)] if state_file is not None else ["--no-state"]
