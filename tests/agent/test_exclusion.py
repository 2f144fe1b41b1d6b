"""Exclusion of bad nodes (``--exclude-after``, ``--exclude-file``): real agents (two c10d
nodes in network namespaces, one worker each). The node whose worker is the job's root
cause K rounds in a row leaves with exit 69, the elastic job re-forms without it and
finishes, the file names it, and a rerun with the same file does not admit it."""

from __future__ import annotations

import json
from pathlib import Path

from phalanx.exclusion import (
    EXCLUDED_EXIT_CODE,
    NodeName,
    Streak,
    exclude,
    excluded,
    exclusion_of,
    requeue_exclusions,
    slurm_names,
)
from phalanx.resources.ports import free_port
from support.hosts import Node
from support.launch import worker
from support.multinode import c10d_args


def test_streak_counts_root_causes_in_a_row() -> None:
    streak = Streak()
    for here, count in [(True, 1), (True, 2), (False, 0), (True, 1)]:
        streak = streak.after(here)
        assert streak.count == count


def test_file_api_matches_address_then_host(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "excluded.jsonl"
    exclude(path, NodeName("h1", "10.0.0.2"), "bad gpu")
    exclude(path, NodeName("h2"), "slow")
    with open(path, "a") as handle:
        handle.write("{torn\n")  # a torn line is skipped, never fatal
    assert excluded(path) == {"10.0.0.2", "h2"}
    assert exclusion_of([path], NodeName("h1", "10.0.0.3")) is None  # same host, other addr
    found = exclusion_of([path], NodeName("other", "10.0.0.2"))
    assert found is not None and found.reason == "bad gpu"
    assert exclusion_of([path], NodeName("h2", "10.0.0.9")) is not None


def test_under_slurm_the_slurm_name_alone_names_the_node(tmp_path: Path) -> None:
    """Slurm's test nodes (and containers) share one host name: an entry with a Slurm name
    matches that Slurm node only; ``--requeue`` keeps out the Slurm names, and the host name
    of a hand-written line."""
    path = tmp_path / "excluded.jsonl"
    exclude(path, NodeName("box", None, "node2"), "slow")
    path.open("a").write('{"node": "gpu-17"}\n{"node": "x", "addr": "10.0.0.5"}\n')
    assert exclusion_of([path], NodeName("box", None, "node2")) is not None
    assert exclusion_of([path], NodeName("box", None, "node3")) is None
    assert json.loads(path.read_text().splitlines()[0])["slurm"] == "node2"
    assert slurm_names([path, tmp_path / "absent"]) == ["node2", "gpu-17"]


def test_requeue_keeps_out_the_exclude_files_slurm_nodes(tmp_path: Path) -> None:
    """``--requeue``'s list: the Slurm names of ``--exclude-file`` (none without one)."""
    path = tmp_path / "excluded.jsonl"
    exclude(path, NodeName("box", None, "node2"), "slow")
    exclude(path, NodeName("box", "10.0.0.7"), "no Slurm name, an address: not a Slurm node")
    assert requeue_exclusions(path) == ["node2"]
    assert requeue_exclusions(None) == []
    assert requeue_exclusions(tmp_path / "absent.jsonl") == []


def test_node_failing_k_times_is_excluded_and_kept_out(
    hosts: object, nodes: list[Node], tmp_path: Path
) -> None:
    net = hosts(2)  # type: ignore[operator]
    shared = tmp_path / "shared"
    shared.mkdir()
    excl = tmp_path / "excluded.jsonl"
    flags = ["--max-restarts", "3", "--exclude-after", "2", "--exclude-file", str(excl),
             "--cold-start"]  # fmt: skip
    port = free_port()
    for i in (0, 1):
        args = [*c10d_args(net, port, "1:2"), *flags, worker("fail_on_node.py"), str(shared)]
        env = {"FAIL_HERE": "1"} if i == 1 else {}
        nodes.append(Node(net, i, args, tmp_path, f"n{i}", env=env))
    healthy, bad = nodes
    assert bad.finish(timeout=240) == EXCLUDED_EXIT_CODE, bad.stderr
    assert "is excluded: its worker was the job's root cause in 2 failed rounds" in bad.stderr
    assert healthy.finish(timeout=240) == 0, healthy.stderr + bad.stderr
    assert "finished without the failing node" in healthy.stdout
    entries = [json.loads(line) for line in excl.read_text().splitlines()]
    assert [e["addr"] for e in entries] == [net.addr(1)]
    (run_file,) = bad.logs.glob("*/excluded.jsonl")
    assert json.loads(run_file.read_text())["addr"] == net.addr(1)
    events = [json.loads(x) for x in next(bad.logs.glob("*/events.jsonl")).read_text().splitlines()]
    assert any(e["kind"] == "excluded" for e in events)
    # A rerun with the same file: the node leaves before it joins; the healthy node runs alone.
    (shared / "failed").touch()
    port = free_port()
    again = [*c10d_args(net, port, "1:2", run_id="again"), *flags,
             worker("fail_on_node.py"), str(shared)]  # fmt: skip
    rerun = Node(net, 1, again, tmp_path, "rerun1", env={"FAIL_HERE": "1"})
    nodes.append(rerun)
    assert rerun.finish(timeout=120) == EXCLUDED_EXIT_CODE, rerun.stderr
    assert "is excluded from the job" in rerun.stderr
    assert "leaving before it joins" in rerun.stderr
    assert not list(rerun.logs.glob("*/workers*")), "no worker started on an excluded node"
