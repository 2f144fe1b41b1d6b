"""Hosts for multi-node tests: network namespaces where they can be made, else loopback.

Both offer ``addr(i)`` (the address node i is reached at) and ``command(i, argv)`` (argv run
on node i), so a scenario is written once and runs on whichever is available.
"""

from __future__ import annotations

from collections.abc import Sequence


class Loopback:
    """Every "node" is this machine; nodes are told apart by their processes and ports."""

    kind = "loopback"

    def addr(self, i: int) -> str:
        return "127.0.0.1"

    def command(self, i: int, argv: Sequence[str]) -> list[str]:
        return list(argv)

    def env(self) -> dict[str, str]:
        return {}


class NamespaceHosts:
    """Adapter over ``netns.NetNamespaces``: Gloo is pinned to each namespace's eth0, since a
    namespace's hostname resolves to the host's address, which its peers cannot reach."""

    kind = "netns"

    def __init__(self, spaces: object) -> None:
        self._spaces = spaces

    def addr(self, i: int) -> str:
        return str(self._spaces.addr(i))  # type: ignore[attr-defined]

    def command(self, i: int, argv: Sequence[str]) -> list[str]:
        return list(self._spaces.command(i, argv))  # type: ignore[attr-defined]

    def env(self) -> dict[str, str]:
        return {"GLOO_SOCKET_IFNAME": "eth0"}
