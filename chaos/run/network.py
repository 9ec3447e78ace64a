"""A run's own network: each node in a network namespace, with a control link (to the store) and a data link (gloo).

Everything lives inside the network namespace the run itself runs in (`own_namespace_command`: the run re-executes
itself under `unshare -n`), so no address it uses is the machine's and all of it goes when the run ends. The hub (the
run's namespace) holds two bridges, `ftctl` (10.77.0.0/24, the store at .1) and `ftdata` (10.78.0.0/24); node i is a
namespace held by a `sleep` process, joined to each bridge by a veth pair (`ctl0` 10.77.0.<10+i>, `data0`
10.78.0.<10+i>). A cut sets the hub's end of a link down: the node's packets go nowhere and no connection closes,
as when a cable or a switch port dies. Needs root, `ip`, `unshare`, `nsenter` and `setpriv`.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field

from chaos.errors import NetworkError

OWN_NAMESPACE_ENV = "CHAOS_OWN_NETNS"
"""Set in a run re-executed in a network namespace of its own (`own_namespace_command`)."""
STORE_HOST = "10.77.0.1"
"""The hub's address on the control bridge: where a network run's store listens."""
LINKS = ("control", "data")
_BRIDGES = {"control": ("ftctl", "10.77.0"), "data": ("ftdata", "10.78.0")}
_NODE_IFNAMES = {"control": "ctl0", "data": "data0"}
DATA_IFNAME = _NODE_IFNAMES["data"]
"""The node's data interface: the ranks' GLOO_SOCKET_IFNAME."""


@functools.cache
def unavailable() -> str | None:
    """Why this machine cannot hold a network run (one line), or None when it can; probed once a process (the
    report checks before its reference, the runner before its run)."""
    if os.geteuid() != 0:
        return "network faults need root (network namespaces, veth pairs and bridges)"
    missing = [tool for tool in ("ip", "unshare", "nsenter", "setpriv") if shutil.which(tool) is None]
    if missing:
        return f"network faults need {', '.join(missing)} on PATH"
    probe = subprocess.run(["setpriv", "--pdeathsig", "KILL", "unshare", "-n", "sh", "-c",
                            "ip link add probe0 type bridge && ip link add probe1 type veth peer name probe2"],
                           capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        return f"network namespaces are unavailable here: {probe.stderr.strip() or 'unshare -n failed'}"
    return None


def in_own_namespace() -> bool:
    """This process runs in the network namespace its run created (`own_namespace_command`)."""
    return os.environ.get(OWN_NAMESPACE_ENV) == str(os.getpid())


def own_namespace_command(argv: list[str]) -> list[str]:
    """`argv` (Python's command line) run under `unshare -n`, with loopback up, as its own namespace's run; sent
    SIGINT when the thread that started it ends, however it ends (it then tears down what it made)."""
    script = f'ip link set lo up && {OWN_NAMESPACE_ENV}=$$ exec "$@"'
    return ["setpriv", "--pdeathsig", "INT", "unshare", "-n", "sh", "-c", script, "sh", sys.executable, *argv]


def _ip(*args: str, node_pid: int | None = None) -> None:
    command = ["ip", *args] if node_pid is None else ["nsenter", "-t", str(node_pid), "-n", "ip", *args]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise NetworkError(f"network setup failed: {' '.join(command)}: {done.stderr.strip()}")


@dataclass
class NodeLinks:
    """One node's namespace (held by `holder`) and its links cut now, each with how many timed cuts hold it
    (`for_good`: cut by a cut that only the node's replacement ends)."""

    index: int
    holder: subprocess.Popen[bytes]
    cut: dict[str, int] = field(default_factory=dict)
    for_good: set[str] = field(default_factory=set)

    @property
    def pid(self) -> int:
        """The holder's pid, while it holds the namespace (a pid reused by another process would be another
        namespace, maybe the machine's own)."""
        if self.holder.poll() is not None:
            raise NetworkError(f"node {self.index}'s namespace holder (pid {self.holder.pid}) ended with "
                               f"{self.holder.returncode}: its namespace is gone")
        return self.holder.pid

    def address(self, link: str) -> str:
        return f"{_BRIDGES[link][1]}.{10 + self.index}"

    def hub_end(self, link: str) -> str:
        return f"n{self.index}{link[0]}"


class Network:
    """The hub's bridges and one namespace per node; `close` ends every holder (the namespaces go with them).

    Args:
        nodes: how many node namespaces to make.
    """

    def __init__(self, nodes: int) -> None:
        if not in_own_namespace():
            raise NetworkError("a run's network is made only inside the run's own namespace (own_namespace_command)")
        self.nodes: list[NodeLinks] = []
        try:
            for link, (bridge, prefix) in _BRIDGES.items():
                _ip("link", "add", bridge, "type", "bridge")
                _ip("link", "set", bridge, "up")
                if link == "control":
                    _ip("addr", "add", f"{prefix}.1/24", "dev", bridge)
            for index in range(nodes):
                self._add_node(index)
        except BaseException:
            self.close()
            raise

    def _add_node(self, index: int) -> None:
        # Killed with the thread that made it, however this process ends: the namespace goes with its holder.
        holder = subprocess.Popen(["setpriv", "--pdeathsig", "KILL", "unshare", "-n", "sleep", "infinity"],
                                  stdin=subprocess.DEVNULL)
        node = NodeLinks(index, holder)
        self.nodes.append(node)
        _wait_for_own_netns(holder.pid)
        _ip("link", "set", "lo", "up", node_pid=node.pid)
        for link, (bridge, _prefix) in _BRIDGES.items():
            hub, inner = node.hub_end(link), _NODE_IFNAMES[link]
            _ip("link", "add", hub, "type", "veth", "peer", "name", inner, "netns", str(node.pid))
            _ip("link", "set", hub, "master", bridge)
            _ip("link", "set", hub, "up")
            _ip("addr", "add", f"{node.address(link)}/24", "dev", inner, node_pid=node.pid)
            _ip("link", "set", inner, "up", node_pid=node.pid)

    def enter(self, index: int, command: list[str]) -> list[str]:
        """`command` run in node `index`'s namespace."""
        return ["nsenter", "-t", str(self.nodes[index].pid), "-n", *command]

    def cut(self, index: int, links: tuple[str, ...], for_good: bool = False) -> None:
        """Cut node `index`'s `links` (of LINKS): no packet passes them, no connection closes. `for_good`: no
        `heal` of theirs brings them back, only the node's `replaced`."""
        node = self.nodes[index]
        for link in links:
            _ip("link", "set", node.hub_end(link), "down")
            if for_good:
                node.for_good.add(link)
            node.cut[link] = node.cut.get(link, 0) + (not for_good)

    def heal(self, index: int, links: tuple[str, ...]) -> None:
        """A timed cut of node `index`'s `links` is over: each passes packets again once no other cut holds it (a
        timed cut's end undoes neither a later one still running nor one for good)."""
        node = self.nodes[index]
        for link in links:
            held = node.cut.get(link, 0) - 1
            if held > 0 or (link in node.cut and link in node.for_good):
                node.cut[link] = max(held, 0)
                continue
            if link in node.cut:
                _ip("link", "set", node.hub_end(link), "up")
                del node.cut[link]

    def replaced(self, index: int) -> None:
        """A new node stands in node `index`'s place: every link of its passes packets, whatever cut them."""
        node = self.nodes[index]
        for link in sorted(node.cut):
            _ip("link", "set", node.hub_end(link), "up")
        node.cut.clear()
        node.for_good.clear()

    def close(self) -> None:
        for node in self.nodes:
            if node.holder.poll() is None:
                node.holder.kill()
                node.holder.wait()
        self.nodes = []


def _wait_for_own_netns(pid: int) -> None:
    """`unshare -n sleep` has its namespace once it exec'd sleep (its net namespace differs from this process's)."""
    deadline = time.monotonic() + 10
    mine = os.readlink("/proc/self/ns/net")
    while time.monotonic() < deadline:
        try:
            if os.readlink(f"/proc/{pid}/ns/net") != mine and os.readlink(f"/proc/{pid}/exe").endswith("sleep"):
                return
        except OSError:
            pass
        time.sleep(0.005)
    raise NetworkError(f"the namespace holder {pid} did not start within 10s")
