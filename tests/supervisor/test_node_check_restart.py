"""The node check on a restart (docs/how-to/nodes.md, "Node check"): a round whose every
agent was checked in an earlier round (passed, or named under ``warn``), the same agents or
not, does not repeat it; a round with an agent never checked checks every node; and a
round's check leaves no thread behind (the chaos soak found one left per check, blocked in
accept()).

Two "nodes" run the agent's own ``node_check`` in two threads, with the real probes and a
real link test on loopback; only the round's store is an in-memory stand-in (its records,
by round, node and phase). The wiring in a real job: ``test_node_check.py``.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from phalanx.agent.checking import CheckedNodes, node_check
from phalanx.cli.argv import parse_config
from phalanx.errors import RendezvousError
from phalanx.events import read_events
from phalanx.events.log import EventLog
from phalanx.nodecheck import link
from phalanx.nodecheck.round import HELLO_TIMEOUT
from phalanx.rendezvous.api import NodeInfo, RendezvousResult
from support.launch import worker

# Far below HELLO_TIMEOUT (60 s): a node that waited for a ready record that never comes
# would be over it
NO_WAIT = 20.0


class Records:
    """The round's records (round, node rank, phase) -> bytes, as the store keeps them."""

    def __init__(self) -> None:
        self.data: dict[tuple[int, int, str], bytes] = {}
        self.changed = threading.Condition()


class Exchange:
    """One node's ``CheckExchange`` on ``Records`` (what the dynamic rendezvous does)."""

    def __init__(self, records: Records, round: int, rank: int) -> None:
        self.records, self.round, self.rank = records, round, rank

    def post_check(self, phase: str, data: bytes) -> None:
        with self.records.changed:
            self.records.data[(self.round, self.rank, phase)] = data
            self.records.changed.notify_all()

    def gather_check(self, phase: str, node_ranks: Any, timeout: float) -> dict[int, bytes]:
        def got() -> dict[int, bytes]:
            data = self.records.data
            return {r: data[(self.round, r, phase)] for r in node_ranks if (self.round, r, phase) in data}  # fmt: skip

        with self.records.changed:
            self.records.changed.wait_for(lambda: len(got()) == len(node_ranks), timeout)
            return got()


class Joined:
    """Just what ``node_check`` asks of the round: its facts and ``exchanges().check``."""

    def __init__(self, exchange: Exchange, result: RendezvousResult) -> None:
        self.check = exchange
        self.result = result

    def exchanges(self) -> Joined:
        return self


def joined(round: int, rank: int, ids: tuple[str, str]) -> RendezvousResult:
    nodes = tuple(NodeInfo(r, f"host{r}", "127.0.0.1", 1) for r in (0, 1))
    return RendezvousResult("restart", round, round, rank, nodes, "127.0.0.1", 0, node_ids=ids)


@pytest.fixture
def config(tmp_path: Path) -> Any:
    return parse_config(
        ["--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:29400",
         "--nproc-per-node", "1", "--exclude-file", str(tmp_path / "excluded"), worker("echo_args.py")],
        {},
    )  # fmt: skip


class Node:
    """One agent: its run directory and its memory (``CheckedNodes``); ranks by round."""

    def __init__(self, tmp: Path, name: str) -> None:
        self.name, self.checked = name, CheckedNodes()
        self.run_dir = tmp / name
        self.run_dir.mkdir()
        self.events = EventLog(self.run_dir)

    def checks(self) -> list[int]:
        """The rounds this node checked (its ``node_check`` events)."""
        self.events.close()
        self.events = EventLog(self.run_dir)
        path = self.run_dir / "events.jsonl"
        found = read_events(path) if path.exists() else []
        return [e["round"] for e in found if e["kind"] == "node_check"]


def run_round(config: Any, nodes: list[Node], records: Records, round: int) -> float:
    """``node_check`` of round ``round`` on ``nodes`` (node rank = place) at once; the
    slower one's seconds."""

    def one(rank: int) -> float:
        began = time.monotonic()
        ids = (nodes[0].name, nodes[1].name)  # the agents' ids, as the rendezvous has them
        at = Joined(Exchange(records, round, rank), joined(round, rank, ids))
        node = nodes[rank]
        node_check(config, at, node.run_dir, node.events, node.checked, lambda: None)  # type: ignore[arg-type]
        return time.monotonic() - began

    with ThreadPoolExecutor(2) as pool:
        return max(pool.map(one, range(len(nodes))))


