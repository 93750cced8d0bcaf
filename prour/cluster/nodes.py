"""Several Slurm nodes on one machine: a network namespace per node, joined by a private bridge.

Each simulated node is a namespace ``<tag>-nodeK`` with its own loopback and one veth into a bridge
that lives in the host namespace. The bridge holds ``<subnet>.254`` (where slurmctld and the
clients run); node K holds ``<subnet>.K``. No route or NAT leads anywhere else, so traffic stays
between these addresses and loopback. slurmd K runs inside namespace K (``ip netns exec``), so the
jobs it starts see that node's address only and reach the others over the bridge. The file system,
munge's socket and the CPUs stay shared: every node advertises the whole machine.

Root only (``ip netns`` and veths need CAP_NET_ADMIN). ``stop()`` stops the daemons by PID, then
removes the namespaces and the bridge, whatever ``start()`` got to.
"""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

from prour.cluster.local import LocalSlurm, SlurmUnavailable, binary


def ip(*args: str, namespace: str | None = None) -> None:
    """Run one ``ip`` command (in ``namespace`` when given); raise with its message on failure."""
    cmd = ["ip", *(("-n", namespace) if namespace else ()), *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
    if done.returncode != 0:
        raise SlurmUnavailable(f"`{' '.join(cmd)}` failed: {done.stderr.strip()}")


def namespaces() -> list[str]:
    """Names of the network namespaces on this machine."""
    done = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    return [line.split()[0] for line in done.stdout.splitlines() if line.strip()]


def links() -> list[str]:
    """Names of the network links of the host namespace."""
    done = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=False)
    return [line.split(":")[1].strip().split("@")[0] for line in done.stdout.splitlines()]


class NodeNetwork:
    """``count`` namespaces on ``subnet``.0/24 behind one bridge; ``up()`` then ``down()``."""

    def __init__(self, count: int, subnet: str, tag: str):
        if not 1 <= count <= 250:
            raise ValueError(f"node count {count} is outside 1..250")
        self.count = count
        self.subnet = subnet
        self.tag = tag  # short: link names are at most 15 characters
        self.bridge = f"{tag}br"
        self.gateway = f"{subnet}.254"

    def namespace(self, k: int) -> str:
        return f"{self.tag}-node{k}"

    def address(self, k: int) -> str:
        return f"{self.subnet}.{k}"

    def enter(self, k: int, cmd: list[str]) -> list[str]:
        """``cmd`` run in node ``k``'s network namespace, nothing else changed.

        ``nsenter --net`` and not ``ip netns exec``: the latter also gives the process a mount
        namespace with a fresh /sys, where slurmd finds no cgroup file system and refuses to start.
        """
        return ["nsenter", f"--net=/run/netns/{self.namespace(k)}", *cmd]

    def up(self) -> NodeNetwork:
        try:
            ip("link", "add", self.bridge, "type", "bridge")
            ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
            ip("link", "set", self.bridge, "up")
            for k in range(1, self.count + 1):
                ns, host_end = self.namespace(k), f"{self.tag}v{k}"
                ip("netns", "add", ns)
                ip("link", "set", "lo", "up", namespace=ns)
                ip("link", "add", host_end, "type", "veth", "peer", "name", "eth0", "netns", ns)
                ip("link", "set", host_end, "master", self.bridge)
                ip("link", "set", host_end, "up")
                ip("addr", "add", f"{self.address(k)}/24", "dev", "eth0", namespace=ns)
                ip("link", "set", "eth0", "up", namespace=ns)
        except BaseException:
            self.down()
            raise
        return self

    def down(self) -> None:
        """Remove the namespaces (their veths go with them) and the bridge; no error if absent."""
        present = set(namespaces())
        for k in range(1, self.count + 1):
            if self.namespace(k) in present:
                subprocess.run(["ip", "netns", "del", self.namespace(k)], check=False)
        # a veth's host end goes with its namespace, but not always at once: remove it too
        for link in links():
            if link.startswith(self.tag):
                subprocess.run(["ip", "link", "del", link], capture_output=True, check=False)

    def leftovers(self) -> list[str]:
        """Namespaces or links of this network still present (empty after ``down()``)."""
        ours = [self.namespace(k) for k in range(1, self.count + 1)]
        left = [ns for ns in namespaces() if ns in ours]
        return left + [link for link in links() if link.startswith(self.tag)]


class MultiNodeSlurm(LocalSlurm):
    """A Slurm of ``count`` nodes ``node1..nodeN``, each slurmd in its own network namespace."""

    def __init__(self, root: str | Path, count: int = 2, subnet: str | None = None):
        super().__init__(root)
        tag = f"pr{os.getpid() % 100000}"
        # a subnet of 10.200-249.x chosen from the PID, so two test runs do not collide
        self.network = NodeNetwork(count, subnet or f"10.{200 + os.getpid() % 50}.{os.getpid() % 250}", tag)
        self.ctld_host = socket.gethostname().split(".")[0]  # slurmctld checks it is this host
        self.ctld_addr = self.network.gateway

    def nodes(self) -> dict[str, str]:
        return {f"node{k}": self.network.address(k) for k in range(1, self.network.count + 1)}

    def start(self, timeout_s: float = 60.0) -> MultiNodeSlurm:
        if os.geteuid() != 0:
            raise SlurmUnavailable("the namespaced nodes need root (ip netns)")
        self.network.up()
        try:
            super().start(timeout_s)
        except BaseException:
            self.network.down()
            raise
        return self

    def _start_slurmds(self) -> None:
        for k, name in enumerate(self.nodes(), start=1):
            self._spawn(
                f"slurmd-{name}",
                self.network.enter(k, [binary("slurmd"), "-D", "-N", name, "-f", str(self.conf)]),
            )

    def in_node(self, name: str, cmd: list[str]) -> list[str]:
        """``cmd`` run inside node ``name``'s namespace (for processes started outside Slurm)."""
        return self.network.enter(list(self.nodes()).index(name) + 1, cmd)

    def stop(self) -> None:
        try:
            super().stop()
        finally:
            self.network.down()
