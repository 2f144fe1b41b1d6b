"""The node check (docs/how-to/nodes.md, "Node check"): ``phalanx check`` on 4 real hosts (network
namespaces), each fault injected for real on one node, and the same check before a job's
round.

- a slow node: its agent (and what it starts) under a CPU quota of 2 % of a core (a cgroup
  of the test's own: v1 ``cpu.cfs_quota_us`` here, v2 ``cpu.max`` elsewhere; so low since
  on this shared 2-core machine a healthy "node" may get no more than a fifth of a core).
  The agent is moved into it once it has joined the rendezvous, before the other nodes
  start, so before any round and its check: its start-up (0.4 s of CPU, 20 s at 2 %) is
  not what is tested;
- a lossy link: a fifth of node 1's packets dropped at random, in and out (iptables);
- a slow link: node 3's sending rate limited to 4 Mbit/s (``tc tbf``).

Each must be named by every node, in one line with its figure and the median, and no other
node; healthy runs name nobody. Timeouts only catch hangs.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from phalanx.errors import REQUEUE_EXIT_CODE
from phalanx.events import read_events
from phalanx.resources.ports import free_port
from support import cpuquota
from support.failover import kill_tree
from support.hosts import NamespaceHosts, Node
from support.launch import wait_for, worker
from support.linkfaults import lossy, rate_limit
from support.netns import NetNamespaces

HANG = 180.0
N = 4
TOKEN = {"PHALANX_RDZV_TOKEN": "node-check-test-token"}
NAMED = re.compile(r"^(?:phalanx: )?node check: node \d+ \([^,]*, ([^)]+)\)", re.M)


def rdzv(
    spaces: NetNamespaces,
    i: int,
    port: int,
    run_id: str,
    nnodes: str = str(N),
    last_call: int = 1,
    more: str = "",
) -> list[str]:
    """Node ``i``'s rendezvous flags (``more``: further ``--rdzv-conf`` keys, ``k=v,...``)."""
    conf = f"join_timeout=120,last_call_timeout={last_call},is_host={str(i == 0).lower()}"
    conf += f",{more}" if more else ""
    return ["--nnodes", nnodes, "--rdzv-backend", "c10d", "--rdzv-endpoint",
            f"{spaces.addr(0)}:{port}", "--rdzv-id", run_id, "--rdzv-conf", conf]  # fmt: skip


def check(
    spaces: NetNamespaces,
    nodes: list[Node],
    tmp: Path,
    run_id: str,
    slow: tuple[int, cpuquota.CpuQuota] | None = None,
) -> list[tuple[int, str]]:
    """``phalanx check`` on every node (``slow``: that node under that quota, ``throttle``);
    each node's exit code and output."""
    net = NamespaceHosts(spaces)
    port = free_port()

    def start(i: int) -> Node:
        args = rdzv(spaces, i, port, run_id)
        return Node(net, i, args, tmp, f"{run_id}-n{i}", env=TOKEN, subcommand="check")

    started = {i: start(i) for i in sorted({0} if slow is None else {0, slow[0]})}
    nodes += started.values()
    if slow is not None:
        throttle(started[slow[0]], slow[1], f" of {N} present")
    rest = {i: start(i) for i in range(N) if i not in started}
    nodes += rest.values()
    ordered = [(started | rest)[i] for i in range(N)]
    return [(node.finish(HANG), node.stdout + node.stderr) for node in ordered]


def throttle(node: Node, quota: cpuquota.CpuQuota, joined: str) -> None:
    """Once ``node`` says ``joined`` (its "waiting for nodes: K of N present" line: it is in
    the rendezvous, and no round, so no check, can start without the nodes not started yet),
    move its agent and every process it started into ``quota``."""
    wait_for(lambda: joined in node.stderr, HANG, f"{node.err.stem} to join the rendezvous")
    agent = psutil.Process(node.proc.pid)  # (ip netns exec runs the agent in its own process)
    for proc in [agent, *agent.children(recursive=True)]:
        quota.enter(proc.pid)


def named(output: str) -> set[str]:
    """The addresses of the nodes named (node ranks follow the order of arrival)."""
    return set(NAMED.findall(output))


