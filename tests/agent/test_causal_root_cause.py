"""The job's root cause is ordered without comparing the clocks of different hosts: a pure
table over records from several hosts (``causal_order``), and two real agents, one with its
wall clock 5 s behind, where the report on both still names the true first failure."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
from pathlib import Path

import psutil
import pytest

from phalanx.errors import UsageError
from phalanx.events import read_events
from phalanx.rendezvous.dynamic.board import Board
from phalanx.rendezvous.dynamic.keys import Keys
from phalanx.rendezvous.stores.agentstore import NO_TOKEN, AgentKVStore
from phalanx.report.classify import classify
from phalanx.report.exits import causal_order, format_report, report_json
from phalanx.resources.ports import free_port
from phalanx.supervisor.clock import OFFSET_ENV, WallClock
from phalanx.supervisor.exits import WorkerExit
from support.hosts import Loopback, Node
from support.launch import PHALANX, run_phalanx, wait_for, worker
from support.slow_replies import SlowReplies

GLOO_RESET = (
    "Traceback (most recent call last):",
    '  File "train.py", line 9, in <module>',
    "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed "
    "by peer [10.0.0.1]:40473",
)


def failed(
    rank: int,
    node: int,
    *,
    seq: int = 0,
    mono: float = 0.0,
    wall: float = 1000.0,
    code: int = 1,
    tail: tuple[str, ...] = (),
) -> WorkerExit:
    """A failure as its node's agent classified it (seq: the store's number, 0: not posted)."""
    exit_ = WorkerExit(
        rank=rank, local_rank=0, host=f"host{node}", pid=100 + rank, returncode=code,
        time=wall, stopped_by_launcher=False, stderr_tail=tail, node_rank=node, seq=seq,
        monotonic=mono,
    )  # fmt: skip
    return classify(exit_)


def order(exits: list[WorkerExit]) -> list[int]:
    return [e.rank for e in causal_order(exits)]


@pytest.mark.parametrize(
    ("exits", "expected"),
    [
        # Host 1's clock is behind: its wall times are earlier, its sequence numbers later.
        ([failed(0, 0, seq=1, wall=1000.0), failed(1, 1, seq=2, wall=995.0)], [0, 1]),
        ([failed(1, 1, seq=2, wall=995.0), failed(0, 0, seq=1, wall=1000.0)], [0, 1]),
        # A Gloo peer reset reported first (seq 1) is still collateral to the real failure.
        ([failed(1, 1, seq=1, wall=990.0, tail=GLOO_RESET), failed(0, 0, seq=2, code=7)], [0, 1]),
        # Only peer errors: the store's order decides between them.
        ([failed(2, 2, seq=3, tail=GLOO_RESET), failed(1, 1, seq=2, tail=GLOO_RESET)], [1, 2]),
        # Three hosts, clocks all over the place: sequence numbers only.
        (
            [
                failed(0, 0, seq=3, wall=1.0),
                failed(1, 1, seq=1, wall=9.0),
                failed(2, 2, seq=2, wall=5.0),
            ],
            [1, 2, 0],
        ),
        # This node's second failure (not posted) follows its posted cause, by its own
        # monotonic clock, and comes before a later node's failure.
        (
            [failed(3, 0, mono=7.0), failed(0, 0, seq=1, mono=5.0), failed(1, 1, seq=2)],
            [0, 3, 1],
        ),
        # Nothing posted (no store): one node's monotonic clock, never its wall clock.
        ([failed(1, 0, mono=2.0, wall=1.0), failed(0, 0, mono=1.0, wall=2.0)], [0, 1]),
    ],
)
def test_causal_order(exits: list[WorkerExit], expected: list[int]) -> None:
    assert order(exits) == expected
    cause = causal_order(exits)[0]
    data = report_json(exits, 1)
    assert isinstance(data["root_cause"], dict) and data["root_cause"]["rank"] == cause.rank
    assert f"Root cause: rank {cause.rank} (local rank 0)" in format_report(exits, 1)


def test_peer_errors_are_told_from_the_evidence() -> None:
    assert failed(1, 1, tail=GLOO_RESET).peer_error
    nccl = ("[rank1]: torch.distributed.DistBackendError: NCCL error: remote process exited "
            "or there was a network error",)  # fmt: skip
    assert failed(1, 1, tail=nccl).peer_error
    store = ("torch.distributed.DistNetworkError: Failed to recv, got 0 bytes. Connection was "
             "likely closed. Did the remote server shutdown or crash?",)  # fmt: skip
    assert failed(1, 1, tail=store).peer_error
    timeout = ("RuntimeError: [pair.cc:598] Timed out waiting 1800000ms for recv operation "
               "to complete",)  # fmt: skip
    assert failed(1, 1, tail=timeout).peer_error
    abort = ("terminate called after throwing an instance of 'gloo::IoException'",
             "  what():  [pair.cc:553] Connection reset by peer")  # fmt: skip
    assert failed(1, 1, code=-signal.SIGABRT, tail=abort).peer_error
    assert not failed(1, 1, tail=("ValueError: the loss is nan",)).peer_error
    # A chosen exit code is the program's own word, whatever it printed before.
    assert not failed(1, 1, code=3, tail=GLOO_RESET[-1:]).peer_error
    # A message about a peer printed before an unrelated traceback does not count.
    earlier = ("Connection reset by peer (retrying)", *GLOO_RESET[:2], "KeyError: 'lr'")
    assert not failed(1, 1, tail=earlier).peer_error


def test_wall_clock_offset_from_the_environment() -> None:
    assert WallClock.from_env({}).offset == 0.0
    assert WallClock.from_env({OFFSET_ENV: "-5"}).offset == -5.0
    for junk in ("soon", "nan", "inf"):
        with pytest.raises(UsageError, match=OFFSET_ENV):
            WallClock.from_env({OFFSET_ENV: junk})


def test_a_junk_wall_clock_offset_is_one_line_and_exit_2(tmp_path: Path) -> None:
    env = dict(os.environ, **{OFFSET_ENV: "soon"})
    done = subprocess.run(
        [*PHALANX, "--log-dir", str(tmp_path), worker("echo_args.py")],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        f"phalanx: error: {OFFSET_ENV}='soon': expected a number of seconds, like -5"
    ]


# A long heartbeat timeout: node 1's agent is held (SIGSTOP) for a moment and must not be
# judged lost meanwhile.
CONF = "heartbeat_interval=0.5,heartbeat_timeout=30,last_call_timeout=1,join_timeout=60"


def report(node: Node) -> dict[str, object]:
    (run_dir,) = node.logs.iterdir()
    return dict(json.loads((run_dir / "report.json").read_text()))


def test_a_host_whose_clock_is_behind_does_not_make_its_collateral_error_the_root_cause(
    hosts: object, nodes: list[Node], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 0 (node 0, true clock) exits 7; rank 1 (node 1, its agent's wall clock 5 s
    behind) then fails in its all_reduce with Gloo's "connection closed by peer". Node 1's
    agent is held with SIGSTOP from before rank 0 fails until rank 1 is dead and node 0 has
    posted its failure, so what happens first is fixed: rank 0 dies, rank 1 fails because of
    it, and node 1's record carries the earlier wall time. Both reports name rank 0, exit
    code 7, and both agents exit 7."""
    net = hosts(2)  # type: ignore[operator]
    port = free_port()
    shared = tmp_path / "shared"
    shared.mkdir()
    for i in (0, 1):
        args = [
            "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"{net.addr(0)}:{port}", "--rdzv-id", "clock", "--rdzv-conf",
            CONF, worker("first_failure.py"), str(shared),
        ]  # fmt: skip
        if i == 1:
            monkeypatch.setenv(OFFSET_ENV, "-5")  # Node copies the environment as it starts
        nodes.append(Node(net, i, args, tmp_path))
    monkeypatch.delenv(OFFSET_ENV)
    wait_for(lambda: len(list(shared.glob("ready.*"))) == 2, 90, "both ranks to meet")
    rank1 = int((shared / "ready.1").read_text())
    held = nodes[1].proc.pid
    # Warm start: rank 1's parent is node 1's template, which keeps running (and reaping)
    # while the agent is held.
    assert psutil.Process(rank1).ppid() != held
    os.kill(held, signal.SIGSTOP)
    try:
        (shared / "go").touch()
        # Gone from /proc: rank 1 has died and its parent, node 1's template, has reaped it,
        # so node 1's agent finds its exit pending (and its status sent) when it resumes.
        wait_for(lambda: not Path(f"/proc/{rank1}").exists(), 60, "rank 1 to fail and be reaped")
        wait_for(lambda: "exit code 7 (attempt 0)" in nodes[0].stderr, 60, "node 0's record")
    finally:
        os.kill(held, signal.SIGCONT)
    codes = [node.finish(120) for node in nodes]
    errs = nodes[0].stderr + nodes[1].stderr
    assert codes == [7, 7], errs
    both = [report(node) for node in nodes]
    for node, data in zip(nodes, both, strict=True):
        cause = data["root_cause"]
        assert isinstance(cause, dict), node.stderr
        assert (cause["rank"], cause["exit_code"], data["kind"]) == (0, 7, "exit_code"), errs
        assert "Root cause: rank 0 (local rank 0)" in node.stderr
    # Node 1 saw its own collateral failure: a Gloo error, noticed at an earlier wall time
    # than rank 0's exit, and posted after it.
    exits = {e["rank"]: e for e in both[1]["exits"]}  # type: ignore[attr-defined]
    assert both[1]["also_failed"] == [1], errs
    assert exits[1]["peer_error"] is True and exits[1]["kind"] == "exception", exits[1]
    assert exits[1]["time"] < exits[0]["time"], (exits[0]["time"], exits[1]["time"])
    assert exits[0]["seq"] < exits[1]["seq"], (exits[0]["seq"], exits[1]["seq"])


