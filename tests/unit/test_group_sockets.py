"""The sockets a block opened, recorded whether it returned or raised, and shut down for good (real sockets)."""

from __future__ import annotations

import socket

import pytest

from ftcoord.host import group_sockets

pytestmark = pytest.mark.timeout(30)


def test_a_block_that_raised_still_records_what_it_connected_and_shut_down_releases_the_peer() -> None:
    """A process-group creation that fails may leave connections to the peers that did connect; nothing tears a
    group down that was never made, so they are shut down from the record at once (ftcoord.wrapper.call). The record
    must hold them although the block raised, and never the listener (gloo's accept thread)."""
    listener = socket.create_server(("127.0.0.1", 0))  # the peer's side, opened before the block
    opened: list[socket.socket] = []
    record: dict[int, str] = {}
    try:
        with pytest.raises(RuntimeError), group_sockets.opened_by(record):
            opened.append(own_listener := socket.create_server(("127.0.0.1", 0)))
            opened.append(socket.create_connection(listener.getsockname()))
            raise RuntimeError("the creation failed")
        own_listener, ours = opened
        assert ours.fileno() in record, "the sockets of a block that raised were not recorded"
        peer, _ = listener.accept()
        opened.append(peer)
        assert group_sockets.shut_down(record) == 1, "only the connection is shut down, never a listener"
        peer.settimeout(5)
        assert peer.recv(1) == b"", "the peer of a shut-down connection did not see it closed"
        assert own_listener.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN), "the listener was shut down"
    finally:
        for s in (*opened, listener):
            s.close()