def test_a_round_of_agents_all_checked_before_does_not_repeat_it_and_a_new_one_does(
    config: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Round 0 (agents a, b) checks; round 1 (a restart, the same agents) checks nobody and
    waits for nothing; round 2 (b and c: c is new, as an agent started again) checks both;
    round 3 (a and c: the spare a taken in, b out, as the soak's restarts do) checks
    nobody: each was checked in an earlier round, if not together."""
    caplog.set_level(logging.INFO, logger="phalanx")
    records = Records()
    a, b, c = (Node(tmp_path, name) for name in "abc")
    run_round(config, [a, b], records, 0)
    assert [n.checks() for n in (a, b)] == [[0], [0]], caplog.text
    assert run_round(config, [a, b], records, 1) < NO_WAIT
    assert [n.checks() for n in (a, b)] == [[0], [0]], caplog.text
    not_repeated = "round 1: node check not repeated: each of its 2 nodes was checked in an earlier round"  # fmt: skip
    assert caplog.text.count(not_repeated) == 2, caplog.text
    run_round(config, [b, c], records, 2)
    assert [n.checks() for n in (a, b, c)] == [[0], [0, 2], [2]], caplog.text
    assert run_round(config, [c, a], records, 3) < NO_WAIT
    assert [n.checks() for n in (a, b, c)] == [[0], [0, 2], [2]], caplog.text
    assert "round 3: node check not repeated: each of its 2 nodes" in caplog.text
    assert left_behind() == [], "the checks' listeners are still accepting"


def left_behind() -> list[str]:
    """The node check's threads still alive (its listeners' accept loops), after a grace."""
    deadline = time.monotonic() + 5
    while (found := [t.name for t in threading.enumerate() if t.name == "phalanx-check"]) and time.monotonic() < deadline:  # fmt: skip
        time.sleep(0.05)
    return found


def test_a_listener_that_answered_a_link_test_ends_its_thread_when_closed() -> None:
    """A real link test on loopback, then ``close``: its accepting thread is gone (closing
    the socket alone leaves it blocked in accept() on Linux)."""
    before = set(threading.enumerate())
    listener = link.Listener("127.0.0.1", b"t" * 16)
    assert link.test_link("127.0.0.1", listener.port, b"t" * 16).error == ""
    listener.close()
    assert left_behind() == [], [t.name for t in set(threading.enumerate()) - before]


def test_a_node_never_checked_makes_every_node_check_and_none_waits_in_vain(
    config: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Node 0 was checked in round 4, node 1 never was (a new agent, or one whose checks
    were all cut short): node 0's ``same`` does not skip it, both check in round 5, well
    before ``HELLO_TIMEOUT``, and both are checked from then on."""
    assert NO_WAIT < HELLO_TIMEOUT
    caplog.set_level(logging.INFO, logger="phalanx")
    nodes = [Node(tmp_path, "old"), Node(tmp_path, "new")]
    nodes[0].checked.round = 4
    assert run_round(config, nodes, Records(), 5) < NO_WAIT
    assert [n.checks() for n in nodes] == [[5], [5]], caplog.text
    assert "not repeated" not in caplog.text, caplog.text
    assert [n.checked.round for n in nodes] == [4, 5]


def test_a_node_told_to_stop_ends_its_check_at_once(
    config: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Node 0 checks while node 1 never posts (held up); during its wait for node 1's ready
    record ``stop`` says why to stop (the agent's: a preemption signal to this node). The
    check ends then, in one line, with no verdict and no ``node_check`` event, well before
    ``HELLO_TIMEOUT``; the round's agents count as unchecked (the next round checks)."""
    caplog.set_level(logging.INFO, logger="phalanx")
    asked: list[float] = []

    def stop() -> None:  # not before the wait began: a signal during it
        asked.append(time.monotonic())
        if len(asked) > 1:
            raise RendezvousError("this node got SIGUSR1 (a preemption)")

    node = Node(tmp_path, "agent-a")
    at = Joined(Exchange(Records(), 7, 0), joined(7, 0, ("agent-a", "agent-b")))
    began = time.monotonic()
    verdict = node_check(config, at, node.run_dir, node.events, node.checked, stop)  # type: ignore[arg-type]
    assert verdict is None and time.monotonic() - began < NO_WAIT, caplog.text
    assert len(asked) == 2 and node.checks() == [], caplog.text
    assert "round 7: node check stopped: this node got SIGUSR1 (a preemption)" in caplog.text
    assert node.checked.round is None
    assert left_behind() == [], "the check's listener is still accepting"
