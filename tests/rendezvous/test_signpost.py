"""The word the node serving the job's store after a failover leaves at the first endpoint
(``rendezvous.backends.signpost``; docs/explanation/design.md, "When the store's host is
lost"), over real agent stores on loopback: a fresh store of the run there gets the word
once the job's store is confirmed; a round formed on it (a second job under the run id) is
stopped; the job's own first store (back after a pause) and another job's store are left
alone. The whole story, with agents in network namespaces, is
``tests/multinode/test_newcomer_follows_store.py``."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from phalanx.rendezvous.backends import signpost
from phalanx.rendezvous.backends.claim import STORE_KEY, seed
from phalanx.rendezvous.dynamic.board import Board, Decision
from phalanx.rendezvous.dynamic.failover import Candidate
from phalanx.rendezvous.dynamic.keys import Keys
from phalanx.rendezvous.dynamic.majority import confirm
from phalanx.rendezvous.stores.agentstore import AgentKVStore, Token
from support.launch import wait_for

TOKEN = Token(b"signpost-test-token")
KEYS = Keys("job")
HANG = 30.0


@pytest.fixture
def opened() -> Iterator[list[AgentKVStore]]:
    stores: list[AgentKVStore] = []
    try:
        yield stores
    finally:
        for store in stores:
            store.close()


def _serve(opened: list[AgentKVStore], run_id: str = "job", **held: bytes) -> AgentKVStore:
    store = AgentKVStore.host(
        "127.0.0.1", 0, token=TOKEN, read_timeout=5, seed={**seed(run_id), **held}, linger=0
    )
    opened.append(store)
    return store


def _at(store: AgentKVStore) -> Candidate:
    return Candidate("127.0.0.1", store.port)


def test_a_fresh_store_gets_the_word_a_round_there_is_stopped_the_jobs_own_is_left(
    opened: list[AgentKVStore],
) -> None:
    first = _serve(opened)  # the job's first store, answering again after a pause
    fresh, running, other = _serve(opened), _serve(opened), _serve(opened, run_id="other")
    Board(running, KEYS, "newcomer").close(0, Decision(count=2))  # two newcomers met there
    served = _serve(opened, **{KEYS.epoch: b"1"})  # this node's, failover 1: not confirmed
    first_id = first.get(STORE_KEY)
    for place in (first, fresh, running, other):
        signpost.keep(_at(place), served, _at(served), TOKEN, "job", first_id)
    confirm(Board(served, KEYS, "member"), 1)  # a quorum of the members reached it
    word = {"host": "127.0.0.1", "port": served.port, "epoch": 1}
    wait_for(lambda: fresh.get(KEYS.moved) is not None, HANG, "the word in the fresh store")
    wait_for(lambda: running.get(KEYS.stopped) is not None, HANG, "the second job stopped")
    assert json.loads(fresh.get(KEYS.moved) or b"") == word
    assert json.loads(running.get(KEYS.moved) or b"") == word
    assert fresh.get(KEYS.stopped) is None  # nobody runs there: they follow the word
    assert "beside the job" in json.loads(running.get(KEYS.stopped) or b"")["reason"]
    for left in (first, other):
        assert left.get(KEYS.moved) is None and left.get(KEYS.stopped) is None
        assert left.get(Keys("other").moved) is None