@pytest.mark.slow
def test_healthy_nodes_are_named_by_nobody(
    netns: Callable[[int], NetNamespaces], nodes: list[Node], tmp_path: Path
) -> None:
    spaces = netns(N)
    for run in range(3):  # repeated: no false positive on a shared, loaded machine
        results = check(spaces, nodes, tmp_path, f"healthy{run}")
        for code, output in results:
            assert code == 0 and not named(output), output
            assert "median" in output and output.count(" ok") >= N, output


@pytest.mark.slow
def test_a_node_under_a_cpu_quota_is_named_by_every_node(
    netns: Callable[[int], NetNamespaces],
    nodes: list[Node],
    tmp_path: Path,
    quota: Callable[[float], cpuquota.CpuQuota],
) -> None:
    spaces = netns(N)
    results = check(spaces, nodes, tmp_path, "quota", (2, quota(0.02)))
    for code, output in results:
        assert code == 1 and named(output) == {spaces.addr(2)}, output
        line = next(x for x in output.splitlines() if spaces.addr(2) + ")" in x)
        assert "computes slowly" in line and "Mop/s, median" in line, line


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["lossy", "slow"])
def test_a_bad_link_is_put_on_its_node(
    netns: Callable[[int], NetNamespaces], nodes: list[Node], tmp_path: Path, fault: str
) -> None:
    spaces = netns(N)
    bad = 1 if fault == "lossy" else 3
    if fault == "lossy":
        lossy(spaces, bad, 0.2, on=True)
    else:
        rate_limit(spaces, bad, "4mbit")
    results = check(spaces, nodes, tmp_path, fault)
    # Every node's output, the bad one's first: a CI run (ci55) where node 1 never joined
    # showed only node 0's, which said nothing of why.
    every = "\n".join(f"--- node {i} ({code}):\n{out}" for i, (code, out) in
                      sorted(enumerate(results), key=lambda r: r[0] != bad))  # fmt: skip
    for code, output in results:
        assert code == 1 and named(output) == {spaces.addr(bad)}, every
        line = next(x for x in output.splitlines() if spaces.addr(bad) + ")" in x)
        assert "network" in line and "median" in line, line


@pytest.mark.slow
def test_a_job_checks_its_nodes_before_the_round(
    netns: Callable[[int], NetNamespaces],
    nodes: list[Node],
    tmp_path: Path,
    quota: Callable[[float], cpuquota.CpuQuota],
) -> None:
    """A 4-node job (1 worker each, a script that prints a line) with node 2's agent under
    the quota: the check names it in the log, ``events.jsonl``, ``report.json`` and
    ``phalanx status``; the job still runs (``--node-check warn``). The quota is lifted once
    every node named it: the rest of node 2's job at 2 % of a core took 6-7 s more."""
    spaces = netns(N)
    slow = quota(0.02)
    net = NamespaceHosts(spaces)
    port = free_port()

    def start(i: int) -> Node:
        args = [*rdzv(spaces, i, port, "job"), "--nproc-per-node", "1", "--cold-start",
                worker("echo_args.py")]  # fmt: skip
        return Node(net, i, args, tmp_path, f"n{i}", env=TOKEN)

    first = [start(0), start(2)]
    nodes += first
    throttle(first[1], slow, f" of {N} present")
    nodes[:] = [first[0], start(1), first[1], start(3)]
    said = lambda: all(named(n.stderr) for n in nodes)  # noqa: E731
    wait_for(said, HANG, "every node's check to name a node")
    slow.lift()  # the check is done: node 2's worker need not start and run at 2 %
    assert [n.finish(HANG) for n in nodes] == [0] * N, nodes[0].stderr + nodes[2].stderr
    for node in nodes:
        assert named(node.stderr) == {spaces.addr(2)}, node.stderr
        (run_dir,) = node.logs.iterdir()
        (event,) = [e for e in read_events(run_dir / "events.jsonl") if e["kind"] == "node_check"]
        assert {n["addr"] for n in event["named"]} == {spaces.addr(2)}, event
        report = json.loads((run_dir / "report.json").read_text())
        assert named("\n".join(report["node_check"])) == {spaces.addr(2)}, report
        status = subprocess.run(
            [sys.executable, "-m", "phalanx", "status", str(run_dir)],
            capture_output=True, text=True, timeout=HANG,
        )  # fmt: skip
        assert named(status.stdout) == {spaces.addr(2)}, status.stdout


