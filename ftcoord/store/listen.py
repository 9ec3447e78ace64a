"""The store's listening socket, bound without importing torch: `ftcoord-store` answers a taken port in
a fraction of a second, before it pays for importing torch."""

from __future__ import annotations

import errno
import socket

from ftcoord.errors import PortInUse


def bind_listen_socket(host: str, port: int) -> socket.socket:
    """Bind and listen on host:port; port 0 picks a free one.

    Raises:
        PortInUse: the port is taken on that host.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise PortInUse(
                f"port {port} on {host} is already in use; stop the process holding it "
                f"(`ss -ltnp 'sport = :{port}'`) or pick another --port (0 picks a free one)"
            ) from exc
        raise
    sock.listen(512)
    return sock
