"""Each agent store has an id of its own (``claim.STORE_KEY``), and a node recognises the
store it used by it (``backends.successor``): an agent started again at the lost store's
place serves the same run id with the same token, but is not taken for the job's store.
Real agent stores on loopback (the multinode test ``test_store_back`` injects the fault)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from phalanx.rendezvous.backends.claim import RUN_KEY, STORE_KEY, seed
from phalanx.rendezvous.backends.successor import AgentStoreSuccessors
from phalanx.rendezvous.dynamic.board import Board
from phalanx.rendezvous.dynamic.failover import Candidate
from phalanx.rendezvous.dynamic.keys import Keys
from phalanx.rendezvous.settings import RendezvousSettings
from phalanx.rendezvous.stores.agentstore import AgentKVStore, Token
from phalanx.rendezvous.stores.agentstore.client import OtherStore
from phalanx.rendezvous.stores.base import KVStore, StoreUnavailable

TOKEN = Token(b"identity", "the test")
RUN = "job"
HOST = "127.0.0.1"


@pytest.fixture
def served() -> Iterator[list[KVStore]]:
    """The stores a test serves, closed after it."""
    stores: list[KVStore] = []
    yield stores
    for store in stores:
        store.close()


def _serve(served: list[KVStore], port: int, keys: dict[str, bytes]) -> AgentKVStore:
    store = AgentKVStore.host(HOST, port, token=TOKEN, read_timeout=5, linger=0, seed=keys)
    served.append(store)
    return store


def _successors(*ports: int) -> AgentStoreSuccessors:
    settings = RendezvousSettings(read_timeout=5)
    return AgentStoreSuccessors([(HOST, p) for p in ports], TOKEN, RUN, settings)


def test_every_store_served_has_an_id_of_its_own() -> None:
    first, second = seed(RUN), seed(RUN)
    assert first[RUN_KEY] == second[RUN_KEY] == RUN.encode()
    assert first[STORE_KEY] != second[STORE_KEY]


def test_a_fresh_store_at_the_lost_stores_place_is_not_the_jobs(
    served: list[KVStore], caplog: pytest.LogCaptureFixture
) -> None:
    job = _serve(served, 0, seed(RUN))
    other = _serve(served, 0, seed(RUN))
    successors = _successors(job.port, other.port)
    successors.attach(job)
    place = successors.current
    again = successors.reach(place, 5)
    assert again is not None  # the job's store, still there (a host back from a pause)
    again.close()
    job.close()
    fresh = _serve(served, place.port, seed(RUN))  # its agent started again: same run, token
    with caplog.at_level(logging.WARNING, "phalanx"):
        assert successors.reach(place, 5) is None
        assert successors.reach(place, 5) is None
    said = [r.getMessage() for r in caplog.records if "not the job's" in r.getMessage()]
    assert len(said) == 1 and str(place) in said[0], said  # said once
    # ... and told to that store: the round its agent waits in failed, the job there stopped.
    board = Board(fresh, Keys(RUN), "test")
    stopped = board.stopped()
    assert stopped is not None and f"the job's store at {place} was lost" in stopped[0]
    assert board.get_json(Keys(RUN).round(0, "closed")) is not None
    # Another candidate's store is the successor's, whatever its id; once moved there, its
    # id is the one a fresh store at that place is compared with.
    there = Candidate(HOST, other.port)
    found = successors.reach(there, 5)
    assert found is not None
    found.close()
    successors.moved(there)
    other.close()
    _serve(served, there.port, seed(RUN))
    assert successors.reach(there, 5) is None


def test_a_handle_never_reads_a_fresh_store_at_its_place(served: list[KVStore]) -> None:
    """A node's handle (and its heartbeat's twin) reconnects after the store's host was
    lost; at its place an agent started again serves a fresh store, which the failover walk
    already told that the job moved on (its stop). The handle must not read that stop, or
    any key there, as the job's (the 07:33 full-suite failure: a survivor read that stop in
    its restart round and ended the job): it counts as not answering."""
    job = _serve(served, 0, seed(RUN))
    successors = _successors(job.port, job.port + 1)
    client = AgentKVStore(HOST, job.port, TOKEN, read_timeout=5)
    served.append(client)
    successors.attach(client)
    twin = client.twin(1)
    served.append(twin)
    client.set("k", b"the job's")
    assert client.get("k") == twin.get("k") == b"the job's"  # its own store: read as ever
    job.close()
    fresh = _serve(served, successors.current.port, seed(RUN))
    Board(fresh, Keys(RUN), "walk").stop("the job's store was lost, not the job's", None)
    for handle in (client, twin):
        board = Board(handle, Keys(RUN), "test")
        with pytest.raises(StoreUnavailable):  # the pooled connection, to the lost store
            board.stopped()
        for _ in range(2):  # each new connection: checked again, refused again
            with pytest.raises(OtherStore, match="serves another store than the one this"):
                board.stopped()


def test_a_store_that_names_no_id_is_not_checked(served: list[KVStore]) -> None:
    """An older phalanx's store (no id): nothing to compare, as before."""
    job = _serve(served, 0, {RUN_KEY: RUN.encode()})
    successors = _successors(job.port, job.port + 1)
    successors.attach(job)
    job.close()
    _serve(served, successors.current.port, {RUN_KEY: RUN.encode()})
    found = successors.reach(successors.current, 5)
    assert found is not None
    found.close()
