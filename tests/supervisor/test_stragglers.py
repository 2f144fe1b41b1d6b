"""Stragglers while training (``--straggler-action``; ``stragglers.watch``).

Wiring, on real progress files and a fake clock: a slow rank is named once, in one event and
one line, with its node, rate and the median; rates from another node count; ``exclude``
makes only the straggler's own node leave. Then for real: two c10d nodes (network
namespaces, one worker each) whose ranks step on their own; once they run, node 1's worker
is moved into a cgroup with a CPU quota of 3 % of a core. Every node names rank 1, and under
``exclude`` node 1 leaves (exit 69, the exclusion file names it) and node 0 re-forms alone
(``--nnodes 1:2``), resumes from its last checkpoint and ends with the right result.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from phalanx import exclusion
from phalanx.errors import NodeExcluded
from phalanx.events.log import EventLog
from phalanx.events.metrics import MetricsServer
from phalanx.exclusion import EXCLUDED_EXIT_CODE
from phalanx.resources.ports import free_port
from phalanx.status.node import NodeStatus
from phalanx.stragglers.settings import StragglerAction, StragglerSettings
from phalanx.stragglers.watch import PHASE, StragglerWatch
from phalanx.tick import Reading
from phalanx.timeline import build, render
from phalanx.worker import progress
from support import cpuquota
from support.hosts import Node
from support.launch import wait_for, worker
from support.multinode import c10d_args

STEPS = 2000
EXPECTED = sum(i * i % 7 for i in range(STEPS))
# A short window for a short test; on this shared 2-core machine a 3 s window at fraction 0.5
# once named a healthy rank (49.7 against 114 steps/s: a checkpoint's fsync and the load),
# so the tests ask for a quarter of the median: the throttled rank makes about a tenth.
SHORT = ["--straggler-window", "4", "--straggler-fraction", "0.25"]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Exchange:
    """The node check's records, in memory (what the other node posted)."""

    def __init__(self) -> None:
        self.records: dict[tuple[str, int], bytes] = {}

    def post_check(self, phase: str, data: bytes) -> None:
        self.records[(phase, 0)] = data

    def gather_check(self, phase: str, ranks: list[int], timeout: float) -> dict[int, bytes]:
        return {r: self.records[(phase, r)] for r in ranks if (phase, r) in self.records}


def joined(nodes: int, me: int) -> Any:
    members = [SimpleNamespace(node_rank=i, hostname=f"h{i}") for i in range(nodes)]
    return SimpleNamespace(round=3, num_nodes=nodes, node_rank=me, nodes=members,
                           this_node=members[me])  # fmt: skip


def ranks(tmp: Path, count: int) -> list[Any]:
    running = []
    for rank in range(count):
        (tmp / str(rank)).mkdir()
        running.append((SimpleNamespace(global_rank=rank, log_dir=tmp / str(rank)), 1000 + rank))
    return running


def beat(running: list[Any], beats: list[int]) -> None:
    for (w, _), count in zip(running, beats, strict=True):
        (w.log_dir / progress.FILE_NAME).write_bytes(progress.LAYOUT.pack(count, count))


def watch(tmp: Path, action: StragglerAction, nodes: int = 1, exchange: Any = None) -> Any:
    settings = StragglerSettings(action, 0.5, 5.0)
    events = EventLog(tmp, time.time)
    seen: list[dict[str, Any]] = []
    events.listen(seen.append)
    clock = Clock()

    def exclude(reason: str) -> str:  # as the agent's loop records it
        here = exclusion.this_node("10.9.0.1")
        exclusion.record(None, tmp, here, reason)
        return str(here)

    w = StragglerWatch(settings, joined(nodes, 0), exchange, events, exclude, clock=clock)
    return w, clock, seen


def run(w: Any, clock: Clock, running: list[Any], rates: list[int], seconds: int) -> bool:
    stop = False
    for t in range(seconds + 1):
        beat(running, [r * t for r in rates])
        stop = w.see(Reading.take([plan for plan, _ in running], running)) or stop
        clock.now += 1.0
        if w._busy:  # the exchange's thread: let it finish, as the next tick would
            time.sleep(0.05)
    return stop


