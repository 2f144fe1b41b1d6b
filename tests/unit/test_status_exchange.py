"""The status exchange of ``phalanx status``, below the command: the request/answer protocol
on simulated agents over the in-memory store (tier b; over a real etcd: ``test_rdzv_etcd``),
and the pure parts (the cap on events, the answer's format, a node's status from its
events, ``read_run_events``)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from phalanx.events import EVENTS_FILE, read_run_events
from phalanx.rendezvous.api import Exchanges
from phalanx.rendezvous.dynamic.joined import JoinedRound
from phalanx.status import files
from phalanx.status.exchange import (
    ANSWER_LIMIT,
    StatusRequests,
    cap_events,
    decode_answer,
    encode_answer,
)
from phalanx.status.node import NodeStatus
from phalanx.status.service import EventTail
from phalanx.status.view import RunView, _rank_cells, render
from support.launch import wait_for
from support.memcluster import WAIT, Cluster, rounds


def _line(kind: str, seq: int, size: int = 0) -> bytes:
    record = {"v": 1, "seq": seq, "kind": kind, "pad": "x" * size}
    return (json.dumps(record) + "\n").encode()


def test_the_cap_drops_the_oldest_progress_samples_first_then_the_oldest_others() -> None:
    lines = [_line("run_start", 0), *(_line("progress", i, 100) for i in range(1, 6)),
             _line("failure", 6), _line("job_end", 7)]  # fmt: skip
    assert cap_events(lines, 10**6) == (lines, 0)
    limit = sum(map(len, lines)) - 2 * len(lines[1])  # room for all but two samples
    kept, dropped = cap_events(lines, limit)
    assert dropped == 2 and kept == [lines[0], *lines[3:]]
    kept, dropped = cap_events(lines, len(lines[6]) + len(lines[7]))
    assert kept == lines[6:] and dropped == 6  # every sample, then the oldest other


def test_an_answer_is_bounded_and_says_how_many_events_it_dropped() -> None:
    lines = [_line("progress", i, 1000) for i in range(2000)]  # about 2 MB of samples
    data = encode_answer({"node": 1, "state": "running"}, lines, dropped=5)
    assert len(data) <= ANSWER_LIMIT
    decoded = decode_answer(data)
    assert decoded is not None
    status, events, dropped = decoded
    assert status == {"node": 1, "state": "running"}
    kept = events.splitlines(keepends=True)
    assert dropped == 5 + 2000 - len(kept) and kept == lines[-len(kept) :]  # the newest
    assert decode_answer(b"junk\n") is None


def test_the_events_kept_for_answers_stay_bounded() -> None:
    tail = EventTail(limit=10_000)
    for i in range(1000):
        tail.add({"v": 1, "seq": i, "kind": "progress", "pad": "x" * 100})
    assert sum(map(len, tail.lines)) <= 2 * 10_000
    assert tail.dropped + len(tail.lines) == 1000


def test_a_node_status_from_its_events_and_counters(tmp_path: Path) -> None:
    clock = [100.0]
    node = NodeStatus(wall_clock=lambda: 1e9, monotonic=lambda: clock[0])
    base = {"v": 1, "t": 1e9, "node": 1, "host": "h1"}
    events = [
        {"kind": "run_start", "run_id": "r", "pid": 7, "max_restarts": 2},
        {"kind": "rdzv_start", "attempt": 1},
        {"kind": "rdzv_done", "round": 0, "attempt": 1, "num_nodes": 2, "world_size": 4,
         "members": ["h0", "h1"], "restart_count": 0},
        {"kind": "workers_started", "round": 0, "attempt": 1, "ranks": [2, 3], "pids": [11, 12]},
        {"kind": "progress", "round": 0, "rank": 2, "step": 10, "beats": 10, "mono": 90.0},
        {"kind": "progress", "round": 0, "rank": 2, "step": 30, "beats": 30, "mono": 95.0},
        {"kind": "worker_exit", "rank": 3, "pid": 12, "returncode": 1, "failed": True},
        {"kind": "failure", "round": 0, "rank": 3, "failed_node": 1, "failure_kind": "exit_code",
         "reason": "exit 1", "local": True},
    ]  # fmt: skip
    for event in events:
        node.hear({**base, **event})
    status = node.snapshot()
    assert (status["node"], status["host"], status["round"], status["state"]) == (
        1, "h1", 0, "stopping",
    )  # fmt: skip
    ranks = {r["rank"]: r for r in status["ranks"]}
    assert (ranks[2]["state"], ranks[2]["pid"], ranks[2]["step"]) == ("running", 11, 30)
    assert ranks[2]["steps_per_s"] == 4.0 and ranks[2]["since_beat"] == 5.0
    assert (ranks[3]["state"], ranks[3]["returncode"], ranks[3]["since_beat"]) == (
        "failed",
        1,
        None,
    )
    assert status["last_failure"]["rank"] == 3
    node.hear({**base, "kind": "job_end", "outcome": "failed", "exit_code": 1})
    assert (node.snapshot()["state"], node.snapshot()["exit_code"]) == ("failed", 1)


def test_read_run_events_has_every_node_once(tmp_path: Path) -> None:
    def write(path: Path, records: list[dict[str, object]]) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(r) + "\n" for r in records))

    mine = [{"v": 1, "kind": "run_start", "seq": 0, "mono": 1.0, "host": "a", "node": 0}]
    theirs = [{"v": 1, "kind": "run_start", "seq": 0, "mono": 5.0, "host": "b", "node": 1}]
    write(tmp_path / EVENTS_FILE, mine)
    write(tmp_path / "nodes" / "1" / EVENTS_FILE, theirs)
    write(tmp_path / "nodes" / "2" / EVENTS_FILE, theirs)  # the same node, an older rank
    assert read_run_events(tmp_path) == mine + theirs
    assert read_run_events(tmp_path / "nowhere") == []


def ex(joined: JoinedRound) -> Exchanges:
    return joined.exchanges()


def test_a_status_request_reaches_every_node_and_the_answers_come_back(cluster: Cluster) -> None:
    handlers = [cluster.node(n, nnodes=(3, 3)) for n in "abc"]
    pairs = sorted(zip(handlers, rounds(*handlers), strict=True), key=lambda p: p[1].rank)
    (a, ja), (_, jb), (c, jc) = pairs
    rb = jb.result
    assert ex(jb).status.request_status() == 1 and ex(jb).status.status_requests() == 1
    wait_for(
        lambda: ex(ja).status.status_requests() == 1 and ex(jc).status.status_requests() == 1,
        WAIT,
        "a and c to be asked for status",
        every=0.02,
    )
    assert ex(ja).stacks.stack_requests() == 0  # a status request is no stacks request
    ex(ja).status.post_status(1, b"node 0")
    ex(jc).status.post_status(1, b"node 2")
    assert ex(jb).status.gather_status(rb.round, 1, [0, 2], WAIT) == {
        0: b"node 0",
        2: b"node 2",
    }
    assert [k for k in cluster.server.data if "/status/" in k] == []  # read once, removed
    assert a.poll() is None and c.poll() is None  # no job event


def test_the_asker_writes_who_answered_and_names_who_did_not(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Three agents' request handling (``StatusRequests``) over the store: node b is asked
    by its ``phalanx status`` (a request file), a answers, c never does."""
    handlers = [cluster.node(n, nnodes=(3, 3)) for n in "abc"]
    (_, ja), (_, jb), (_, jc) = sorted(
        zip(handlers, rounds(*handlers), strict=True), key=lambda p: p[1].rank
    )
    ra, rb, rc = ja.result, jb.result, jc.result
    agents = {}
    for name, at, joined in (("a", ja, ra), ("b", jb, rb)):
        run_dir = tmp_path / name
        run_dir.mkdir()
        status = {"node": joined.node_rank, "host": name}
        agents[name] = StatusRequests(
            run_dir, lambda s=status: encode_answer(s, [_line("run_start", 0)]), lambda s=status: s
        )
        agents[name].round(joined, ex(at).status)
    nonce = files.new_request(tmp_path / "b")

    def asked() -> bool:  # as the agent's tick does: take what the scanner found, poke it
        agents["b"].check_files()
        return ex(jb).status.status_requests() == 1

    wait_for(asked, WAIT, "the request to be asked", every=0.02)
    wait_for(
        lambda: ex(ja).status.status_requests() == 1,
        WAIT,
        "a to be asked for status",
        every=0.02,
    )
    agents["a"].check_peers()
    answer = files.answer_path(tmp_path / "b", nonce)
    wait_for(
        lambda: answer.exists(), WAIT, "the answer file", every=0.02
    )  # after GATHER_WAIT: c never answers
    reply = json.loads(answer.read_text())
    assert reply["answered"] == [ra.node_rank] and reply["self"]["node"] == rb.node_rank
    assert reply["missing"] == [{"node": rc.node_rank, "host": rc.this_node.hostname}]
    copied = files.node_dir(tmp_path / "b", ra.node_rank)
    assert json.loads((copied / "status.json").read_text())["host"] == "a"
    assert (copied / EVENTS_FILE).read_bytes() == _line("run_start", 0)
    for _ in range(3):  # a request is answered once, however often the scanner sees it
        agents["b"].check_files()
        time.sleep(0.1)
    assert ex(jb).status.status_requests() == 1
    for agent in agents.values():
        agent.close()


def test_the_table_names_the_nodes_that_did_not_answer(tmp_path: Path) -> None:
    own = NodeStatus(wall_clock=lambda: 1e9).snapshot()
    view = RunView(tmp_path, "running", True, own, [own], [{"node": 2, "host": "hc"}])
    assert "no answer from: node 2 (hc)\n" in render(view)


def test_a_rank_the_hang_watch_named_is_hung_until_it_moves_again() -> None:
    node = NodeStatus(wall_clock=lambda: 1e9, monotonic=lambda: 100.0)
    node.hear({"kind": "workers_started", "ranks": [0, 1], "pids": [11, 12]})
    node.hear({"kind": "hang", "action": "named", "ranks": [1], "suspects": [1], "bound": 60})
    ranks = {r["rank"]: r for r in node.snapshot()["ranks"]}
    assert (ranks[0]["hung"], ranks[1]["hung"]) == (False, True)
    assert _rank_cells(ranks[1])[3] == "hung" and _rank_cells(ranks[0])[3] == "running"
    node.hear({"kind": "hang_over", "rank": 1, "seconds": 75.0, "bound": 60})
    assert not any(r["hung"] for r in node.snapshot()["ranks"])
