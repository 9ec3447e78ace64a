"""`ftcoord-store`: a standalone TCPStore server that outlives every rank.

It binds its own listening socket to the configured host (127.0.0.1 unless told
otherwise) and hands it to TCPStore as `master_listen_fd`: left alone, TCPStore would
listen on every interface, and the store has no authentication.
"""

from __future__ import annotations

import json
import socket
import subprocess
import threading
from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist

from ftcoord.env import DEFAULT_STORE_HOST, DEFAULT_STORE_PORT
from ftcoord.errors import StoreUnavailable
from ftcoord.host.interpreter import module_command
from ftcoord.host.reap import wait_killed
from ftcoord.store.listen import bind_listen_socket

DEFAULT_HOST = DEFAULT_STORE_HOST
DEFAULT_PORT = DEFAULT_STORE_PORT


class StoreServer:
    """A TCPStore server in this process, listening on a socket we bound ourselves."""

    def __init__(self, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, sock: socket.socket | None = None) -> None:
        """`sock`: a socket already listening on host:port (`ftcoord.store.listen`); bound here when not given."""
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

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def close(self) -> None:
        """Stop serving (clients see DistNetworkError within milliseconds)."""
        del self._store


@dataclass
class StoreProcess:
    """A store server in a child process (embedded store for launchers, tests, demos)."""

    process: subprocess.Popen[str]
    address: str

    @classmethod
    def start(cls, host: str = DEFAULT_HOST, port: int = 0, timeout: float = 60.0,
              own_session: bool = False) -> StoreProcess:
        """Start `python -m ftcoord.store.server` and wait for its ready line. `own_session`: in a session of its own, so
        the kernel's scheduler (autogroups) shares the CPU between it and the caller's session as between two
        hosts, not between its one thread and every thread of the caller's (chaos bench --scale)."""
        process = subprocess.Popen(
            module_command("ftcoord.store.main", "--host", host, "--port", str(port), "--quiet"),
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
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                wait_killed(self.process)
