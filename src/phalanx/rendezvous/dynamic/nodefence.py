"""A node's fence on its rendezvous store (``phalanx.rendezvous.fencing``): how the node
proves it is alive there, and the fence that guards its workers."""

from __future__ import annotations

from phalanx.errors import UsageError
from phalanx.rendezvous.fencing import (
    Fence,
    FenceTiming,
    counters_timing,
    lease_timing,
    timing_problem,
)
from phalanx.rendezvous.settings import RendezvousSettings
from phalanx.rendezvous.stores.base import KVStore, LeasedStore, RenewingStore


def fence_timing(store: KVStore, settings: RendezvousSettings) -> FenceTiming | None:
    """How a node on ``store`` proves it is alive, for fencing: its lease's renewals, or its
    heartbeats; None for a leased store that does not say when it renewed."""
    if isinstance(store, RenewingStore):
        return lease_timing(store.lease_ttl)
    if isinstance(store, LeasedStore):
        return None
    return counters_timing(settings.heartbeat_interval, settings.heartbeat_timeout)


def fence_for(store: KVStore, settings: RendezvousSettings) -> Fence | None:
    """The node's fence (no I/O: a leased store is only told to report its renewals)."""
    timing = fence_timing(store, settings)
    if timing is None:
        return None
    if (problem := timing_problem(timing)) is not None:
        raise UsageError(problem)
    fence = Fence(timing)
    if isinstance(store, RenewingStore):
        store.on_renewed(fence.proved_alive, timing.beat)
    return fence
