"""Which hosts of ``--hosts``/``--hostfile`` the controller starts: every host but those an
exclusion file lists (``--exclude-file``: a node excluded by an earlier run, or by hand).

The hosts are taken in the file's order, so an excluded host's place goes to the next host
of the file: with ``--nnodes MIN:MAX`` the first MAX hosts started are the members and the
ones after them wait as spares (with MAX 1 only the first host is started: a one-node job
has no rendezvous store a spare could wait at); without ``--nnodes`` every host started is
a member. An
exclusion names a node by the address its agent was given (``--local-addr``: here the
host's ssh address) or, without one, by its host name (here the name in the host list, the
``user@`` left out): ``exclusion.Exclusion.matches``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from phalanx.config import HostSlots
from phalanx.exclusion import Exclusion, NodeName, exclusion_of


@dataclass(frozen=True)
class Skipped:
    """A host not started: its name, address and the exclusion that names it."""

    name: str
    addr: str
    exclusion: Exclusion
    file: Path

    def line(self) -> str:
        return (
            f"phalanx: {self.name} ({self.addr}) is not started: excluded in {self.file} "
            f"({self.exclusion.reason or 'no reason given'}); remove its line there to let it in"
        )


def split_excluded(
    entries: tuple[HostSlots, ...], addrs: list[str], exclude_file: Path | None
) -> tuple[list[tuple[HostSlots, str]], list[Skipped]]:
    """(the hosts to start with their addresses, in the list's order; the hosts skipped)."""
    started: list[tuple[HostSlots, str]] = []
    skipped: list[Skipped] = []
    for entry, addr in zip(entries, addrs, strict=True):
        found = None
        if exclude_file is not None:
            found = exclusion_of([exclude_file], NodeName(entry.host.rpartition("@")[2], addr))
        if found is None or exclude_file is None:
            started.append((entry, addr))
        else:
            skipped.append(Skipped(entry.name, addr, found, exclude_file))
    return started, skipped


def members_text(host_nodes: tuple[int, int] | None, started: int) -> tuple[str, int]:
    """(``--nnodes`` for the agents, how many started hosts wait as spares)."""
    if host_nodes is None:
        return str(started), 0
    low, high = host_nodes
    return (str(high) if low == high else f"{low}:{high}"), max(0, started - high)
