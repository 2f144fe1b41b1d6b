"""Faults on one network-namespace node's link (``netns.NetNamespaces``), no netem: random
loss with iptables' ``statistic`` match, a slow link with a ``tbf`` rate limit."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from typing import Protocol

from support.netns import NetNamespaces


class Commands(Protocol):
    """Hosts that run a command on node i (``NetNamespaces``, ``hosts.NamespaceHosts``)."""

    def command(self, i: int, argv: Sequence[str]) -> list[str]: ...


def lossy(spaces: NetNamespaces, i: int, share: float, *, on: bool) -> None:
    """Drop ``share`` of node i's packets at random, in and out of its eth0 (or stop)."""
    rule = ["-m", "statistic", "--mode", "random", "--probability", f"{share}", "-j", "DROP"]
    for chain, side in (("INPUT", "-i"), ("OUTPUT", "-o")):
        argv = ["iptables", "-A" if on else "-D", chain, side, "eth0", *rule]
        subprocess.run(spaces.command(i, argv), check=True, capture_output=True)


def rate_limit(spaces: NetNamespaces, i: int, rate: str) -> None:
    """Limit what node i sends on its eth0 to ``rate`` (tc's units: ``2mbit``); the queue
    holds at most 200 ms of it. Removed with the namespace."""
    argv = ["tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", rate,
            "burst", "16kb", "latency", "200ms"]  # fmt: skip
    subprocess.run(spaces.command(i, argv), check=True, capture_output=True)


def deaf_to_closes(spaces: NetNamespaces, i: int, peer: str, *, on: bool) -> None:
    """Node i hears no FIN and no RST from ``peer`` (or again, ``on=False``): a peer's
    sockets that close say nothing, as after a link flap that lost them (TCP sends them
    again only on its backoff: tens of seconds later) or on a transport with no close to
    hear (NCCL over InfiniBand). Whatever else ``peer`` sends still arrives."""
    for flags in ("FIN", "RST"):
        match = ["-s", peer, "-p", "tcp", "--tcp-flags", flags, flags, "-j", "DROP"]
        argv = ["iptables", "-I" if on else "-D", "INPUT", "-i", "eth0", *match]
        subprocess.run(spaces.command(i, argv), check=True, capture_output=True)


def refuse(hosts: Commands, i: int, port: int, peer: str, *, on: bool) -> None:
    """Node i answers ``peer``'s connections to ``port`` with a reset (or again accepts
    them, ``on=False``): the peer is told "refused" at once and tries again on its own
    schedule, so a test can hold it back and let it through at a moment it chooses."""
    match = ["-s", peer, "-p", "tcp", "--dport", str(port)]
    argv = ["iptables", "-I" if on else "-D", "INPUT", *match, "-j", "REJECT",
            "--reject-with", "tcp-reset"]  # fmt: skip
    subprocess.run(hosts.command(i, argv), check=True, capture_output=True)


def refused(hosts: Commands, i: int, port: int, peer: str) -> int:
    """How many of ``peer``'s packets to ``port`` node i has refused (``refuse``'s rule)."""
    argv = ["iptables", "-L", "INPUT", "-n", "-v", "-x"]
    listed = subprocess.run(hosts.command(i, argv), check=True, capture_output=True, text=True)
    rows = [line.split() for line in listed.stdout.splitlines()]
    return sum(int(row[0]) for row in rows if "REJECT" in row and peer in row
               and f"dpt:{port}" in row)  # fmt: skip


def connected(hosts: Commands, i: int, port: int, peer: str) -> bool:
    """Whether ``peer`` holds an established connection to node i's ``port`` (the kernel
    completes the handshake even while the listening process is stopped)."""
    argv = ["ss", "-Htn", "state", "established", f"( sport = :{port} )"]
    listed = subprocess.run(hosts.command(i, argv), check=True, capture_output=True, text=True)
    return any(f"{peer}:" in line.split()[-1] for line in listed.stdout.splitlines())
