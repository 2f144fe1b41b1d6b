"""Job-wide stacks requests, tier (b): the request/answer protocol of ``phalanx stacks`` on
simulated agents over the in-memory store (the same ``Cluster`` as ``test_rdzv_algorithm``).

Every wait is bounded by ``WAIT`` (a hang guard, never a timing assertion).
"""

from __future__ import annotations

from pathlib import Path

from phalanx.hang.jobstacks import JobStacks, combine
from phalanx.rendezvous.api import EventKind, StackExchange
from phalanx.rendezvous.dynamic.answers import cap_stacks
from phalanx.rendezvous.dynamic.handler import DynamicRendezvous
from phalanx.rendezvous.dynamic.joined import JoinedRound
from phalanx.rendezvous.local import LocalRendezvous
from support.launch import wait_for
from support.memcluster import WAIT, Cluster, rounds, wait_event


def by_rank(
    handlers: list[DynamicRendezvous], joined: list[JoinedRound]
) -> list[tuple[DynamicRendezvous, JoinedRound]]:
    return sorted(zip(handlers, joined, strict=True), key=lambda pair: pair[1].rank)


def stacks(joined: JoinedRound) -> StackExchange:
    return joined.exchanges().stacks


def stacks_keys(cluster: Cluster) -> list[str]:
    return [key for key in cluster.server.data if "/stacks/" in key]


def test_a_request_reaches_every_node_and_the_answers_come_back(cluster: Cluster) -> None:
    handlers = [cluster.node(n, nnodes=(3, 3)) for n in "abc"]
    (a, ja), (_, jb), (c, jc) = by_rank(handlers, rounds(*handlers))
    rb = jb.result
    assert [stacks(j).stack_requests() for j in (ja, jb, jc)] == [0, 0, 0]
    assert stacks(jb).request_stacks() == 1
    assert stacks(jb).stack_requests() == 1  # its own request counts at once, not a heartbeat later
    wait_for(
        lambda: stacks(ja).stack_requests() == 1 and stacks(jc).stack_requests() == 1,
        WAIT,
        "a and c to be asked for stacks",
        every=0.02,
    )
    stacks(ja).post_stacks(1, "stacks of node 0")
    stacks(jc).post_stacks(1, "stacks of node 2")
    assert stacks(jb).gather_stacks(rb.round, 1, [0, 2], WAIT) == {
        0: "stacks of node 0",
        2: "stacks of node 2",
    }
    assert stacks_keys(cluster) == []  # read once, then removed from the store
    assert stacks(ja).request_stacks() == 2  # numbered per round, whoever asks
    wait_for(lambda: stacks(jc).stack_requests() == 2, WAIT, "c to be asked twice", every=0.02)
    assert a.poll() is None and c.poll() is None  # a stacks request is no job event


def test_nodes_that_do_not_answer_are_left_out(cluster: Cluster) -> None:
    handlers = [cluster.node(n, nnodes=(3, 3)) for n in "abc"]
    (_, ja), (_, jb), _ = by_rank(handlers, rounds(*handlers))
    ra = ja.result
    request = stacks(ja).request_stacks()
    wait_for(lambda: stacks(jb).stack_requests() == request, WAIT, "b to be asked", every=0.02)
    stacks(jb).post_stacks(request, "only node 1")
    assert stacks(ja).gather_stacks(ra.round, request, [1, 2], 0.5) == {1: "only node 1"}


def test_a_new_round_starts_counting_again(cluster: Cluster) -> None:
    a, b = cluster.node("a"), cluster.node("b")
    ja, jb = rounds(a, b)
    stacks(ja).request_stacks()
    wait_for(lambda: stacks(jb).stack_requests() == 1, WAIT, "b to be asked", every=0.02)
    ja.report_failure({"rank": 0, "exit_code": 1})
    wait_event(b, EventKind.PEER_FAILED)
    assert ja.claim_restart(1) and jb.claim_restart(1)
    ja, jb = rounds(a, b)
    assert ja.result.round == 1
    assert (stacks(ja).stack_requests(), stacks(jb).stack_requests()) == (0, 0)
    assert stacks(jb).request_stacks() == 1


def test_an_answer_is_cut_to_fit_the_store() -> None:
    assert cap_stacks("small\n") == b"small\n"
    assert cap_stacks("") == b"(empty)\n"  # a store value is never empty
    big = cap_stacks("ü" * 300_000)  # 600,000 bytes of two-byte characters
    assert len(big) <= 256 * 1024
    text = big.decode()  # cut at a character boundary
    assert text.endswith(
        "600000 bytes in all, 262144 posted; every rank's full dump is in its stacks.txt on that node]\n"
    )


def test_every_node_answers_once_and_the_asker_writes_one_file(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Nodes 0 and 1 run ``JobStacks`` as their watches do; node 2 never answers (its agent
    is busy), so the file names it after the bounded wait."""
    handlers = [cluster.node(n, nnodes=(3, 3)) for n in "abc"]
    pairs = by_rank(handlers, rounds(*handlers))
    dirs = [tmp_path / f"run{i}" for i in range(3)]
    for d in dirs:
        d.mkdir()
    jobs = [
        JobStacks(stacks(r), r.result, d, timeout=2.0)
        for (_, r), d in zip(pairs, dirs, strict=True)
    ]
    assert jobs[1].request()
    answered: list[list[int]] = [[], []]

    def tick(i: int) -> None:  # what RoundWatch.tick does for node i
        asked = jobs[i].unanswered()
        if asked:
            answered[i] += asked
            jobs[i].answer(asked, f"stacks of 1 rank(s) on host {i}\n=== rank {i} ===\n")

    def written() -> bool:
        for i in (0, 1):
            tick(i)
        return any(dirs[1].glob("stacks_*.txt"))

    wait_for(written, WAIT, "the stacks written", every=0.02)
    assert answered == [[1], [1]]  # once each, and node 1's own request is answered too
    (path,) = dirs[1].glob("stacks_*.txt")
    text = path.read_text()
    # Node ranks follow arrival, so the names come from the round (not the order above).
    name = [joined.result.this_node.hostname for _, joined in pairs]
    assert text.startswith(f"stacks of 2 of 3 node(s), requested on {name[1]} (node 1) at ")
    assert f"no answer within 2 s from: node 2 ({name[2]})" in text
    # This node first, then the others by node rank.
    assert text.index(f"##### node 1 ({name[1]}) #####") < text.index(
        f"##### node 0 ({name[0]}) #####"
    )
    assert "=== rank 0 ===" in text and "=== rank 1 ===" in text
    assert f"node 2 ({name[2]}) ###" not in text
    assert not any(dirs[0].glob("stacks_*.txt")) and not any(dirs[2].glob("stacks_*.txt"))


def test_combine_of_a_lone_node() -> None:
    joined = LocalRendezvous().next_round(1).result  # only for a RendezvousResult to build on
    assert combine(joined, "mine\n", {}, 10, at="now") == (
        f"stacks of 1 of 1 node(s), requested on {joined.this_node.hostname} (node 0) at now\n"
        f"\n##### node 0 ({joined.this_node.hostname}) #####\nmine\n"
    )


def test_a_single_node_has_nobody_to_ask() -> None:
    local = LocalRendezvous()
    assert (
        local.next_round(1).exchanges() is None
    )  # no StackExchange: the agent dumps its own ranks only
    assert local.peers() is None
