"""A spare while it waits (tier (b): ``DynamicRendezvous`` handlers in threads on an
in-memory store, ``memcluster``): its fence stands down each time it goes back to waiting,
and a restart round waits for a queued spare that beats but never joins only so long.

A ``GatedStore`` holds some of one node's writes (its heartbeats, or its take of a slot)
until the test opens the gate: the pause of a SIGSTOPped beat thread, a main thread stuck
while its heartbeat thread goes on. Every hold is bounded (``WAIT``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import replace

import pytest

from phalanx.errors import NotNeeded, RendezvousError
from phalanx.rendezvous.api import EventKind
from phalanx.rendezvous.dynamic.handler import DynamicRendezvous
from phalanx.rendezvous.settings import RendezvousSettings
from support.launch import wait_for
from support.memcluster import FAST, WAIT, Cluster, Join, agreed, crash, wait_event
from support.memory_store import MemoryServer, MemoryStore


class GatedStore(MemoryStore):
    """A node's store handle whose writes to keys containing ``held`` wait while the gate
    is shut (at most ``WAIT``)."""

    def __init__(self, server: MemoryServer) -> None:
        super().__init__(server)
        self.held = "\0"  # matches no key until a test says which
        self.opened = threading.Event()
        self.opened.set()
        self.holding = 0  # writes waiting at the gate now

    def set(self, key: str, value: bytes) -> None:
        self._hold(key)
        super().set(key, value)

    def add(self, key: str, amount: int) -> int:
        self._hold(key)
        return super().add(key, amount)

    def _hold(self, key: str) -> None:
        if self.held in key:
            self.holding += 1
            self.opened.wait(WAIT)
            self.holding -= 1


def gated(
    cluster: Cluster, name: str, nnodes: tuple[int, int], settings: RendezvousSettings
) -> tuple[DynamicRendezvous, GatedStore]:
    """A node like ``cluster.node`` on a ``GatedStore`` (shut down with the cluster)."""
    store = GatedStore(cluster.server)
    handler = DynamicRendezvous(
        store, run_id="job", min_nodes=nnodes[0], max_nodes=nnodes[1], addr=f"addr-{name}",
        hostname=name, settings=settings,
    )  # fmt: skip
    cluster.handlers.append(handler)
    return handler, store


@pytest.fixture
def stores() -> Iterator[list[GatedStore]]:
    """Gated stores a test shuts: opened again before the cluster shuts down."""
    made: list[GatedStore] = []
    yield made
    for store in made:
        store.opened.set()


def test_a_spare_that_lost_the_race_for_a_slot_waits_with_its_fence_down(
    cluster: Cluster, stores: list[GatedStore]
) -> None:
    """Three nodes at --nnodes 2:2 started together: the third takes slot 3 of round 0 and
    waits as a spare. Its fence must stand down again (it armed when the node took its
    slot): its beats then stall for longer than fence_after (a pause, as SIGSTOP) and it
    must not fence itself; when a member is lost, it is in the restart round."""
    handlers = [gated(cluster, n, (2, 2), FAST) for n in "abc"]
    stores.extend(store for _, store in handlers)
    for _, store in handlers:  # all three take a slot of round 0: one gets slot 3
        store.held, store.opened = "/r0/joined", threading.Event()
    joins = [Join(h) for h, _ in handlers]
    wait_for(lambda: all(store.holding for store in stores), WAIT, "three at round 0's door")
    for store in stores:
        store.opened.set()
    wait_for(lambda: sum(j.done() for j in joins) == 2, WAIT, "round 0 with two nodes")
    (spare, store), join = next(
        (h, j) for h, j in zip(handlers, joins, strict=True) if not j.done()
    )
    members = [h for (h, _), j in zip(handlers, joins, strict=True) if j.done()]
    fence = spare.fence()
    assert fence is not None
    wait_for(lambda: not fence.armed, 5, "the spare's fence standing down")
    store.held, store.opened = "/hb/", threading.Event()  # its beats stall...
    time.sleep(FAST.heartbeat_timeout - 2 + 1.5)  # ... past fence_after (heartbeat_timeout - 2)
    store.opened.set()
    time.sleep(2 * FAST.heartbeat_interval)
    assert fence.reason is None, fence.reason
    crash(members[1])
    wait_event(members[0], EventKind.NODE_LOST)
    results = [Join(members[0]).result(), join.result()]
    agreed(results)
    assert results[0].round == 1 and results[0].num_nodes == 2


def test_a_restart_round_waits_for_a_spare_that_beats_but_never_joins_only_so_long(
    cluster: Cluster, stores: list[GatedStore]
) -> None:
    """--nnodes 1:2, a spare queued for round 1 whose main thread is stuck at the door (its
    take of a slot held: a full stderr pipe, a slow run directory) while its heartbeat
    thread beats on. A member is lost: the restart round waits past its last call for the
    spare, but only ``heartbeat_timeout`` more, then runs with the survivor -- not until
    join_timeout (60 s here; the bound below only catches that)."""
    settings = replace(FAST, join_timeout=60)
    a, b = (cluster.node(n, nnodes=(1, 2), settings=settings) for n in "ab")
    agreed([j.result() for j in [Join(a), Join(b)]])
    spare, store = gated(cluster, "c", (1, 2), settings)
    stores.append(store)
    store.held, store.opened = "/r1/joined", threading.Event()
    stuck = Join(spare)
    queued = a._board.keys.queued(1, 1)
    wait_for(lambda: a._store.get(queued) is not None, WAIT, "the spare queued for round 1")
    crash(b)
    wait_event(a, EventKind.NODE_LOST)
    restart = Join(a)
    wait_for(restart.done, settings.join_timeout / 2, "the restart round without the spare")
    result = restart.result()
    assert (result.round, result.num_nodes) == (1, 1)
    assert store.holding == 1 and not stuck.done()  # it was stuck at the door all along


@pytest.mark.parametrize("job", ["fails", "finishes"])
def test_a_member_back_too_late_for_a_place_is_no_spare_when_the_job_fails(
    cluster: Cluster, stores: list[GatedStore], job: str
) -> None:
    """--nnodes 2:2 with a spare. Member a's beats stall past heartbeat_timeout: it fences
    itself, b counts it lost and round 1 forms at MAX with the spare. a comes back
    (``rejoin``) and waits for round 2 like a spare; the job then fails (b gives up). a ran
    workers in this job: it must end as a failure (its tally is reported), not exit 0 as
    "not needed"; its fence stands down while it waits. When the job finishes instead, a
    ends with exit 0 (``NotNeeded``, waited to rejoin): it used to end 1, failed, in a job
    that succeeded (the c10d soak's member back from a link flap)."""
    a, store = gated(cluster, "a", (2, 2), FAST)
    stores.append(store)
    b = cluster.node("b")
    agreed([j.result() for j in [Join(a), Join(b)]])
    c = cluster.node("c")
    spare = Join(c)
    wait_for(lambda: b._store.get(b._board.keys.queued(1, 1)) is not None, WAIT, "c queued")
    store.held, store.opened = "/hb/", threading.Event()  # a pause: a's beats stall
    wait_event(b, EventKind.NODE_LOST)
    after = [Join(b).result(), spare.result()]
    agreed(after)
    fence = a.fence()
    assert fence is not None
    wait_for(lambda: fence.reason is not None, WAIT, "a fencing itself")
    store.opened.set()
    assert a.rejoin()
    back = Join(a)
    wait_for(lambda: b._store.get(b._board.keys.queued(2, 1)) is not None, WAIT, "a queued")
    wait_for(lambda: not fence.armed, WAIT, "a's fence standing down while it waits")
    time.sleep(1.0)  # a sees round 1 run at MAX (its first look, at once) before the end
    if job == "finishes":
        for node in (b, c):
            node.report_done(True)
        wait_for(back.done, WAIT, "a told that the job ended")
        with pytest.raises(NotNeeded, match="the job finished while this node waited to rejoin"):
            back.result()
        return
    b.report_done(False)  # the job fails for good
    wait_for(back.done, WAIT, "a told that the job ended")
    with pytest.raises(RendezvousError, match="the job stopped"):
        back.result()
