"""The rendezvous algorithm on the etcd backend (a real etcd server on loopback), reached
through the registry exactly as the launcher does: ``--rdzv-backend etcd`` / ``etcd-v2``."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest

from phalanx.errors import RendezvousError
from phalanx.rendezvous.api import EventKind, Exchanges, Round
from phalanx.rendezvous.registry import create_handler, spec_problems
from phalanx.rendezvous.spec import RendezvousSpec
from phalanx.status.exchange import ANSWER_LIMIT, encode_answer
from support.etcd_server import EtcdCluster, revoke_all_leases
from support.memcluster import join_all, wait_event
from support.tools import needs_etcd

HANG = 60.0
CONF = {
    "last_call_timeout": "1",
    "heartbeat_interval": "0.5",
    "heartbeat_timeout": "5",
    "lease_ttl": "3",
}

pytestmark = needs_etcd


@pytest.fixture(scope="module")
def etcd() -> Iterator[EtcdCluster]:
    with EtcdCluster(size=1) as cluster:
        yield cluster


def spec(cluster: EtcdCluster, backend: str, run_id: str) -> RendezvousSpec:
    return RendezvousSpec(backend, run_id, 2, 2, cluster.endpoint_arg, CONF)


def exchanges(joined: Round) -> Exchanges:
    found = joined.exchanges()
    assert found is not None  # a multi-node round
    return found


@pytest.mark.parametrize("backend", ["etcd", "etcd-v2"])
def test_round_failure_reach_and_restart_over_etcd(etcd: EtcdCluster, backend: str) -> None:
    run_id = uuid.uuid4().hex
    handlers = [create_handler(spec(etcd, backend, run_id)) for _ in range(2)]
    try:
        joined = join_all(handlers)
        first = [r.result for r in joined]
        assert first[0].nodes == first[1].nodes and first[0].master_port == first[1].master_port
        assert sorted(r.node_rank for r in first) == [0, 1]
        joined[0].report_failure({"rank": 0, "exit_code": 4})
        deadline = time.monotonic() + HANG
        while (event := handlers[1].poll()) is None:
            assert time.monotonic() < deadline, "PEER_FAILED never arrived"
            time.sleep(0.05)
        assert event.kind is EventKind.PEER_FAILED and event.failure["exit_code"] == 4
        assert [r.claim_restart(1) for r in joined] == [True, True]
        second = [r.result for r in join_all(handlers)]
        assert [r.restart_count for r in second] == [1, 1]
        assert [r.node_rank for r in second] == [r.node_rank for r in first]
        for h in handlers:
            h.report_done(True)
    finally:
        for h in handlers:
            h.shutdown()


def test_a_finished_run_id_is_not_reused_and_the_error_says_what_to_do(etcd: EtcdCluster) -> None:
    """etcd outlives the job, and with it the run's state: a second job under the same
    ``--rdzv-id`` is refused with a message that says to pick a new id."""
    run_id = uuid.uuid4().hex
    first = [create_handler(spec(etcd, "etcd", run_id)) for _ in range(2)]
    try:
        join_all(first)
        for h in first:
            h.report_done(True)
    finally:
        for h in first:
            h.shutdown()
    again = create_handler(spec(etcd, "etcd", run_id))
    try:
        with pytest.raises(RendezvousError, match=r"finished.*give a new --rdzv-id"):
            again.next_round(1)
    finally:
        again.shutdown()


def test_stacks_request_and_a_full_size_answer_over_etcd(etcd: EtcdCluster) -> None:
    """A node's answer to ``phalanx stacks`` is cut to 256 KiB, which etcd takes in one put
    (its limit is 1.5 MiB a request); the asker reads it back, then deletes it."""
    run_id = uuid.uuid4().hex
    handlers = [create_handler(spec(etcd, "etcd", run_id)) for _ in range(2)]
    try:
        joined = join_all(handlers)
        results = [r.result for r in joined]
        asker, other = sorted(range(2), key=lambda i: results[i].node_rank)
        ask, answer = exchanges(joined[asker]).stacks, exchanges(joined[other]).stacks
        request = ask.request_stacks()
        deadline = time.monotonic() + HANG
        while answer.stack_requests() != request:
            assert time.monotonic() < deadline, "the request never reached the other node"
            time.sleep(0.05)
        answer.post_stacks(request, "x" * 1_000_000)
        peer = results[other].node_rank
        answers = ask.gather_stacks(results[asker].round, request, [peer], HANG)
        assert len(answers[peer].encode()) == 256 * 1024
        assert answers[peer].startswith("xxx") and "[... cut: 1000000 bytes" in answers[peer]
        # Read once: the answer is gone from the store.
        assert ask.gather_stacks(results[asker].round, request, [peer], 0.1) == {}
    finally:
        for h in handlers:
            h.shutdown()


def test_status_request_and_a_full_size_answer_over_etcd(etcd: EtcdCluster) -> None:
    """A node's answer to ``phalanx status`` (at most ``ANSWER_LIMIT``) fits one etcd put;
    the asker reads it back, then deletes it."""
    run_id = uuid.uuid4().hex
    handlers = [create_handler(spec(etcd, "etcd", run_id)) for _ in range(2)]
    try:
        joined = join_all(handlers)
        results = [r.result for r in joined]
        asker, other = sorted(range(2), key=lambda i: results[i].node_rank)
        ask, answer = exchanges(joined[asker]).status, exchanges(joined[other]).status
        assert ask is not None and answer is not None
        request = ask.request_status()
        deadline = time.monotonic() + HANG
        while answer.status_requests() != request:
            assert time.monotonic() < deadline, "the request never reached the other node"
            time.sleep(0.05)
        lines = [b'{"kind": "progress", "pad": "%s"}\n' % (b"x" * 1000) for _ in range(2000)]
        answer.post_status(request, encode_answer({"node": 1}, lines))
        peer = results[other].node_rank
        answers = ask.gather_status(results[asker].round, request, [peer], HANG)
        assert ANSWER_LIMIT - 1100 < len(answers[peer]) <= ANSWER_LIMIT
        assert ask.gather_status(results[asker].round, request, [peer], 0.1) == {}
    finally:
        for h in handlers:
            h.shutdown()


def test_etcd_options_checked_with_the_settings(etcd: EtcdCluster) -> None:
    bad = RendezvousSpec("etcd", "x", 1, 2, etcd.endpoint_arg, {"protocl": "https", "timeout": "5"})
    _, problems = spec_problems(bad)
    assert len(problems) == 1 and "protocl" in problems[0]


def test_node_whose_etcd_lease_is_revoked_leaves(etcd: EtcdCluster) -> None:
    """Liveness on etcd is the agent's lease: with it gone (here an operator revokes every
    lease), each node finds its own liveness key deleted and stops counting as a member."""
    run_id = uuid.uuid4().hex
    handlers = [create_handler(spec(etcd, "etcd", run_id)) for _ in range(2)]
    try:
        join_all(handlers)
        assert revoke_all_leases(etcd) >= 2
        for h in handlers:
            assert "lease" in wait_event(h, EventKind.STORE_LOST).detail
        with pytest.raises(RendezvousError, match="lease"):
            handlers[0].next_round(1)
    finally:
        for h in handlers:
            h.shutdown()
