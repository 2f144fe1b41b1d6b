"""The event reader of ``Liveness`` against writers that race it, driven by hand.

No thread and no sleep: the test calls ``tick()`` itself on a fake clock, and a store handle
runs another node's write at the exact point of the interleaving under test.
"""

from __future__ import annotations

from collections.abc import Callable

from phalanx.rendezvous.api import EventKind, JobEvent, NodeInfo
from phalanx.rendezvous.dynamic.board import Board
from phalanx.rendezvous.dynamic.keys import Keys
from phalanx.rendezvous.dynamic.liveness import Liveness
from phalanx.rendezvous.dynamic.members import Membership
from phalanx.rendezvous.dynamic.records import encode
from phalanx.rendezvous.settings import RendezvousSettings
from support.memory_store import MemoryServer, MemoryStore

SETTINGS = RendezvousSettings(heartbeat_interval=1.0, heartbeat_timeout=10.0)
KEYS = Keys("job")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class RacingStore(MemoryStore):
    """A handle that runs ``race`` once, right after a read of ``key`` finds nothing."""

    def __init__(self, server: MemoryServer, key: str) -> None:
        super().__init__(server)
        self._key = key
        self.race: Callable[[], None] | None = None

    def get(self, key: str) -> bytes | None:
        value = super().get(key)
        if key == self._key and value is None and self.race is not None:
            race, self.race = self.race, None
            race()
        return value


def membership(round: int) -> Membership:
    # One member: the reader. Its ring has nobody else to judge, so only events matter.
    return Membership(round, 0, ("reader",), (NodeInfo(0, "reader", "addr", 1),))


def failure(rank: int) -> JobEvent:
    return JobEvent(EventKind.PEER_FAILED, rank, f"rank {rank} failed", {"rank": rank})


def setup(round: int = 0) -> tuple[Liveness, RacingStore, Board, Clock]:
    server = MemoryServer()
    store = RacingStore(server, KEYS.event(round, 1))
    clock = Clock()
    liveness = Liveness(Board(store, KEYS, "reader"), SETTINGS, clock=clock)
    writer = Board(MemoryStore(server), KEYS, "writer")
    return liveness, store, writer, clock


def test_an_entry_written_between_the_readers_two_reads_is_delivered() -> None:
    """The writer takes slot 1 and writes it just after the reader found slot 1 empty, long
    after the reader began waiting: the reader must not step over it as a dead writer's hole
    (it did, and the restart then waited for join_timeout)."""
    liveness, store, writer, clock = setup()
    liveness.follow(membership(0), 0)
    liveness.tick()  # slot 1 empty, nothing taken: no hole
    clock.now += SETTINGS.heartbeat_timeout + 1  # a quiet job, for longer than the timeout
    store.race = lambda: writer.post_event(0, failure(3), about="writer")
    liveness.tick()  # reads slot 1 (empty), the writer appends, then the counter shows 1
    liveness.tick()
    event = liveness.next_event()
    assert event is not None and event.failure == {"rank": 3}


def test_a_slot_taken_and_never_written_is_stepped_over_after_the_timeout() -> None:
    liveness, _, writer, clock = setup()
    liveness.follow(membership(0), 0)
    clock.now += SETTINGS.heartbeat_interval  # a round's duties begin an interval on
    writer.store.add(KEYS.round(0, "events"), 1)  # took slot 1, died before writing it
    writer.post_event(0, failure(2), about="writer")  # slot 2
    liveness.tick()  # the counter shows slot 1 taken: the hole's clock starts now
    assert liveness.next_event() is None
    clock.now += SETTINGS.heartbeat_timeout - 1
    liveness.tick()
    assert liveness.next_event() is None  # not yet: the writer may still be writing
    clock.now += 2
    liveness.tick()  # past the timeout, still absent: skipped, and slot 2 read
    liveness.tick()
    event = liveness.next_event()
    assert event is not None and event.failure == {"rank": 2}


def test_an_entry_written_late_but_before_the_skip_is_delivered() -> None:
    liveness, store, writer, clock = setup()
    liveness.follow(membership(0), 0)
    clock.now += SETTINGS.heartbeat_interval  # a round's duties begin an interval on
    slot = writer.store.add(KEYS.round(0, "events"), 1)  # slot 1 taken, entry not written yet
    liveness.tick()  # hole clock starts
    clock.now += SETTINGS.heartbeat_timeout + 1
    # The slow writer finishes right after the reader's ordinary read, before the skip.
    store.race = lambda: writer.store.set(KEYS.event(0, slot), _encoded(failure(4)))
    liveness.tick()
    event = liveness.next_event()
    assert event is not None and event.failure == {"rank": 4}


def test_follow_forgets_the_last_rounds_hole() -> None:
    liveness, _, writer, clock = setup()
    liveness.follow(membership(0), 0)
    writer.store.add(KEYS.round(0, "events"), 1)  # round 0: slot 1 taken, never written
    liveness.tick()
    clock.now += SETTINGS.heartbeat_timeout + 1
    liveness.follow(membership(1), 0)  # a new round before the hole was skipped
    writer.store.add(KEYS.round(1, "events"), 1)  # round 1: a writer takes slot 1 now
    liveness.tick()  # must start a new clock, not reuse round 0's
    writer.store.set(KEYS.event(1, 1), _encoded(failure(6)))
    liveness.tick()
    event = liveness.next_event()
    assert event is not None and event.failure == {"rank": 6}


def _encoded(event: JobEvent) -> bytes:
    """``event`` as ``Board.post_event`` writes it, for a writer that writes in two steps."""
    return encode(
        {
            "kind": event.kind.value,
            "node_rank": event.node_rank,
            "detail": event.detail,
            "failure": event.failure,
            "about": "writer",
            "nonce": "n",
        }
    )
