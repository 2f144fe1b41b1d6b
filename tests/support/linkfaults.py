"""Faults on one network-namespace node's link (``netns.NetNamespaces``), no netem: random
loss with iptables' ``statistic`` match, a slow link with a ``tbf`` rate limit."""

from __future__ import annotations

import subprocess

from support.netns import NetNamespaces


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
