"""The multi-node handler a backend opens for a rendezvous spec (c10d, static, etcd)."""

from __future__ import annotations

from phalanx.rendezvous.dynamic.failover import Successors
from phalanx.rendezvous.dynamic.handler import DynamicRendezvous
from phalanx.rendezvous.lastword import Reach
from phalanx.rendezvous.settings import RendezvousSettings
from phalanx.rendezvous.spec import RendezvousSpec
from phalanx.rendezvous.stores.base import KVStore


def for_spec(
    store: KVStore,
    spec: RendezvousSpec,
    settings: RendezvousSettings,
    addr: str,
    where: str = "",
    reach: Reach | None = None,
    successors: Successors | None = None,
) -> DynamicRendezvous:
    """The handler a backend opens for ``spec`` over ``store`` (``addr``: this node's, as
    the others reach it; ``reach``: see ``DynamicRendezvous``). A static spec (a
    ``node_rank`` given) fixes the node count at ``max_nodes`` and this node's rank."""
    static = spec.node_rank is not None
    return DynamicRendezvous(
        store, run_id=spec.run_id, min_nodes=spec.max_nodes if static else spec.min_nodes,
        max_nodes=spec.max_nodes, addr=addr, settings=settings, worker_port=spec.worker_port,
        fixed_rank=spec.node_rank, fingerprint=spec.fingerprint, where=where,
        admit_mismatch=spec.allow_mismatch, reach=reach, successors=successors,
        max_restarts=spec.max_restarts,
    )  # fmt: skip
