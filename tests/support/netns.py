"""Hosts for multi-node tests: network namespaces joined by a bridge, made and removed by tests.

Layout for ``count`` nodes, all names starting with a unique prefix (``phx-<pid>-<n>``; ``phx``
is ``$PHALANX_TEST_NETNS`` where set, so that people sharing a machine tell theirs apart):
a hub namespace ``<prefix>-hub`` holding bridge ``br0``, and per node a namespace
``<prefix>-<i>`` whose ``eth0`` is one end of a veth pair; the other end, ``v<i>``, sits in
the hub on the bridge. Node i has address ``10.213.<x>.<i + 1>/24`` (x from the pid): a
private test subnet that exists only inside these namespaces, so no packet reaches the
host's own network, and removing the namespaces removes every link with them.
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
from collections.abc import Sequence

_counter = itertools.count()
_OWNER = os.environ.get("PHALANX_TEST_NETNS", "phx")  # every name's first word


def unavailable_reason() -> str | None:
    """Why network namespaces cannot be made here (None: they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root (run as root, or see the loopback variants)"
    if shutil.which("ip") is None:
        return "the 'ip' command is missing (apt-get install -y iproute2)"
    probe = f"{_OWNER}-{os.getpid()}-probe"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


class NetNamespaces:
    def __init__(self, count: int) -> None:
        if not 1 <= count <= 8:
            raise ValueError(f"1..8 namespaces, not {count}")
        self.prefix = f"{_OWNER}-{os.getpid()}-{next(_counter)}"
        self.hub = f"{self.prefix}-hub"
        self.names = [f"{self.prefix}-{i}" for i in range(count)]
        self.subnet = f"10.213.{20 + os.getpid() % 200}"
        self._made: list[str] = []

    def addr(self, i: int) -> str:
        return f"{self.subnet}.{i + 1}"

    def create(self) -> None:
        """Make the namespaces and links; on failure, whatever was made is removed again."""
        try:
            self._add_namespace(self.hub)
            self._ip(self.hub, "link", "add", "br0", "type", "bridge")
            self._ip(self.hub, "link", "set", "br0", "up")
            for i, name in enumerate(self.names):
                self._add_namespace(name)
                self._ip(self.hub, "link", "add", f"v{i}", "type", "veth", "peer", "name", "eth0", "netns", name)  # fmt: skip
                self._ip(self.hub, "link", "set", f"v{i}", "master", "br0")
                self._ip(self.hub, "link", "set", f"v{i}", "up")
                self._ip(name, "addr", "add", f"{self.addr(i)}/24", "dev", "eth0")
                self._ip(name, "link", "set", "eth0", "up")
        except BaseException:
            self.destroy()
            raise

    def command(self, i: int, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside node i's namespace."""
        return ["ip", "netns", "exec", self.names[i], *argv]

    def cut(self, i: int) -> None:
        """Take node i off the network without a word: its peers get no reset, only silence."""
        self._ip(self.names[i], "link", "set", "eth0", "down")

    def heal(self, i: int) -> None:
        """Put node i back on the network after ``cut``."""
        self._ip(self.names[i], "link", "set", "eth0", "up")

    def drop(self, i: int) -> None:
        """Drop every packet node i sends to the others, with its link still up: blackhole
        routes (iproute2, no firewall needed) more specific than the subnet's. Nothing fails
        on node i (a connect or a send just gets no answer), and its peers hear nothing."""
        for half in ("0/25", "128/25"):
            self._ip(self.names[i], "route", "add", "blackhole", f"{self.subnet}.{half}")

    def silence(self, i: int, *, on: bool) -> None:
        """Drop every packet in and out of node i's eth0 with iptables (``on=False``: let
        them through again). Unlike ``drop`` nothing fails locally either: every send is
        accepted and gets no answer, so only the fence can end the node's workers."""
        for chain, side in (("INPUT", "-i"), ("OUTPUT", "-o")):
            argv = ["iptables", "-A" if on else "-D", chain, side, "eth0", "-j", "DROP"]
            subprocess.run(self.command(i, argv), check=True, capture_output=True)

    def destroy(self) -> None:
        """Remove every namespace made (their links go with them). Idempotent."""
        while self._made:
            subprocess.run(["ip", "netns", "del", self._made.pop()], capture_output=True)

    def leftovers(self) -> list[str]:
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        return [line.split()[0] for line in listed.splitlines() if line.startswith(self.prefix)]

    def _add_namespace(self, name: str) -> None:
        subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True)
        self._made.append(name)
        self._ip(name, "link", "set", "lo", "up")

    def _ip(self, namespace: str, *args: str) -> None:
        done = subprocess.run(["ip", "-n", namespace, *args], capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"ip -n {namespace} {' '.join(args)}: {done.stderr.strip()}")
