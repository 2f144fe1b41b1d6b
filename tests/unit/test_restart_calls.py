"""What a restart round costs each node, counted in round trips on the in-memory store with
reads batched as the agent store batches them (``BatchedStore``): the same members in the
same order as the round before, O(1) calls per node, and no walk over the last round's
members while they still rejoin (``Abandoned.settle_lost``: at 1,024 nodes that walk cost
every waiting node a read per member each time it woke). The real agent store's
``wait_get``: ``tests/rendezvous/test_round_trips.py``; the load of 1,024 real clients:
``benchmarks/store_load.py``."""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from phalanx.rendezvous.api import NodeInfo
from phalanx.rendezvous.dynamic.abandoned import Abandoned
from phalanx.rendezvous.dynamic.board import Board, Decision
from phalanx.rendezvous.dynamic.formation import RoundFormer
from phalanx.rendezvous.dynamic.keys import Keys
from phalanx.rendezvous.dynamic.liveness import Liveness
from phalanx.rendezvous.dynamic.members import Arrival, Membership
from phalanx.rendezvous.dynamic.records import encode
from support.memcluster import FAST, WAIT
from support.memory_store import MemoryServer, MemoryStore

# Waits end only by the writes they wait for (not by a heartbeat interval running out on a
# loaded machine), so the count is the protocol's, not the machine's.
PATIENT = replace(FAST, heartbeat_interval=5.0, heartbeat_timeout=60.0, close_timeout=WAIT)


class Counted(MemoryStore):
    """A handle that counts its calls as round trips (a ``get_many`` or ``wait_get`` is one,
    as on the agent store) and which keys it read."""

    def __init__(self, server: MemoryServer) -> None:
        super().__init__(server)
        self.calls = 0
        self.read: Counter[str] = Counter()  # the part of a key after the run's prefix

    def _note(self, *read: str) -> None:
        self.calls += 1
        self.read.update(key.split("/", 3)[-1] for key in read)

    def get(self, key: str) -> bytes | None:
        self._note(key)
        return MemoryStore.get(self, key)

    def get_many(self, keys: list[str]) -> list[bytes | None]:
        self._note(*keys)
        return [MemoryStore.get(self, key) for key in keys]

    def wait_get(
        self, keys: list[str], timeout: float, reads: list[str]
    ) -> tuple[bool, list[bytes | None]]:
        self._note(*reads)
        found = MemoryStore.wait(self, keys, timeout)
        return found, [MemoryStore.get(self, key) for key in reads]

    def set(self, key: str, value: bytes) -> None:
        self._note()
        super().set(key, value)

    def add(self, key: str, amount: int) -> int:
        self._note()
        return super().add(key, amount)

    def compare_set(
        self, key: str, expected: bytes | None, desired: bytes
    ) -> tuple[bool, bytes | None]:
        self._note()
        return super().compare_set(key, expected, desired)

    def wait(self, keys: list[str], timeout: float) -> bool:
        self._note()
        return super().wait(keys, timeout)


def _rounds(n: int) -> tuple[list[Membership], list[Membership], list[Counted], list[int]]:
    """n nodes form round 0, then all rejoin round 1 at once; (each node's round 0, its
    round 1, its handle: counted from round 1 on; each node's calls in round 0)."""
    server = MemoryServer()
    stores = [Counted(server) for _ in range(n)]
    boards = [Board(store, Keys("job"), f"node-{i}") for i, store in enumerate(stores)]
    formers = [RoundFormer(b, PATIENT, n, n) for b in boards]
    arrivals = [Arrival(b.node_id, f"host{i}", "127.0.0.1", 1) for i, b in enumerate(boards)]
    with ThreadPoolExecutor(n) as pool:
        first = list(pool.map(lambda i: formers[i].form(arrivals[i], None, None), range(n)))
        calls = [store.calls for store in stores]
        for store in stores:
            store.calls, store.read = 0, Counter()
        again = list(pool.map(lambda i: formers[i].form(arrivals[i], *first[i][:2]), range(n)))
    return [m for m, _, _ in first], [m for m, _, _ in again], stores, calls


def test_a_restart_round_keeps_its_members_and_costs_each_node_o1_calls() -> None:
    for n in (4, 12):
        before, after, stores, _ = _rounds(n)
        assert {m.round for m in after} == {1}
        assert len({m.node_ids for m in after}) == 1  # every node agrees
        assert after[0].node_ids == before[0].node_ids  # the same members, in the same ranks
        # The node in slot 1 assembles the membership (it reads the n arrivals in one call);
        # every other node: open the round (1 once it finds the pointer moved, 2 before: see
        # test_round_trips), join (2), settle its old place (2), read the round's state (1),
        # wait for the last settle (1), the membership (1), the master port (1); the first
        # to open moves the round pointer, the last to settle marks the round settled, the
        # last to join closes it: one call each. It was 16 and more.
        counts = sorted(store.calls for store in stores)
        assert counts[-2] <= 11, counts
        assert counts[-1] <= 15, counts
        for store in stores:  # no walk over round 0's members while they rejoin
            assert not [k for k in store.read if k.startswith(("r0/fate/", "hb/"))], store.read
            # Nor round 0's membership (a thousand nodes' worth): the assembler takes the
            # restart count from its own.
            assert store.read["r0/members"] == 0, store.read
        # Every member but the assembler takes its membership's node facts from round 0's
        # (the same nodes in the same ranks), not a NodeInfo built anew per node.
        pairs = zip(after, before, strict=True)
        reused = [a.nodes is b.nodes and a.node_ids is b.node_ids for a, b in pairs]
        assert sum(reused) >= n - 1, reused


