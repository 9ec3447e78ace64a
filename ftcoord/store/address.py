"""Where a job's store is and what its job id may be: parsed without importing torch.

Entry points check these before anything heavy is imported (a bad address or job id is
answered in a fraction of a second), and `ftcoord.store.client` builds on them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ftcoord.errors import ConfigError

JOB_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


@dataclass(frozen=True)
class StoreAddress:
    """Where the external TCPStore server listens."""

    host: str
    """The server's host name or IP address (IPv6 without brackets)."""
    port: int
    """The server's TCP port, 1 to 65535."""

    @classmethod
    def parse(cls, text: str) -> StoreAddress:
        """Parse "host:port" (IPv6 as "[::1]:port")."""
        match = re.fullmatch(r"\[?([^\[\]]+?)\]?:(\d+)", text.strip())
        if not match:
            raise ConfigError(f"store address {text!r} is not HOST:PORT (e.g. 127.0.0.1:29600)")
        port = int(match.group(2))
        if not 0 < port < 65536:
            raise ConfigError(f"store port {port} in {text!r} is outside 1..65535")
        return cls(match.group(1), port)

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def check_job_id(job_id: str) -> str:
    """Job ids become key prefixes: keep them to a safe alphabet."""
    if not JOB_ID_PATTERN.match(job_id):
        raise ConfigError(
            f"job id {job_id!r} must be 1-128 characters of letters, digits, '.', '_' "
            f"or '-', starting with a letter or digit"
        )
    return job_id
