"""The sockets a gloo process group opened, and shutting them down for good when its generation fails.

gloo cannot abort a collective, and a process group stays open while anything references it (a DDP module in
the user's locals, a traceback frame, an object of the user's that outlives the generation). So a generation that
ends by a failure shuts its group's sockets down, whatever still references the group: every peer blocked in one
of its collectives fails at once ("Connection closed by peer"), and the group can never block anyone again (NCCL
has the communicator's abort instead). The group's sockets are the connected ones `init_process_group` opened
(gloo's full mesh); its listening socket is left alone, since gloo's accept thread terminates the process when
its listener is shut down under it. Each socket is remembered by descriptor *and* inode, so a descriptor that
was closed and reused for something else meanwhile is never touched.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager


def open_sockets() -> dict[int, str]:
    """This process's socket descriptors: fd -> "socket:[inode]" (empty where /proc is missing)."""
    found = {}
    try:
        descriptors = os.listdir("/proc/self/fd")
    except OSError:
        return {}
    for name in descriptors:
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue  # closed meanwhile (the listing's own descriptor, say)
        if target.startswith("socket:"):
            found[int(name)] = target
    return found


def opened_since(before: dict[int, str]) -> dict[int, str]:
    """The sockets open now that were not in `before` (an earlier open_sockets()), a reused descriptor included."""
    return {fd: inode for fd, inode in open_sockets().items() if before.get(fd) != inode}


@contextmanager
def opened_by(record: dict[int, str]) -> Iterator[None]:
    """Fill `record` with the sockets opened while the block runs, whether it returns or raises (a failed
    process-group creation may leave connections to the peers that did connect)."""
    before = open_sockets()
    try:
        yield
    finally:
        record.update(opened_since(before))


def shut_down(record: dict[int, str]) -> int:
    """Shut down (both directions) every recorded socket still open as the same socket; how many."""
    current = open_sockets()
    count = 0
    for fd, inode in record.items():
        if current.get(fd) != inode:
            continue  # closed by its owner, or the descriptor now names another socket
        try:
            sock = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        try:
            if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                continue  # gloo's listener: its accept thread terminates the process if it is shut down
            sock.shutdown(socket.SHUT_RDWR)
            count += 1
        except OSError:
            pass  # not connected, or already down
        finally:
            sock.close()  # closes our duplicate only; the group's own descriptor stays its to close
    record.clear()
    return count
