"""Crash loops are judged job-wide: progress anywhere in the job (a checkpoint, a progress
counter that moved) keeps a recurring failure from being called a crash loop, on every node;
with no progress anywhere, the same failure twice in a row stops the job at once, with the
same verdict on every node. Real agents (two c10d nodes, one worker each, warm) and the
single-node path, which goes through the same code."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from phalanx.resources.ports import free_port
from support.etcd_server import EtcdCluster
from support.hosts import Loopback, Node
from support.launch import run_phalanx, worker
from support.multinode import ETCD_CONF, Hosts, c10d_args
from support.tools import needs_etcd

MAX_RESTARTS = 3
FAILURE = "rank 1, exit code 3: rank 1 fails the same way"


def _report(logs: Path) -> dict[str, object]:
    (path,) = logs.glob("*/report.json")
    data = json.loads(path.read_text())
    assert isinstance(data, dict)
    return data


def _two_nodes(
    net: Hosts, nodes: list[Node], tmp_path: Path, evidence: str, rdzv: list[str] | None = None
) -> None:
    """Rank 0 (node 0) shows ``evidence`` every attempt; rank 1 (node 1) then fails the same
    way. ``rdzv``: the rendezvous flags (default: c10d, hosted by node 0)."""
    rdzv = rdzv or c10d_args(net, free_port(), "2")
    shared = tmp_path / "shared"
    shared.mkdir()
    for i in (0, 1):
        args = [*rdzv, "--max-restarts", str(MAX_RESTARTS),
                worker("progress_or_fail.py"), str(shared), evidence]  # fmt: skip
        nodes.append(Node(net, i, args, tmp_path, f"n{i}"))
    codes = [n.finish(timeout=240) for n in nodes]
    assert codes == [3, 3], nodes[0].stderr + nodes[1].stderr


def _spent_every_restart(nodes: list[Node]) -> None:
    for node in nodes:
        assert node.stderr.count("restarting the worker group") == MAX_RESTARTS, node.stderr
        assert "crash loop" not in node.stderr
        report = _report(node.logs)
        assert report["crash_loop"] is False
        assert report["verdict"] is None  # the budget was spent: nothing left to judge
        assert report["attempts"] == MAX_RESTARTS + 1
        # Every round judged (all but the last) after the first was the same failure again.
        again = f"the same failure as the last one ({FAILURE}), but the job progressed since"
        assert node.stderr.count(again) == MAX_RESTARTS - 1, node.stderr


@pytest.mark.parametrize("evidence", ["checkpoint", "optimizer"])
def test_progress_on_one_node_keeps_the_others_failure_restarting(
    hosts: object, nodes: list[Node], tmp_path: Path, evidence: str
) -> None:
    """Node 1's ranks never save and never step: alone it would call this a crash loop. Node
    0's checkpoint (or optimizer steps, no checkpoint at all) counts for the whole job, so
    both nodes spend every restart."""
    _two_nodes(hosts(2), nodes, tmp_path, evidence)  # type: ignore[operator]
    _spent_every_restart(nodes)


def test_the_node_without_progress_proposing_first_still_counts_the_others_progress(
    hosts: object, nodes: list[Node], tmp_path: Path
) -> None:
    """The verdict is written by the node that proposes first, which is the node that judges
    the round last. Here that is the node with no progress: rank 1 fails next to rank 0,
    which steps; the other node's rank 3 ignores SIGTERM, so that node ends its round only
    after its 3 s grace, judges last and proposes at once. Its proposal must still count
    rank 0's steps (the job's evidence, not its own): both nodes spend every restart."""
    net = hosts(2)  # type: ignore[operator]
    shared = tmp_path / "shared"
    shared.mkdir()
    rdzv = c10d_args(net, free_port(), "2")
    rdzv[rdzv.index("--nproc-per-node") + 1] = "2"
    for i in (0, 1):
        args = [*rdzv, "--max-restarts", "2", "--shutdown-timeout", "3",
                worker("progress_then_slow_stop.py"), str(shared)]  # fmt: skip
        nodes.append(Node(net, i, args, tmp_path, f"n{i}"))
    codes = [n.finish(timeout=240) for n in nodes]
    errs = nodes[0].stderr + nodes[1].stderr
    assert codes == [3, 3], errs
    for node in nodes:
        assert node.stderr.count("restarting the worker group") == 2, node.stderr
        assert "crash loop" not in node.stderr, node.stderr
        report = _report(node.logs)
        assert (report["crash_loop"], report["attempts"]) == (False, 3), report
    # the arrangement held: the node of ranks 2 and 3 waited out rank 3's grace each time
    slow = [n for n in nodes if list(n.logs.glob("*/attempt_0/rank_3"))]
    assert len(slow) == 1 and "killed by SIGKILL" in slow[0].stderr, errs


@needs_etcd
def test_progress_on_one_node_counts_for_the_job_on_etcd(nodes: list[Node], tmp_path: Path) -> None:
    """The same agreement through a real etcd server (two agents on loopback)."""
    with EtcdCluster(size=1) as etcd:
        rdzv = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "etcd",
                "--rdzv-endpoint", etcd.endpoints[0].removeprefix("http://"),
                "--rdzv-id", "loop", "--rdzv-conf", ETCD_CONF]  # fmt: skip
        _two_nodes(Loopback(), nodes, tmp_path, "checkpoint", rdzv)
    _spent_every_restart(nodes)


def test_no_progress_anywhere_is_a_crash_loop_on_every_node(
    hosts: object, nodes: list[Node], tmp_path: Path
) -> None:
    """The same failure twice with nothing saved or stepped anywhere: both nodes stop after
    the second attempt, print the same verdict and record it."""
    _two_nodes(hosts(2), nodes, tmp_path, "none")  # type: ignore[operator]
    for node in nodes:
        assert node.stderr.count("restarting the worker group") == 1, node.stderr
        assert f"crash loop: the same failure twice in a row ({FAILURE})" in node.stderr
        report = _report(node.logs)
        assert report["crash_loop"] is True
        assert report["verdict"] == {"failure": FAILURE, "previous": FAILURE, "progressed": False}
        assert report["attempts"] == 2


@pytest.mark.parametrize(
    ("evidence", "loop"), [("step", False), ("heartbeat", False), ("none", True)]
)
def test_single_node_is_judged_the_same_way(tmp_path: Path, evidence: str, loop: bool) -> None:
    """--standalone (the local rendezvous): phalanx.step() or phalanx.heartbeat() counts as
    progress without any checkpoint; without either, the second identical failure is a
    crash loop."""
    shared = tmp_path / "shared"
    shared.mkdir()
    result = run_phalanx(
        ["--standalone", "--nproc-per-node", "1", "--max-restarts", str(MAX_RESTARTS),
         "--log-dir", str(tmp_path / "logs"), worker("progress_or_fail.py"), str(shared),
         evidence],
    )  # fmt: skip
    assert result.returncode == 3, result.stderr
    restarts = 1 if loop else MAX_RESTARTS
    assert result.stderr.count("restarting the worker group") == restarts, result.stderr
    assert ("crash loop" in result.stderr) is loop
    report = _report(tmp_path / "logs")
    assert report["crash_loop"] is loop
    failure = "rank 0, exit code 3: rank 0 fails the same way"
    if loop:
        assert report["verdict"] == {"failure": failure, "previous": failure, "progressed": False}
    else:
        again = f"the same failure as the last one ({failure}), but the job progressed since"
        assert result.stderr.count(again) == MAX_RESTARTS - 1, result.stderr


def test_a_program_with_no_progress_signal_at_all_is_a_crash_loop(tmp_path: Path) -> None:
    """--no-python: no checkpoint log, no counters; the same failure twice stops the job."""
    result = run_phalanx(
        ["--standalone", "--no-python", "--max-restarts", str(MAX_RESTARTS),
         "--log-dir", str(tmp_path / "logs"), "sh", "-c", "echo no luck >&2; exit 3"],
    )  # fmt: skip
    assert result.returncode == 3, result.stderr
    assert result.stderr.count("restarting the worker group") == 1, result.stderr
    assert "crash loop: the same failure twice in a row (rank 0, exit code 3: no luck)" in (
        result.stderr
    )
    assert _report(tmp_path / "logs")["crash_loop"] is True



def test_a_last_step_written_again_at_the_same_step_is_no_progress(tmp_path: Path) -> None:
    """Rank 0 holds a last step at step 7 every attempt, which the agent's stop asks it to
    write; rank 1 fails the same way each time. The first attempt writes step 7 (progress);
    the second finds it complete and writes nothing, not even the heartbeat a save's pause
    ends with: no progress, so the second identical failure is a crash loop."""
    shared = tmp_path / "shared"
    shared.mkdir()
    result = run_phalanx(
        ["--standalone", "--nproc-per-node", "2", "--max-restarts", str(MAX_RESTARTS),
         "--log-dir", str(tmp_path / "logs"), worker("progress_or_fail.py"), str(shared),
         "laststep"],
    )  # fmt: skip
    assert result.returncode == 3, result.stderr
    assert result.stderr.count("restarting the worker group") == 1, result.stderr
    assert "crash loop: the same failure twice in a row" in result.stderr, result.stderr
    assert _report(tmp_path / "logs")["crash_loop"] is True
    assert "rank0 wrote its last step 7" in result.stderr, result.stderr
    assert "rank0: its last step 7 was complete already" in result.stderr, result.stderr
    (log,) = (tmp_path / "logs").glob("*/checkpoints.jsonl")
    steps = [json.loads(line)["step"] for line in log.read_text().splitlines()]
    assert steps == [7], steps