@pytest.mark.slow
def test_exclude_makes_the_slow_node_leave_and_the_job_goes_on_without_it(
    netns: Callable[[int], NetNamespaces],
    nodes: list[Node],
    tmp_path: Path,
    quota: Callable[[float], cpuquota.CpuQuota],
) -> None:
    """``--node-check exclude`` in an elastic job (3:4 nodes): the node under the quota
    exits 69 with one line saying so; the others form a round of 3 and finish. (The slow
    node joins before the others start, and is throttled then: ``throttle``.)"""
    spaces = netns(N)
    slow = quota(0.02)
    net = NamespaceHosts(spaces)
    port = free_port()

    def start(i: int) -> Node:
        args = [*rdzv(spaces, i, port, "exclude", f"3:{N}", 10), "--nproc-per-node", "1",
                "--cold-start", "--node-check", "exclude", worker("echo_args.py")]  # fmt: skip
        return Node(net, i, args, tmp_path, f"n{i}", env=TOKEN)

    first = [start(0), start(2)]  # the slow node is in before the others come
    nodes += first
    throttle(first[1], slow, f" of 3..{N} present")
    nodes[:] = [first[0], start(1), first[1], start(3)]
    codes = [n.finish(HANG) for n in nodes]
    assert codes == [0, 0, 69, 0], "".join(n.stderr for n in nodes)
    last = nodes[2].stderr.strip().splitlines()[-1]
    assert last.startswith("phalanx: node check: this node") and "is excluded" in last, last
    for i in (0, 1, 3):
        assert "world size 3" in nodes[i].stderr, nodes[i].stderr
        assert '"rank"' in nodes[i].stdout, nodes[i].stdout


@pytest.mark.slow
def test_a_node_with_the_check_off_makes_the_others_skip_it(
    netns: Callable[[int], NetNamespaces], nodes: list[Node], tmp_path: Path
) -> None:
    """Node 1 runs with ``--node-check off``: it says so through the store, so node 0 skips
    the check (one line) instead of waiting for records that never come; both finish."""
    spaces = netns(2)
    net = NamespaceHosts(spaces)
    port = free_port()
    for i in (0, 1):
        off = ["--node-check", "off"] if i == 1 else []
        args = [*rdzv(spaces, i, port, "off", "2"), *off, "--cold-start", worker("echo_args.py")]
        nodes.append(Node(net, i, args, tmp_path, f"n{i}", env=TOKEN))
    assert [n.finish(HANG) for n in nodes] == [0, 0], nodes[0].stderr + nodes[1].stderr
    assert "round 0: node check skipped: a node runs with --node-check off" in nodes[0].stderr
    assert "node check" not in nodes[1].stderr, nodes[1].stderr


# Round 0's line on each node: the check passed, or (every run directory below a free-space
# floor no disk meets) named both nodes under the default --node-check warn: the job starts
# anyway, so the same agents are not checked again either (the soak's every restart was)
PASSED = ([], "round 0: node check passed on 2 nodes")
WARNED = (["--node-check-thresholds", "min_free_mb=999999"], "MiB free (under 999999 MiB)")


