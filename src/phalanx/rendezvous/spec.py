"""What the launcher hands the rendezvous registry: one frozen, backend-neutral description."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from phalanx.parsing import parse_endpoint
from phalanx.rendezvous.api import RendezvousHandler
from phalanx.rendezvous.fencing import FenceTiming, counters_timing
from phalanx.rendezvous.settings import RendezvousSettings, known_keys, unknown_key


@dataclass(frozen=True)
class RendezvousSpec:
    """The rendezvous part of the command line, converted (torchrun's flag in brackets)."""

    backend: str  # --rdzv-backend
    run_id: str  # --rdzv-id
    min_nodes: int  # --nnodes MIN[:MAX]
    max_nodes: int
    endpoint: str = ""  # --rdzv-endpoint host[:port]
    conf: Mapping[str, str] = field(default_factory=dict)  # --rdzv-conf
    node_rank: int | None = None  # --node-rank (static)
    master_addr: str = "127.0.0.1"  # --master-addr (static: where node 0 hosts the store)
    master_port: int = 29500  # --master-port (static)
    local_addr: str | None = None  # --local-addr
    # The workers' MASTER_PORT in every round, where the program was given one and uses it
    # (phalanx.spawn's master_port); None: node 0 picks a free port each round.
    worker_port: int | None = None
    # What this node announces of its code and versions (phalanx.consistency.fingerprint).
    fingerprint: Mapping[str, str] = field(default_factory=dict)
    # --allow-mismatch: a node whose fingerprint differs from a running job's joins it anyway.
    allow_mismatch: bool = False
    # --max-restarts: spent by a node waiting to join when every member of the running round
    # is gone (``dynamic.abandoned``); members claim theirs through ``Round.claim_restart``.
    max_restarts: int = 0


def heartbeat_fencing(settings: RendezvousSettings, options: Any) -> FenceTiming:
    """Fencing by heartbeat counters (every backend but one with leases)."""
    return counters_timing(settings.heartbeat_interval, settings.heartbeat_timeout)


@dataclass(frozen=True)
class Backend:
    """One entry of the registry."""

    name: str
    summary: str
    # The backend's own options, parsed once, and the usage problems with the spec beyond
    # the shared settings: the endpoint and every --rdzv-conf key that is not a settings key
    # (unknown ones included). The options (the backend's own type) are what ``open`` gets.
    check: Callable[[RendezvousSpec], tuple[Any, list[str]]]
    # Connect (or host) and build the handler; may raise StoreUnavailable.
    open: Callable[[RendezvousSpec, RendezvousSettings, Any], RendezvousHandler]
    # How a node of this backend proves it is alive, for fencing (checked before ``open``,
    # so settings that leave no time to fence are a usage error).
    fencing: Callable[[RendezvousSettings, Any], FenceTiming] = heartbeat_fencing
    # Its own --rdzv-conf keys (beside the settings'), for the check on one node, where the
    # backend is never opened.
    keys: frozenset[str] = frozenset()


def split_endpoint(text: str, default_port: int, what: str = "--rdzv-endpoint") -> tuple[str, int]:
    """``host[:port]`` or ``[ipv6]:port`` (empty: ``localhost``, as torchrun) -> (host, port).

    Raises ``ValueError`` with the message to show.
    """
    if not text.strip():
        return "localhost", default_port
    endpoint = parse_endpoint(text, what)
    return endpoint.host, default_port if endpoint.port is None else endpoint.port


def unknown_keys(spec: RendezvousSpec, own: frozenset[str], skip: frozenset[str]) -> list[str]:
    """A problem for each --rdzv-conf key that neither the settings nor the backend know,
    naming the key only (its value may be a misspelt secret's)."""
    known = known_keys(spec.backend, own)
    return [
        unknown_key(key, spec.backend, known)
        for key in spec.conf
        if key not in own and key not in skip
    ]