def test_each_node_orders_its_own_failure_by_the_stores_number(
    nodes: list[Node], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two failures of their own (no peer error). Node A reaches the store (hosted by node
    B) through a proxy whose answers are slowed to 3 s once both workers run
    (``support/slow_replies.py``), and its wall clock is 5 s ahead. A's worker fails first:
    A posts it, the store numbers it 1 and holds it at once, and A hears so later. Meanwhile B's
    worker fails and B posts it as number 2, so A's report, read after, holds both. Each
    node must order its own failure by the number the store gave it: both reports name A's
    worker, exit 7 -- though by the wall clocks B's record reads as the earlier, and a node
    that left its own failure unnumbered would put it after every numbered one (A would
    name B's worker)."""
    port, shared = free_port(), tmp_path / "shared"
    shared.mkdir()
    proxy = SlowReplies(port)
    try:
        for name, endpoint, host, role in (
            ("b", port, "true", "second"),
            ("a", proxy.port, "false", "first"),
        ):
            args = [
                "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                "--rdzv-endpoint", f"127.0.0.1:{endpoint}", "--rdzv-id", "order",
                "--rdzv-conf", f"{CONF},is_host={host},read_timeout=30",
                "--allow-per-node-args", worker("two_failures.py"), str(shared), role,
            ]  # fmt: skip
            if name == "a":  # B's store is up: the proxy connects to it as A does
                wait_for(lambda: _listening(port), 60, "node B's store")
                monkeypatch.setenv(OFFSET_ENV, "5")  # Node copies the environment as it starts
            nodes.append(Node(Loopback(), 0, args, tmp_path, name))
        monkeypatch.delenv(OFFSET_ENV)
        a, b = nodes[1], nodes[0]
        wait_for(lambda: len(list(shared.glob("ready.*"))) == 2, 90, "both workers to start")
        first = int((shared / "ready.first").read_text().split()[1])
        proxy.delay = 3.0
        (shared / "go.first").touch()
        store = AgentKVStore.connect(
            "127.0.0.1", port, token=NO_TOKEN, connect_timeout=10, read_timeout=10
        )
        try:
            board = Board(store, Keys("order"), "the test")
            # numbered and written (a number, then the record under it), its answer not yet
            wait_for(lambda: len(board.failures()) == 1, 60, "A's failure record")
            (shared / "go.second").touch()
            wait_for(lambda: len(board.failures()) == 2, 60, "B's failure record")
        finally:
            store.close()
        # Both numbered: the order is made, and A's late answer is on its way. Later answers
        # need not be slow; every one of A's calls, to the job's end, took 3 s more before.
        proxy.delay = 0.0
        codes = [node.finish(120) for node in nodes]
    finally:
        proxy.close()
    errs = a.stderr + b.stderr
    assert codes == [7, 7], errs
    for node in (a, b):
        data = report(node)
        cause = data["root_cause"]
        assert isinstance(cause, dict), node.stderr
        assert (cause["rank"], cause["exit_code"]) == (first, 7), node.stderr
        assert f"Root cause: rank {first} (local rank 0)" in node.stderr, node.stderr
    exits = {e["exit_code"]: e for e in report(a)["exits"]}  # type: ignore[attr-defined]
    assert sorted(exits) == [5, 7] and exits[5]["peer_error"] is False, exits
    assert exits[7]["seq"] < exits[5]["seq"], (exits[7]["seq"], exits[5]["seq"])
    assert exits[5]["time"] < exits[7]["time"], (exits[7]["time"], exits[5]["time"])
    # B's own failure came second: its failure event (and so its recovery line) names the
    # job's root cause as known when it recorded it, A's rank on A's node, not its own rank.
    (events_file,) = b.logs.glob("*/events.jsonl")
    failures = [e for e in read_events(events_file) if e["kind"] == "failure"]
    assert failures and failures[0]["rank"] == first and not failures[0]["local"], failures


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(0.5)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def test_a_peer_error_on_a_node_alone_restarts_without_waiting_for_a_cause(
    tmp_path: Path,
) -> None:
    """One node (``--standalone``), two ranks: rank 0 leaves early (exit 0) and rank 1 fails
    with a peer error. No other node can post the record of a cause, so the restart does
    not wait for one (it polled for 4 heartbeat intervals + 2 s: 242 s here, with
    heartbeat_interval 60; the run's bound, 150 s, only catches a hang)."""
    done = run_phalanx(
        ["--standalone", "--nproc-per-node", "2", "--max-restarts", "1",
         "--rdzv-conf", "heartbeat_interval=60,heartbeat_timeout=300",
         "--log-dir", str(tmp_path), worker("rank0_leaves_early.py")],
        timeout=150,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("ok world=2 restart=1") == 2, done.stdout
    # The case under test: rank 1's first failure was a peer error.
    (log,) = tmp_path.glob("*/attempt_0/rank_1/stderr.log")
    tail = tuple(log.read_text(errors="replace").splitlines()[-3:])
    assert failed(1, 0, tail=tail).peer_error, tail
