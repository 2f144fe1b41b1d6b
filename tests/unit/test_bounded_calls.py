"""The heartbeat and watch calls are bounded (docs/explanation/faults.md, "a lossy link"):
each call of ``Liveness``'s watch thread and of its heartbeat goes out on a handle of its
own whose calls give up after ``call_bound`` (``heartbeat_timeout`` / 4), so a reply that
is stuck holds neither: the next call goes out on a fresh connection. So are the calls of
a node waiting for a store it lost to answer again, so that wait ends at ``close_timeout``.

A real agent store; the node's ``Liveness`` (its real threads) reaches it through a proxy
whose replies can be held (``support/slow_replies.py``: requests reach the store at once,
answers wait). For a few seconds every answer is held for ``STUCK`` seconds, far beyond the
bound, then answers flow again. A call given up within its bound leaves the threads free:
an event posted then reaches the node, and its heartbeat counter moves again, long before
the held answers would have come. Timeouts only catch hangs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from phalanx.rendezvous.api import EventKind, JobEvent, NodeInfo
from phalanx.rendezvous.dynamic.board import Board
from phalanx.rendezvous.dynamic.health import call_bound
from phalanx.rendezvous.dynamic.keys import Keys
from phalanx.rendezvous.dynamic.liveness import Liveness
from phalanx.rendezvous.dynamic.lost import store_answers
from phalanx.rendezvous.dynamic.members import Membership
from phalanx.rendezvous.settings import RendezvousSettings
from phalanx.rendezvous.stores.agentstore import AgentKVStore, Token
from support.launch import wait_for
from support.slow_replies import SlowReplies

# bound 3 s; read_timeout far beyond the held answers, so only the bound can end a call
SETTINGS = RendezvousSettings(heartbeat_interval=1.0, heartbeat_timeout=12.0, read_timeout=600)
STUCK = 300.0  # how long a held answer is held: a call that waits for it hangs the test
HANG = 60.0  # only catches a hang: far under STUCK, far over the bound
KEYS = Keys("bounded")
TOKEN = Token(b"bounded-calls")


@pytest.fixture
def watched() -> Iterator[tuple[Liveness, SlowReplies, AgentKVStore]]:
    """A running ``Liveness`` of node "reader" (the only member of round 0) behind the
    proxy, and the store's host handle (which reads and writes directly)."""
    host = AgentKVStore.host("127.0.0.1", 0, token=TOKEN, read_timeout=30, linger=0)
    proxy = SlowReplies(host.port)
    node = AgentKVStore.connect(
        "127.0.0.1", proxy.port, token=TOKEN, connect_timeout=10, read_timeout=600
    )
    liveness = Liveness(Board(node, KEYS, "reader"), SETTINGS)
    liveness.follow(Membership(0, 0, ("reader",), (NodeInfo(0, "reader", "addr", 1),)), 0)
    try:
        liveness.start()
        wait_for(lambda: host.get(KEYS.heartbeat("reader")) is not None, HANG, "a first beat")
        yield liveness, proxy, host
    finally:
        liveness.stop()
        proxy.close()
        node.close()
        host.close()


def hold_answers(proxy: SlowReplies, seconds: float) -> None:
    """Every answer sent in the next ``seconds`` is held ``STUCK`` seconds (the fault)."""
    proxy.delay = STUCK
    time.sleep(seconds)  # the fault's length, not a wait for anything
    proxy.delay = 0.0


def test_the_bound_is_a_quarter_of_the_heartbeat_timeout() -> None:
    assert call_bound(SETTINGS) == 3.0


def test_a_stuck_answer_to_the_watch_thread_is_given_up(
    watched: tuple[Liveness, SlowReplies, AgentKVStore],
) -> None:
    """The watch thread's call is caught by the held answers; once answers flow again, a
    peer's failure posted to the store reaches the node (a stuck call would hold it for
    ``STUCK`` seconds)."""
    liveness, proxy, host = watched
    hold_answers(proxy, 2 * SETTINGS.event_interval + 1.0)
    failure = JobEvent(EventKind.PEER_FAILED, 1, "rank 1 failed", {"rank": 1})
    Board(host, KEYS, "writer").post_event(0, failure, about="writer")
    got: list[JobEvent] = []

    def arrived() -> bool:
        event = liveness.next_event()
        if event is not None:
            got.append(event)
        return bool(got)

    wait_for(arrived, HANG, "the event to reach the node past the stuck call")
    assert got[0].kind is EventKind.PEER_FAILED and got[0].detail == "rank 1 failed"
    assert liveness.store_problem() is None


def test_stuck_answers_to_the_heartbeat_are_given_up(
    watched: tuple[Liveness, SlowReplies, AgentKVStore],
) -> None:
    """Answers held for longer than a full hedge of beats (bound / interval + 1 beats in
    flight, each waiting for its answer): once answers flow again the node's heartbeat
    counter moves on (beats stuck on their answers would leave no room for a new one, and
    the peers would count the node lost)."""
    _, proxy, host = watched
    bound = call_bound(SETTINGS)
    hold_answers(proxy, bound + 2 * SETTINGS.heartbeat_interval)
    key = KEYS.heartbeat("reader")
    then = host.get(key)
    wait_for(lambda: host.get(key) != then, HANG, "a new beat after the stuck ones")


def test_waiting_for_a_lost_store_to_answer_ends_at_close_timeout() -> None:
    """A node that lost the store (or fenced itself) waits for it to answer again at most
    ``close_timeout`` (``lost.store_answers``), its calls bounded as the heartbeat's: with
    every answer held (a frozen store host, a black-holed link) and ``read_timeout`` 600 s,
    the wait gives up after ``close_timeout`` (2 s), not with the first call's answer
    (``STUCK``); once answers flow, the store answers again."""
    settings = RendezvousSettings(
        heartbeat_interval=0.5, heartbeat_timeout=4.0, close_timeout=2.0, read_timeout=600
    )
    host = AgentKVStore.host("127.0.0.1", 0, token=TOKEN, read_timeout=30, linger=0)
    proxy = SlowReplies(host.port)
    node = AgentKVStore.connect(
        "127.0.0.1", proxy.port, token=TOKEN, connect_timeout=10, read_timeout=600
    )
    board = Board(node, KEYS, "lost")
    got: list[bool] = []
    try:
        proxy.delay = STUCK
        waiting = threading.Thread(target=lambda: got.append(store_answers(board, settings)))
        waiting.start()
        waiting.join(HANG)
        assert got == [False], "the wait outlasted close_timeout by a held answer"
        proxy.delay = 0.0
        assert store_answers(board, settings)
    finally:
        proxy.close()
        node.close()
        host.close()
