"""The job-wide crash-loop verdict (``judge_round``), tier (b): simulated agents in threads on
the in-memory store (``memcluster``). Every node gets the same verdict, built from every
node's evidence; a member that is still stopping is waited for, one that finished or was
lost is not. The real agents' side is in ``test_crash_loop``."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace

import pytest

from phalanx.agent.crashloop import failure_signature
from phalanx.rendezvous.api import EventKind, RoundVerdict
from phalanx.rendezvous.dynamic.handler import DynamicRendezvous
from phalanx.rendezvous.dynamic.joined import JoinedRound
from support.memcluster import FAST, WAIT, Cluster, Join, crash, form, rounds, wait_event


class Judging:
    """``judge_round`` in a thread; ``result()`` waits for it (bounded) and re-raises."""

    def __init__(self, joined: JoinedRound, progressed: bool) -> None:
        self.value: RoundVerdict | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(joined, progressed))
        self._thread.start()

    def _run(self, joined: JoinedRound, progressed: bool) -> None:
        try:
            self.value = joined.judge_round(progressed, failure_signature)
        except BaseException as exc:
            self.error = exc

    def done(self) -> bool:
        return not self._thread.is_alive()

    def result(self) -> RoundVerdict:
        self._thread.join(WAIT)
        assert not self._thread.is_alive(), "judge_round hung"
        if self.error is not None:
            raise self.error
        assert self.value is not None
        return self.value


def failure(rank: int, code: int, last: str) -> dict[str, object]:
    return {
        "rank": rank, "local_rank": 0, "host": "h", "pid": 100 + rank, "returncode": code,
        "time": 1.0, "stopped_by_launcher": False, "stderr_tail": [last],
    }  # fmt: skip


def failing_round(
    nodes: list[DynamicRendezvous], joined: list[JoinedRound], progressed: list[bool]
) -> list[RoundVerdict]:
    """Node 0 of the list fails with the same error each time; every node judges."""
    joined[0].report_failure(failure(0, 3, "ValueError: boom"))
    for h in nodes[1:]:
        wait_event(h, EventKind.PEER_FAILED)
    judging = [Judging(r, p) for r, p in zip(joined, progressed, strict=True)]
    return [j.result() for j in judging]


def test_every_node_gets_one_verdict_from_every_nodes_evidence(cluster: Cluster) -> None:
    nodes = [cluster.node(n, nnodes=(3, 3)) for n in "abc"]
    joined = rounds(*nodes)
    # Only c saw progress (its ranks checkpointed): it counts for a and b too.
    first = failing_round(nodes, joined, [False, False, True])
    assert first == [RoundVerdict("rank 0, exit code 3: ValueError: boom", "", True)] * 3
    assert all(r.claim_restart(5) for r in joined)
    joined = rounds(*nodes)
    second = failing_round(nodes, joined, [False, True, False])
    assert set(second) == {RoundVerdict(first[0].failure, first[0].failure, True)}
    assert second[0].repeated and second[0].progressed  # the same failure, progress: restart
    assert all(r.claim_restart(5) for r in joined)
    joined = rounds(*nodes)
    third = failing_round(nodes, joined, [False, False, False])
    assert set(third) == {RoundVerdict(first[0].failure, first[0].failure, False)}
    # Judging again is idempotent: the round's verdict is kept.
    assert joined[1].judge_round(True, failure_signature) == third[0]


def test_a_member_still_stopping_is_waited_for(cluster: Cluster) -> None:
    a, b = cluster.node("a"), cluster.node("b")
    at_a, at_b = rounds(a, b)
    at_a.report_failure(failure(0, 3, "boom"))
    early = Judging(at_a, False)
    time.sleep(3 * FAST.heartbeat_interval)  # b is alive, stopping its workers
    assert not early.done()
    late = Judging(at_b, True)  # its ranks checkpointed before they were stopped
    assert early.result() == late.result() and early.result().progressed


def test_a_member_that_finished_or_was_lost_is_not_waited_for(cluster: Cluster) -> None:
    patient = replace(FAST, join_timeout=10 * WAIT)  # so only the accounting ends the wait
    nodes = [cluster.node(n, nnodes=(2, 3), settings=patient) for n in "abc"]
    at_a, _, _ = rounds(*nodes)
    _, b, c = nodes
    b.report_done(True)  # b's workers finished: it will not judge
    crash(c)  # c's agent died: the heartbeats find it lost
    at_a.report_failure(failure(0, 3, "boom"))
    verdict = Judging(at_a, False).result()
    assert verdict == RoundVerdict("rank 0, exit code 3: boom", "", False)


def test_a_member_that_never_judges_is_waited_for_at_most_join_timeout(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    """b stays alive but never judges (stuck): a judges with what was posted once
    join_timeout has passed, says so, and that verdict stands for b too."""
    short = replace(FAST, join_timeout=2)
    a, b = cluster.node("a", settings=short), cluster.node("b", settings=short)
    at_a, at_b = rounds(a, b)
    at_a.report_failure(failure(0, 3, "boom"))
    with caplog.at_level(logging.WARNING, logger="phalanx"):
        verdict = Judging(at_a, False).result()
    assert "1 of 2 nodes judged round 0 within join_timeout=2s" in caplog.text
    assert verdict == RoundVerdict("rank 0, exit code 3: boom", "", False)
    assert Judging(at_b, True).result() == verdict


def test_a_round_re_formed_for_a_joining_node_starts_the_count_again(cluster: Cluster) -> None:
    a, b = cluster.node("a", nnodes=(2, 3)), cluster.node("b", nnodes=(2, 3))
    joined = rounds(a, b)
    first = failing_round([a, b], joined, [False, False])[0]
    assert all(r.claim_restart(5) for r in joined)
    form(a, b)
    late = Join(cluster.node("c", nnodes=(2, 3)))
    for h in (a, b):
        wait_event(h, EventKind.NODE_WAITING)  # round 1 ends for a scale-up: not judged
    c = cluster.handlers[-1]
    joined = rounds(a, b)
    again = failing_round([a, b, c], [*joined, late.joined()], [False, False, False])
    assert set(again) == {RoundVerdict(first.failure, "", False)}
    assert not again[0].repeated