def test_a_first_rounds_master_comes_with_its_membership() -> None:
    """In a first round the first arrival assembles the membership and is node rank 0: it
    publishes the master port before the membership, and every other node reads both in
    one call (it waited for the master in a call of its own: 9 calls each, now 8)."""
    for n in (4, 12):
        _, _, _, calls = _rounds(n)
        assert sorted(calls)[-2] <= 8, calls


def test_a_membership_read_like_another_shares_only_what_is_the_same() -> None:
    nodes = tuple(NodeInfo(r, f"host{r}", f"10.0.0.{r}", 8) for r in range(3))
    before = Membership(0, 0, ("a", "b", "c"), nodes, ({"v": "1"},) * 3)
    body = replace(before, round=1, restart_count=1).to_json()
    same = Membership.from_json(body, like=before)
    assert same == replace(before, round=1, restart_count=1) == Membership.from_json(body)
    assert same.nodes is before.nodes and same.fingerprints is before.fingerprints
    body["addrs"][2] = "10.0.0.9"  # a node came back on another address
    moved = Membership.from_json(body, like=before)
    assert moved == Membership.from_json(body) and moved.nodes[2].addr == "10.0.0.9"
    assert moved.nodes is not before.nodes and moved.node_ids is before.node_ids


def test_the_walk_over_unsettled_members_waits_for_the_settling_to_stand_still() -> None:
    """``settle_lost`` looks at no member while the settled count moves; once it stands still
    it reads the places not known settled in one call and judges the unsettled members, and
    finds a silent one lost ``heartbeat_timeout`` after its first look."""
    server = MemoryServer()
    writer = Board(MemoryStore(server), Keys("job"), "w")
    nodes = tuple(NodeInfo(r, f"host{r}", f"10.0.0.{r}", 1) for r in (0, 1))
    writer.close(0, Decision(count=2))
    members = Membership(0, 0, ("m0", "m1"), nodes)
    writer.store.set(writer.keys.round(0, "members"), encode(members.to_json()))
    for node_id in ("m0", "m1"):
        writer.store.set(writer.keys.heartbeat(node_id), b"1")
    writer.open_round(1)
    store, now = Counted(server), [1000.0]
    waiting = Abandoned(Board(store, Keys("job"), "x"), PATIENT, 1, lambda: now[0])

    waiting.settle_lost(0, 0)  # the first look: the count only
    assert store.calls == 0
    waiting.settle_lost(0, 0)  # it stood still: walk (the round's members, read once)
    assert store.read["r0/fate/0"] == store.read["r0/fate/1"] == 1
    assert store.read["hb/m0"] == store.read["hb/m1"] == 1
    writer.settle(0, 1, 2, "rejoined")
    calls = store.calls
    waiting.settle_lost(0, 1)  # it moved: no walk
    assert store.calls == calls
    waiting.settle_lost(0, 1)  # still: both places in one call, m0's beat (m1 is settled)
    waiting.settle_lost(0, 1)  # m1 known settled: m0's place and beat only
    assert store.calls == calls + 4
    assert store.read["r0/fate/1"] == 2 and store.read["r0/fate/0"] == 3
    assert store.read["hb/m0"] == 3 and store.read["hb/m1"] == 1
    assert writer.store.get(writer.keys.fate(0, 0)) is None  # silent, not yet for long
    now[0] += PATIENT.heartbeat_timeout
    waiting.settle_lost(0, 1)
    assert (writer.store.get(writer.keys.fate(0, 0)) or b"").startswith(b"lost:")
    assert writer.store.get(writer.keys.round(0, "all_settled")) is not None


def test_a_joining_nodes_watch_makes_no_call_until_it_follows_the_new_round() -> None:
    """While its node joins the next round, the watch thread's duties wait (the old round's
    next event, its counters, the heartbeat of the next node in the ring: one call each
    heartbeat interval before, beside the beat's, from every node through the whole restart
    round); once it follows the new round they go out in one call an interval."""
    server, now = MemoryServer(), [1000.0]
    store, peer = Counted(server), Board(MemoryStore(server), Keys("job"), "b")
    nodes = tuple(NodeInfo(r, f"host{r}", f"10.0.0.{r}", 1) for r in range(3))
    liveness = Liveness(Board(store, Keys("job"), "a"), PATIENT, clock=lambda: now[0])
    liveness.follow(Membership(0, 0, ("a", "b", "c"), nodes), 0)
    liveness.announce()  # as next_round does
    for beat in range(4):
        peer.store.set(peer.keys.heartbeat("b"), str(beat).encode())  # the next node beats
        assert liveness.tick() is False  # (asked nothing: the beats speak for the store)
        now[0] += PATIENT.heartbeat_interval
    assert store.calls == 0, store.read
    liveness.follow(Membership(1, 0, ("a", "b", "c"), nodes), 0)
    now[0] += PATIENT.heartbeat_interval  # (the new round's duties begin an interval on)
    for beat in range(4, 8):
        peer.store.set(peer.keys.heartbeat("b"), str(beat).encode())
        assert liveness.tick() is True
        now[0] += PATIENT.heartbeat_interval
    assert store.calls == 4, store.read
    assert store.read["hb/b"] == store.read["r1/events"] == store.read["r1/ev/1"] == 4, store.read