@pytest.mark.slow
@pytest.mark.parametrize("flags,said", [PASSED, WARNED], ids=["passed", "warned"])
def test_a_restart_with_the_same_nodes_does_not_check_them_again(
    netns: Callable[[int], NetNamespaces], nodes: list[Node], tmp_path: Path,
    flags: list[str], said: str,
) -> None:  # fmt: skip
    """2 nodes, rank 1 fails before its first collective on the first attempt
    (``flaky_dist.py``), one restart: round 0 checks (one ``node_check`` event on each
    node), the restart's round says in one line that its agents were checked before and
    checks nobody, and the job finishes with both ranks' sum."""
    spaces = netns(2)
    net = NamespaceHosts(spaces)
    port = free_port()
    for i in (0, 1):
        args = [*rdzv(spaces, i, port, "again", "2"), "--nproc-per-node", "1", *flags,
                "--max-restarts", "1", worker("flaky_dist.py"), "1"]  # fmt: skip
        nodes.append(Node(net, i, args, tmp_path, f"n{i}", env=TOKEN))
    assert [n.finish(HANG) for n in nodes] == [0, 0], nodes[0].stderr + nodes[1].stderr
    for node in nodes:
        assert said in node.stderr, node.stderr
        again = r"round [1-9]\d*: node check not repeated: each of its 2 nodes was checked in an earlier round"  # fmt: skip
        assert re.search(again, node.stderr), node.stderr
        (run_dir,) = node.logs.iterdir()
        found = read_events(run_dir / "events.jsonl")
        assert [e["round"] for e in found if e["kind"] == "node_check"] == [0], found
    assert "world=2 sum=3 restart=1" in nodes[0].stdout + nodes[1].stdout, nodes[0].stdout


def lost_in_its_check(
    netns: Callable[[int], NetNamespaces],
    nodes: list[Node],
    tmp_path: Path,
    quota: Callable[[float], cpuquota.CpuQuota],
    script: str,
) -> tuple[NetNamespaces, list[int], str]:
    """3 nodes at ``--nnodes 2:3`` running ``script`` (1 worker each, ``--max-restarts 1``);
    node 2 (under the quota, so its check takes seconds) is SIGKILLed whole, agent, guardian
    and all, as soon as round 0 has formed: the others wait for its records. The namespaces,
    the survivors' exit codes, and every node's output (for assertion messages)."""
    spaces = netns(3)
    slow = quota(0.02)
    net = NamespaceHosts(spaces)
    port = free_port()

    def start(i: int) -> Node:
        args = [*rdzv(spaces, i, port, "lostcheck", "2:3", 8, "heartbeat_timeout=4"),
                "--nproc-per-node", "1", "--max-restarts", "1", "--cold-start",
                worker(script)]  # fmt: skip
        return Node(net, i, args, tmp_path, f"n{i}", env=TOKEN)

    first = [start(0), start(2)]
    nodes += first
    throttle(first[1], slow, " of 2..3 present")
    nodes[:] = [first[0], start(1), first[1]]
    wait_for(lambda: "round 0: node rank" in nodes[0].stderr, HANG, "round 0 to form")
    kill_tree(nodes[2].proc.pid)
    nodes[2].proc.wait(HANG)
    codes = [n.finish(HANG) for n in nodes[:2]]
    every = f"codes {codes}\n" + "".join(f"--- node {i}:\n{n.stderr}" for i, n in enumerate(nodes))
    return spaces, codes, every


@pytest.mark.slow
def test_a_member_lost_while_the_others_wait_for_its_check_ends_their_wait(
    netns: Callable[[int], NetNamespaces],
    nodes: list[Node],
    tmp_path: Path,
    quota: Callable[[float], cpuquota.CpuQuota],
) -> None:
    """``lost_in_its_check``: the survivors' watch finds node 2 lost at ``heartbeat_timeout``,
    and that ends their check at once ("node check stopped: ... sent no heartbeat"), not the
    check's minute-long wait for a record that never comes (the 30-minute c10d soak lost 2.5
    minutes so: the round's judgement waited for a survivor still in its check). They finish
    in a round of 2, their workers all-reducing (``flaky_dist.py``)."""
    spaces, codes, every = lost_in_its_check(netns, nodes, tmp_path, quota, "flaky_dist.py")
    assert codes == [0, 0], every
    for node in nodes[:2]:
        line = next((x for x in node.stderr.splitlines() if "node check stopped:" in x), "")
        assert "round 0: node check stopped:" in line and "sent no heartbeat" in line, every
        assert spaces.addr(2) in line, line
        assert "did not answer the node check" not in node.stderr, every
        assert "world size 2" in node.stderr, every
    assert "world=2 sum=3 restart=1" in nodes[0].stdout + nodes[1].stdout, every


