"""The node check on a restart (docs/how-to/nodes.md, "Node check"): a round with the same
agents as the last one, which passed the check, does not repeat it; new agents, or a node
that remembers otherwise, check or skip without waiting; and a round's check leaves no
thread behind (the chaos soak found one left per check, blocked in accept()).

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
    def __init__(self, tmp: Path, rank: int, checked: CheckedNodes) -> None:
        self.rank, self.checked = rank, checked
        self.run_dir = tmp / f"node{rank}"
        self.run_dir.mkdir()
        self.events = EventLog(self.run_dir)

    def checks(self) -> list[int]:
        """The rounds this node checked (its ``node_check`` events)."""
        self.events.close()
        self.events = EventLog(self.run_dir)
        path = self.run_dir / "events.jsonl"
        found = read_events(path) if path.exists() else []
        return [e["round"] for e in found if e["kind"] == "node_check"]


def run_round(
    config: Any, nodes: list[Node], records: Records, round: int, ids: tuple[str, str]
) -> float:
    """Both nodes' ``node_check`` for ``round`` at once; the slower one's seconds."""

    def one(node: Node) -> float:
        began = time.monotonic()
        at = Joined(Exchange(records, round, node.rank), joined(round, node.rank, ids))
        node_check(config, at, node.run_dir, node.events, node.checked, lambda: None)  # type: ignore[arg-type]
        return time.monotonic() - began

    with ThreadPoolExecutor(2) as pool:
        return max(pool.map(one, nodes))


def test_a_restart_with_the_same_agents_does_not_repeat_it_and_new_ones_do(
    config: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Round 0 checks; round 1 (a restart, the same two agents) checks nobody and waits
    for nothing; round 2 (node 1's agent is a new one) checks again; round 3, the same
    agents as round 2, does not."""
    caplog.set_level(logging.INFO, logger="phalanx")
    records = Records()
    nodes = [Node(tmp_path, rank, CheckedNodes()) for rank in (0, 1)]
    run_round(config, nodes, records, 0, ("agent-a", "agent-b"))
    assert [n.checks() for n in nodes] == [[0], [0]], caplog.text
    assert run_round(config, nodes, records, 1, ("agent-a", "agent-b")) < NO_WAIT
    assert [n.checks() for n in nodes] == [[0], [0]], caplog.text
    not_repeated = "round 1: node check not repeated: the same 2 nodes passed it in round 0"
    assert caplog.text.count(not_repeated) == 2, caplog.text
    run_round(config, nodes, records, 2, ("agent-a", "agent-c"))
    assert [n.checks() for n in nodes] == [[0, 2], [0, 2]], caplog.text
    run_round(config, nodes, records, 3, ("agent-a", "agent-c"))
    assert [n.checks() for n in nodes] == [[0, 2], [0, 2]], caplog.text
    assert "round 3: node check not repeated: the same 2 nodes passed it in round 2" in caplog.text
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


def test_a_node_that_would_check_sees_the_others_skip_it_and_does_not_wait(
    config: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Node 0 remembers the same agents passing in the last round, node 1 does not (its
    check there was cut short, say): node 0 says ``same`` and goes on, node 1 reads it and
    skips the check too, in one line, well before ``HELLO_TIMEOUT``. Neither checks."""
    assert NO_WAIT < HELLO_TIMEOUT
    caplog.set_level(logging.INFO, logger="phalanx")
    ids = ("agent-a", "agent-b")
    remembers = CheckedNodes()
    remembers.remember(joined(4, 0, ids), passed=True)
    nodes = [Node(tmp_path, 0, remembers), Node(tmp_path, 1, CheckedNodes())]
    assert run_round(config, nodes, Records(), 5, ids) < NO_WAIT
    assert [n.checks() for n in nodes] == [[], []], caplog.text
    assert "round 5: node check not repeated: the same 2 nodes passed it in round 4" in caplog.text
    skipped = "round 5: node check skipped: the same nodes passed it in the last round"
    assert skipped in caplog.text, caplog.text
    # node 1 takes the others' word: the next restart with them skips it on both, said once
    assert [n.checked.same(joined(6, n.rank, ids)) for n in nodes] == [5, 5]


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

    ids = ("agent-a", "agent-b")
    node = Node(tmp_path, 0, CheckedNodes())
    at = Joined(Exchange(Records(), 7, 0), joined(7, 0, ids))
    began = time.monotonic()
    verdict = node_check(config, at, node.run_dir, node.events, node.checked, stop)  # type: ignore[arg-type]
    assert verdict is None and time.monotonic() - began < NO_WAIT, caplog.text
    assert len(asked) == 2 and node.checks() == [], caplog.text
    assert "round 7: node check stopped: this node got SIGUSR1 (a preemption)" in caplog.text
    assert node.checked.same(joined(8, 0, ids)) is None
    assert left_behind() == [], "the check's listener is still accepting"
