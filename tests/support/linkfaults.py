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