@pytest.mark.slow
def test_a_round_that_ended_in_its_check_starts_no_workers(
    netns: Callable[[int], NetNamespaces],
    nodes: list[Node],
    tmp_path: Path,
    quota: Callable[[float], cpuquota.CpuQuota],
) -> None:
    """``lost_in_its_check`` with workers that need no peer (``say_world.py`` prints a line
    and exits 0): round 0 ended while the survivors waited for node 2's check, and they fork
    no worker for it ("round 0 ended before its workers started: node 1 was lost: ..."; no
    ``workers_started`` of round 0 in their events, its ``failure`` recorded) but spend the
    restart a lost node spends and finish in a round of 2. Forked for the dead round, a
    worker could finish before its node acted on the loss, and the job then failed
    ("finished workers are not run again")."""
    spaces, codes, every = lost_in_its_check(netns, nodes, tmp_path, quota, "say_world.py")
    assert codes == [0, 0], every
    assert "finished workers are not run again" not in every, every
    lines = [x.split("]: ")[-1] for n in nodes[:2] for x in n.stdout.splitlines()]  # [rankN]:
    said = sorted(x for x in lines if x.startswith("world="))
    assert said == ["world=2 restart=1 rank=0", "world=2 restart=1 rank=1"], every
    for node in nodes[:2]:
        (run_dir,) = node.logs.iterdir()
        found = read_events(run_dir / "events.jsonl")
        started = [e["round"] for e in found if e["kind"] == "workers_started"]
        assert started == [1], (started, every)  # none in round 0: it ended before
        line = next((x for x in node.stderr.splitlines() if "before its workers" in x), "")
        assert "round 0 ended before its workers started: node " in line, every
        assert " was lost: " in line, every  # (node ranks follow the order of arrival)
        assert spaces.addr(2) in line, line
        kinds = [(e["kind"], e.get("round")) for e in found]
        assert kinds.index(("failure", 0)) < kinds.index(("restart", 0)), kinds
        assert ("node_lost", 0) in kinds, kinds
        report = json.loads((run_dir / "report.json").read_text())
        assert report["outcome"] == "succeeded", report


def signalled_in_its_check(
    netns: Callable[[int], NetNamespaces],
    nodes: list[Node],
    tmp_path: Path,
    quota: Callable[[float], cpuquota.CpuQuota],
    signum: signal.Signals,
) -> tuple[list[int], str]:
    """2 nodes at ``--nnodes 2:3`` (``say_world.py``, 1 worker each, ``--preempt-signals
    SIGUSR1``), node 1 under the quota so that its check takes seconds (lifted once it
    stopped); node 0's agent gets ``signum`` once round 0 formed, while it waits for node
    1's records. Node 0's check stops on it, node 1's on what node 0 tells the job; neither
    forks a worker (no ``workers_started``, no ``world=`` line; no ``node_check`` either).
    Their exit codes, and every node's output (for assertion messages)."""
    spaces = netns(2)
    slow = quota(0.02)
    net = NamespaceHosts(spaces)
    port = free_port()

    def start(i: int) -> Node:
        args = [*rdzv(spaces, i, port, "signalcheck", "2:3", 8), "--nproc-per-node", "1",
                "--preempt-signals", "SIGUSR1", "--preempt-grace", "120", "--cold-start",
                worker("say_world.py")]  # fmt: skip
        return Node(net, i, args, tmp_path, f"n{i}", env=TOKEN)

    nodes += [start(0), start(1)]
    throttle(nodes[1], slow, " of 2..3 present")
    # Out of the rendezvous (a signal there stops the job before any round): in its check.
    wait_for(lambda: "rdzv_done" in kinds(nodes[0]), HANG, "round 0 to form on node 0")
    os.kill(nodes[0].proc.pid, signum)
    # Once node 1's check stopped, the rest of its end need not run at 2 % of a core.
    said = lambda: "node check stopped: " in nodes[1].stderr  # noqa: E731
    wait_for(lambda: said() or nodes[1].proc.poll() is not None, HANG, "node 1's check to stop")
    slow.lift()
    codes = [n.finish(HANG) for n in nodes]
    every = f"codes {codes}\n" + "".join(f"--- node {i}:\n{n.stderr}" for i, n in enumerate(nodes))
    assert "world=" not in nodes[0].stdout + nodes[1].stdout, every
    for node in nodes:
        assert "workers_started" not in kinds(node), every
        assert "node_check" not in kinds(node), every  # the check stopped: no verdict
        assert "round 0: node check stopped: " in node.stderr, every
        assert "round 0 ended before its workers started: " in node.stderr, every
    return codes, every