def test_a_slow_rank_is_named_once_with_its_rate_and_the_median(tmp_path: Path) -> None:
    w, clock, seen = watch(tmp_path, StragglerAction.WARN)
    running = ranks(tmp_path, 3)
    assert not run(w, clock, running, [20, 20, 2], 12)
    (event,) = [e for e in seen if e["kind"] == "straggler"]
    assert (event["rank"], event["straggler_node"], event["straggler_host"]) == (2, 0, "h0")
    assert event["rate"] == pytest.approx(2) and event["median"] == pytest.approx(20)
    assert event["action"] == "warn"
    w.leave()  # warn: nobody leaves
    marks = build(seen).stragglers
    assert [(m.kind, m.rank) for m in marks] == [("straggler", 2)]


def test_healthy_ranks_and_off_name_nobody(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    w, clock, seen = watch(tmp_path / "a", StragglerAction.WARN)
    assert not run(w, clock, ranks(tmp_path / "a", 3), [20, 18, 15], 12)
    (tmp_path / "b").mkdir()
    off, clock, seen_off = watch(tmp_path / "b", StragglerAction.OFF)
    assert not run(off, clock, ranks(tmp_path / "b", 2), [20, 1], 12)
    assert not [e for e in seen + seen_off if e["kind"] == "straggler"]


def test_exclude_makes_the_stragglers_own_node_leave(tmp_path: Path) -> None:
    exchange = Exchange()  # the other node (1) runs rank 1 at 20 steps/s
    exchange.records[(PHASE, 1)] = json.dumps(
        {"node": 1, "host": "h1", "rates": {"1": 20.0}}
    ).encode()
    w, clock, seen = watch(tmp_path, StragglerAction.EXCLUDE, nodes=2, exchange=exchange)
    running = ranks(tmp_path, 1)  # this node's rank 0, slow
    assert run(w, clock, running, [2], 12)  # stops its round
    with pytest.raises(NodeExcluded, match="straggler-action exclude"):
        w.leave()
    kinds = [e["kind"] for e in seen]
    assert "straggler" in kinds and "excluded" in kinds
    assert json.loads((tmp_path / "excluded.jsonl").read_text())["reason"].startswith("straggler")
    assert json.loads(exchange.records[(PHASE, 0)])["rates"]["0"] == pytest.approx(2)


def test_a_straggler_that_left_first_is_named_at_the_rounds_end(tmp_path: Path) -> None:
    """Node 1 named itself and left (its rates posted as it went) before this node's helper
    thread read them: ``leave`` after the round reads them once more and names rank 1."""
    exchange = Exchange()
    w, clock, seen = watch(tmp_path, StragglerAction.EXCLUDE, nodes=2, exchange=exchange)
    assert not run(w, clock, ranks(tmp_path, 1), [20], 12)  # alone: nobody to compare with
    exchange.records[(PHASE, 1)] = json.dumps(
        {"node": 1, "host": "h1", "rates": {"1": 2.0}}
    ).encode()
    w.leave()  # not this node: no NodeExcluded
    (event,) = [e for e in seen if e["kind"] == "straggler"]
    assert (event["rank"], event["straggler_node"], event["straggler_host"]) == (1, 1, "h1")
    assert "excluded" not in [e["kind"] for e in seen]


def test_the_event_reaches_status_metrics_and_the_timeline_page(tmp_path: Path) -> None:
    w, clock, seen = watch(tmp_path, StragglerAction.WARN)
    run(w, clock, ranks(tmp_path, 3), [20, 20, 2], 12)
    status = NodeStatus()
    for record in seen:
        status.hear(record)
    (line,) = status.snapshot()["stragglers"]
    assert line.startswith("straggler (round 3): rank 2 on node 0 (h0), 2.0 steps/s")
    server = MetricsServer("127.0.0.1", free_port())
    try:
        for record in seen:
            server.record(record)
        assert server.registry.get_sample_value("phalanx_straggler", {"rank": "2"}) == 1
        server.record({"kind": "rdzv_done", "mono": 1.0, "seconds": 0.1})  # a new round
        assert server.registry.get_sample_value("phalanx_straggler", {"rank": "2"}) == 0
    finally:
        server.close()
    assert '<g class="straggler" data-kind="straggler" data-rank="2">' in render(build(seen))


def status_of(run_dir: Path) -> str:
    done = subprocess.run([sys.executable, "-m", "phalanx", "status", str(run_dir)],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    return done.stdout + done.stderr


def events_of(node: Node) -> list[dict[str, Any]]:
    (path,) = node.logs.glob("*/events.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
def test_a_throttled_rank_is_named_and_its_node_excluded(
    quota: Callable[[float], cpuquota.CpuQuota],
    hosts: object,
    nodes: list[Node],
    tmp_path: Path,
) -> None:
    slow = quota(0.03)
    net = hosts(2)  # type: ignore[operator]
    out = tmp_path / "out"
    out.mkdir()
    excl = tmp_path / "excluded.jsonl"
    flags = ["--max-restarts", "2", "--cold-start", "--straggler-action", "exclude",
             *SHORT, "--exclude-file", str(excl)]  # fmt: skip
    port = free_port()
    for i in (0, 1):
        args = [*c10d_args(net, port, "1:2"), *flags, worker("straggler_train.py"), str(out), str(STEPS)]  # fmt: skip
        nodes.append(Node(net, i, args, tmp_path, f"n{i}"))
    healthy, bad = nodes
    pid = out / "pid.1"
    wait_for(lambda: pid.exists() and pid.read_text(), 120, "node 1's worker's pid")
    slow.enter(int(pid.read_text()))  # node 1's worker, throttled mid-run
    assert bad.finish(timeout=120) == EXCLUDED_EXIT_CODE, bad.stderr
    assert "(--straggler-action exclude)" in bad.stderr
    assert healthy.proc.poll() is None, "named while the job runs"
    (events,) = healthy.logs.glob("*/events.jsonl")
    live = status_of(events.parent)  # asked of the running agent
    assert "straggler (round 0): rank 1 on node 1" in live, live
    assert healthy.finish(timeout=180) == 0, healthy.stderr + bad.stderr
    for node in (healthy, bad):
        assert "straggler: rank 1 on node 1" in node.stderr, node.stderr
        named = [e for e in events_of(node) if e["kind"] == "straggler"]
        assert [e["rank"] for e in named] == [1] and named[0]["rate"] < named[0]["median"] / 4
    assert [json.loads(line)["addr"] for line in excl.read_text().splitlines()] == [net.addr(1)]
    result = json.loads((out / "result.json").read_text())
    assert result["value"] == EXPECTED and result["world"] == 1 and result["resumed"] > 0
    assert f"resumed at step {result['resumed']}" in healthy.stdout
    assert "straggler (round 0): rank 1 on node 1" in status_of(events.parent)  # and after


@pytest.mark.slow
def test_a_healthy_job_names_nobody(hosts: object, nodes: list[Node], tmp_path: Path) -> None:
    """The same job with no quota: no straggler on either node (the ranks' rates differ by
    the shared machine's noise only, and the one that finishes first waits, not straggles)."""
    net = hosts(2)  # type: ignore[operator]
    out = tmp_path / "out"
    out.mkdir()
    port = free_port()
    for i in (0, 1):
        args = [*c10d_args(net, port, "2"), "--cold-start", *SHORT,
                worker("straggler_train.py"), str(out), str(STEPS)]  # fmt: skip
        nodes.append(Node(net, i, args, tmp_path, f"n{i}"))
    for node in nodes:
        assert node.finish(timeout=180) == 0, node.stderr
        assert "straggler" not in node.stderr
        assert not [e for e in events_of(node) if e["kind"] == "straggler"]
    assert json.loads((out / "result.json").read_text()) == {
        "value": EXPECTED,
        "resumed": None,
        "world": 2,
    }
