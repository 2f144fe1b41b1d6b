"""--hosts/--hostfile: this process is the controller, starting an agent on every host over
ssh (phalanx.hosts)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class HostSlots:
    """One host of a host list (``hosts.hostfile`` reads them) and its worker count."""

    host: str  # the ssh destination, as written
    slots: int  # workers on that host

    @property
    def name(self) -> str:
        """The host without the user: what console lines and reports are labelled with."""
        return self.host.rpartition("@")[2]


@dataclass(frozen=True)
class RemoteConfig:
    hosts: tuple[HostSlots, ...] = ()  # empty: no controller, this process is the agent
    # With hosts: --nnodes MIN:MAX when given (the hosts started beyond MAX wait as spares);
    # None: every host started is a member (phalanx.hosts.plan).
    host_nodes: tuple[int, int] | None = None
    ssh_config: Path | None = None
    # What the agents are sent, beside the job's token.
    forward_env: tuple[tuple[str, str], ...] = ()
