"""Evidence of a member's death from its peers' failed collectives: no heartbeat timeout to wait.

A process that dies with its connections closing (its node lost, no launcher left to report it) fails its peers'
gloo collective at once: "Connection closed by peer [ADDR]:PORT". That proves some member of the generation died or
left it, not which one (gloo tears pairs down in a cascade, so a survivor may name a live peer). So the leader ends
the generation and asks its members to beat now (`Probe`); a member that has not rejoined, did not announce leaving,
and stays silent is gone: the leader decides without it. Nobody is fenced on this evidence: a member that was alive
after all (a paused process) joins the next generation. A node that stops answering with its connections open (a
partition) leaves no evidence: its silence is, after heartbeat_timeout. Both lists (members' addresses and the
evidence) are one append-only key per generation: one store operation to publish, one to read.
"""

from __future__ import annotations

import os
import re
import socket
import time

import torch.distributed as dist

from ftcoord.protocol import keys
from ftcoord.store.client import get_or_none

# gloo names the peer of a broken connection in its errors: "... [127.0.0.1]:36004 ...".
_PEER_ADDRESS = re.compile(r"\[([0-9A-Fa-f.:]+)\]:(\d+)")
_CLOSED_MARKERS = ("Connection closed by peer", "Connection reset by peer", "Broken pipe")


def local_addresses(sockets: dict[int, str]) -> list[str]:
    """"host:port" of this process's end of each connected socket in `sockets` (fd -> inode)."""
    found = []
    for fd in sockets:
        try:
            sock = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        try:
            if not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                host, port = sock.getsockname()[:2]
                found.append(f"{host}:{port}")
        except OSError:
            pass
        finally:
            sock.close()
    return found


def publish_addresses(store: dist.Store, generation: int, slot: int, addresses: list[str]) -> None:
    """Publish this member's end of its group's connections when the group forms (keys.addresses), so a report of
    a closed connection names the member it saw close (for the log and the operator)."""
    store.append(keys.addresses(generation), f"{slot} {','.join(addresses)}\n")


def announce_leaving(store: dist.Store, generation: int, slot: int) -> None:
    """This member leaves the generation on purpose (before its sockets close)."""
    store.append(keys.evidence(generation), f"leaving {slot}\n")


def report_raised(store: dist.Store, generation: int, slot: int, error: str) -> None:
    """This member's own code raised `error` (its type's name) and ended the generation: the cause the leader names
    (ftcoord.leader.attribution), whichever member's interrupt came first."""
    store.append(keys.evidence(generation), f"raised {slot} {error}\n")


def closed_peer(exc: BaseException) -> set[str]:
    """The addresses a failed collective may mean by the peer that closed on us (empty: it names none).

    gloo (torch 2.14) prints the port byte-swapped: it formats a network-order port without
    converting it (a socket at 40666, 0x9EDA, appears as 55966, 0xDA9E). Both readings are kept;
    ports of a job's members do not collide, so the right member is still named.
    """
    text = str(exc)
    if not any(marker in text for marker in _CLOSED_MARKERS):
        return set()
    match = _PEER_ADDRESS.search(text)
    if not match:
        return set()
    host, port = match.group(1), int(match.group(2))
    swapped = ((port & 0xFF) << 8) | (port >> 8)
    return {f"{host}:{port}", f"{host}:{swapped}"}


def report_closed(store: dist.Store, generation: int, slot: int, exc: BaseException) -> list[int] | None:
    """After a failed collective: record that a connection closed under it (None when the failure
    says no such thing), naming the member it closed on where the published addresses tell."""
    candidates = closed_peer(exc)
    if not candidates:
        return None  # a timeout, an error of our own: no evidence
    raw = get_or_none(store, keys.addresses(generation))
    named = []
    for line in (raw or b"").decode().splitlines():
        member, _, listed = line.partition(" ")
        if candidates & set(listed.split(",")) and int(member) != slot:
            named.append(int(member))
    store.append(keys.evidence(generation), f"closed {','.join(map(str, named)) or '?'} {slot}\n")
    return named


def entries(store: dist.Store, generation: int) -> list[tuple[str, str]]:
    """The generation's evidence, one (kind, rest) per line: ("closed", "<named members or ?> <reporter>"),
    ("leaving", "<member>"), ("raised", "<member> <error>")."""
    raw = get_or_none(store, keys.evidence(generation))
    return [(kind, rest) for kind, _, rest in (line.partition(" ") for line in (raw or b"").decode().splitlines())]


def read(store: dist.Store, generation: int) -> tuple[bool, set[int]]:
    """(whether a connection closed under a collective of `generation`, the members that announced leaving)."""
    said = entries(store, generation)
    return any(kind == "closed" for kind, _ in said), {int(rest) for kind, rest in said if kind == "leaving"}


def closed_named(store: dist.Store, generation: int) -> set[int]:
    """The members that closed-connection reports of `generation` name (a survivor may name a live peer: a hint)."""
    return {int(m) for kind, rest in entries(store, generation) if kind == "closed"
            for m in rest.partition(" ")[0].split(",") if m.isdigit()}


class Probe:
    """A leader's question to every live member of a generation: beat now.

    A live process proves itself on request: its heartbeat thread beats whatever its training thread is doing. The
    question is asked once per generation with a closed connection, by ending the generation (its interrupt) and
    setting its probe key: each member's interrupt monitor waits on one, then on the other, and has its heartbeat
    thread beat at once (ftcoord.liveness.interrupt_watch). A member of the generation that has not rejoined and did
    not beat within `Timing.probe_grace` of the question, or for `Timing.evidence_silence`, is gone.
    """

    def __init__(self, store: dist.Store) -> None:
        self._store = store
        self._asked: dict[int, float] = {}

    def ask(self, generation: int) -> float:
        """When this process asked about `generation` (its monotonic clock), asking now if it had not."""
        if generation not in self._asked:
            self._asked = {g: t for g, t in self._asked.items() if g > generation - 4}
            self._asked[generation] = time.monotonic()
            self._store.compare_set(keys.interrupt(generation), "", "closed:probe")
            self._store.set(keys.probe(generation), keys.PROBE_ASKED)
        return self._asked[generation]

    def wait_at_most(self, grace: float, longest: float) -> float:
        """How long a watcher that asked may sleep: until the newest question's grace ends (the read that finds its
        answers, or silence, is asked then), or `longest` (the leader's tick, a follower's interval)."""
        newest = max(self._asked.values(), default=None)
        due = None if newest is None else newest + grace - time.monotonic()
        return longest if due is None or due <= 0 else max(0.01, min(longest, due))