@pytest.mark.slow
def test_a_preemption_during_the_node_check_starts_no_workers(
    netns: Callable[[int], NetNamespaces],
    nodes: list[Node],
    tmp_path: Path,
    quota: Callable[[float], cpuquota.CpuQuota],
) -> None:
    """``signalled_in_its_check`` with SIGUSR1, a preemption: node 0 tells the job (the
    round's notice), and both nodes end as a preemption does: exit 75, the ``preempt``
    event, the framed summary and ``report.json`` (SIGUSR1 on node 0)."""
    codes, every = signalled_in_its_check(netns, nodes, tmp_path, quota, signal.SIGUSR1)
    assert codes == [REQUEUE_EXIT_CODE] * 2, every
    reports = [json.loads(next(n.logs.glob("*/report.json")).read_text()) for n in nodes]
    assert reports[0]["preempted"]["node"] == reports[1]["preempted"]["node"], reports
    for node, report, where in zip(nodes, reports, ["this node", "node "], strict=True):
        assert "preempt" in kinds(node) and "restart" not in kinds(node), every
        (end,) = [e for e in events(node) if e["kind"] == "job_end"]
        assert (end["outcome"], end["exit_code"]) == ("preempted", REQUEUE_EXIT_CODE), end
        assert report["exit_code"] == REQUEUE_EXIT_CODE and report["exits"] == [], report
        assert report["preempted"]["signal"] == "SIGUSR1", report
        line = next((x for x in node.stderr.splitlines() if "before its workers" in x), "")
        assert "round 0 ended before its workers started: the job is preempted" in line, every
        assert f"job preempted (SIGUSR1 on {where}" in node.stderr, every
    assert "node check stopped: this node got SIGUSR1 (a preemption)" in nodes[0].stderr, every


@pytest.mark.slow
def test_a_stop_during_the_node_check_starts_no_workers(
    netns: Callable[[int], NetNamespaces],
    nodes: list[Node],
    tmp_path: Path,
    quota: Callable[[float], cpuquota.CpuQuota],
) -> None:
    """``signalled_in_its_check`` with SIGTERM, a stop (``phalanx stop``, a scheduler's):
    node 0's check ends on it at once, not once node 1's records come in, and both nodes
    end as stopped by node 0's SIGTERM (143), with the stop's report."""
    codes, every = signalled_in_its_check(netns, nodes, tmp_path, quota, signal.SIGTERM)
    assert codes == [128 + signal.SIGTERM] * 2, every
    reports = [json.loads(next(n.logs.glob("*/report.json")).read_text()) for n in nodes]
    assert reports[0]["stopped_on_node"] == reports[1]["stopped_on_node"], reports
    for node, report in zip(nodes, reports, strict=True):
        assert (report["outcome"], report["signal"]) == ("interrupted", "SIGTERM"), report
        (end,) = [e for e in events(node) if e["kind"] == "job_end"]
        assert end["outcome"] == "interrupted", end
    assert "node check stopped: this node got SIGTERM (a stop)" in nodes[0].stderr, every
    said = "round 0 ended before its workers started: this node was stopped by SIGTERM"
    assert said in nodes[0].stderr, every


def events(node: Node) -> list[dict[str, object]]:
    """``node``'s events so far (none before its run directory is made)."""
    found = list(node.logs.glob("*/events.jsonl"))
    return read_events(found[0]) if found else []


def kinds(node: Node) -> list[object]:
    return [e["kind"] for e in events(node)]
