"""Every node runs the same code: real agents on two hosts (network namespaces, else
loopback), each in a checkout of its own, compare their fingerprints at the rendezvous and
stop before any worker starts when they differ (exit 2 on both, a table naming the node and
the field), or warn and run with --allow-mismatch."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import phalanx
from phalanx.consistency.fingerprint import file_hash
from phalanx.resources.ports import free_port
from support.etcd_server import EtcdCluster
from support.hosts import Loopback, NamespaceHosts, Node
from support.launch import WORKERS, port_pair, wait_for
from support.tools import needs_etcd

Hosts = Loopback | NamespaceHosts
FAST = "heartbeat_interval=0.5,heartbeat_timeout=4,join_timeout=60,exit_barrier_timeout=30"


def pythonpath(*first: Path) -> str:
    """The test's own phalanx first, then its path made absolute: each agent runs in another
    working directory."""
    own = Path(phalanx.__file__).resolve().parents[1]
    rest = [str(Path(p).resolve()) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return os.pathsep.join([*map(str, first), str(own), *rest])


def checkout(root: Path, name: str, script_tail: str = "", config: str = "{}\n") -> Path:
    """A copy of the training code: train.py (mark_ran.py, ``script_tail`` appended) and
    configs/tiny.json."""
    where = root / name
    (where / "configs").mkdir(parents=True)
    shutil.copy(WORKERS / "mark_ran.py", where / "train.py")
    with open(where / "train.py", "a") as script:
        script.write(script_tail)
    (where / "configs" / "tiny.json").write_text(config)
    return where


def start(
    net: Hosts,
    nodes: list[Node],
    tmp: Path,
    checkouts: list[Path],
    *extra: str,
    env: list[dict[str, str]] | None = None,
    tails: list[list[str]] | None = None,
) -> Path:
    """Both agents (static ranks: node i in checkouts[i], ``tails[i]`` after its script's
    arguments); returns the marker directory."""
    marks = tmp / "marks"
    marks.mkdir()
    port = free_port()
    for i, where in enumerate(checkouts):
        args = ["--rdzv-backend", "static", "--nnodes", "2", "--node-rank", str(i),
                "--nproc-per-node", "1", "--master-addr", net.addr(0), "--master-port",
                str(port), "--rdzv-conf", FAST, *extra,
                "train.py", str(marks), "--config", "configs/tiny.json",
                *(tails[i] if tails else [])]  # fmt: skip
        own_env = {"PYTHONPATH": pythonpath(), **(env[i] if env else {})}
        nodes.append(Node(net, i, args, tmp, f"n{i}", cwd=where, env=own_env))
    return marks


def ran(marks: Path) -> list[str]:
    """The worker markers (``mark_ran.py``) as ``rank<RANK> <cwd> <world size>``, sorted."""
    return sorted(f"{p.name.split('-')[0]} {p.read_text()}" for p in marks.iterdir())


def table_rows(stderr: str) -> dict[str, list[str]]:
    """The mismatch table's rows by node rank (the lines after the header)."""
    lines = stderr.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["node", "host"])
    rows = {}
    for line in lines[header + 1 :]:
        if not line.startswith("  ") or line.startswith("  ("):
            break
        cells = line.split()
        rows[cells[0]] = cells
    return rows


def assert_placed(stderr: str, net: Hosts) -> None:
    """Each row names its node's address (hosts that share a name still differ by it)."""
    rows = table_rows(stderr)
    assert [rows[r][2] for r in ("0", "1")] == [net.addr(0), net.addr(1)]


def test_a_script_that_differs_by_one_byte_stops_the_job_before_any_worker_starts(
    hosts: object, nodes: list[Node], tmp_path: Path
) -> None:
    net = hosts(2)  # type: ignore[operator]
    same, changed = checkout(tmp_path, "a"), checkout(tmp_path, "b", script_tail="#")
    marks = start(net, nodes, tmp_path, [same, changed])
    assert [n.finish() for n in nodes] == [2, 2], nodes[0].stderr + nodes[1].stderr
    assert ran(marks) == []  # no worker ran, on either node
    for node in nodes:
        assert "(they differ in: script):" in node.stderr, node.stderr
        rows = table_rows(node.stderr)
        assert rows["0"][3] == file_hash(same / "train.py")
        assert rows["1"][3] == "*" + file_hash(changed / "train.py")
        assert_placed(node.stderr, net)
        assert "Traceback" not in node.stderr
        assert "--allow-mismatch" in node.stderr


def test_a_config_file_named_on_the_command_line_that_differs_stops_the_job(
    hosts: object, nodes: list[Node], tmp_path: Path
) -> None:
    net = hosts(2)  # type: ignore[operator]
    a = checkout(tmp_path, "a", config='{"lr": 0.1}\n')
    b = checkout(tmp_path, "b", config='{"lr": 0.2}\n')
    marks = start(net, nodes, tmp_path, [a, b], "--cold-start")
    assert [n.finish() for n in nodes] == [2, 2], nodes[0].stderr + nodes[1].stderr
    assert ran(marks) == []
    for node in nodes:
        assert "(they differ in: file configs/tiny.json):" in node.stderr, node.stderr
        rows = table_rows(node.stderr)
        assert rows["1"][3] == "*" + file_hash(b / "configs" / "tiny.json")


def test_script_arguments_that_differ_run_as_under_torchrun_and_are_named(
    hosts: object, nodes: list[Node], tmp_path: Path
) -> None:
    """An output name per node (issue 42): both run; each says in one line which argument
    differs, and its event log has it. Node 0's output file from an earlier run, which only
    its own arguments name, is no difference."""
    net = hosts(2)  # type: ignore[operator]
    checkouts = [checkout(tmp_path, "a"), checkout(tmp_path, "b")]
    (checkouts[0] / "out_a.json").write_text("{}\n")  # left by the last run, on node 0 only
    tails = [["--out", "out_a.json"], ["--out", "out_b.json"]]
    marks = start(net, nodes, tmp_path, checkouts, tails=tails)
    assert [n.finish() for n in nodes] == [0, 0], nodes[0].stderr + nodes[1].stderr
    assert ran(marks) == [f"rank{i} {where} 2" for i, where in enumerate(checkouts)]
    for node in nodes:
        said = [line for line in node.stderr.splitlines() if "arguments differ" in line]
        assert said == [
            "phalanx: round 0: script arguments differ between the nodes; each runs with its "
            "own, as under torchrun: --out: out_a.json (node 0), out_b.json (node 1)"
        ], node.stderr
        assert "differ in" not in node.stderr  # no table: the code is the same
        (log,) = node.logs.rglob("events.jsonl")
        events = [json.loads(line) for line in log.read_text().splitlines()]
        (event,) = [e for e in events if e["kind"] == "script_args_differ"]
        assert event["round"] == 0 and event["line"] == said[0].removeprefix("phalanx: ")
        common = [str(marks), "--config", "configs/tiny.json"]
        assert [(n["node"], n["args"]) for n in event["nodes"]] == [
            (0, [*common, "--out", "out_a.json"]), (1, [*common, "--out", "out_b.json"])
        ]  # fmt: skip


def test_with_other_script_arguments_a_differing_script_is_still_refused(
    hosts: object, nodes: list[Node], tmp_path: Path
) -> None:
    net = hosts(2)  # type: ignore[operator]
    checkouts = [checkout(tmp_path, "a"), checkout(tmp_path, "b", script_tail="#")]
    tails = [["--tag", "nodeA"], ["--tag", "nodeB"]]
    marks = start(net, nodes, tmp_path, checkouts, tails=tails)
    assert [n.finish() for n in nodes] == [2, 2], nodes[0].stderr + nodes[1].stderr
    assert ran(marks) == []
    for node in nodes:
        assert "(they differ in: script):" in node.stderr, node.stderr  # not in args
        assert "Traceback" not in node.stderr


def test_allow_mismatch_warns_with_the_table_and_runs(
    hosts: object, nodes: list[Node], tmp_path: Path
) -> None:
    net = hosts(2)  # type: ignore[operator]
    checkouts = [checkout(tmp_path, "a"), checkout(tmp_path, "b", script_tail="#")]
    marks = start(net, nodes, tmp_path, checkouts, "--allow-mismatch")
    assert [n.finish() for n in nodes] == [0, 0], nodes[0].stderr + nodes[1].stderr
    assert ran(marks) == [f"rank{i} {where} 2" for i, where in enumerate(checkouts)]
    for node in nodes:
        assert "(they differ in: script):" in node.stderr
        assert "starting anyway (--allow-mismatch)" in node.stderr


def test_equal_checkouts_in_different_directories_run_as_before(
    hosts: object, nodes: list[Node], tmp_path: Path
) -> None:
    net = hosts(2)  # type: ignore[operator]
    checkouts = [checkout(tmp_path, "a"), checkout(tmp_path, "b")]
    marks = start(net, nodes, tmp_path, checkouts)
    assert [n.finish() for n in nodes] == [0, 0], nodes[0].stderr + nodes[1].stderr
    assert ran(marks) == [f"rank{i} {where} 2" for i, where in enumerate(checkouts)]
    for node in nodes:
        assert "differ in" not in node.stderr


def test_a_node_with_another_torch_version_is_named_in_the_table(
    hosts: object, nodes: list[Node], tmp_path: Path
) -> None:
    """Node 1's Python finds a torch 9.9.9 distribution's metadata before site-packages (the
    real torch package is still what it would import: the workers never start anyway)."""
    net = hosts(2)  # type: ignore[operator]
    fake = tmp_path / "fake-site"
    (fake / "torch-9.9.9.dist-info").mkdir(parents=True)
    (fake / "torch-9.9.9.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: torch\nVersion: 9.9.9\n"
    )
    same = [checkout(tmp_path, "a"), checkout(tmp_path, "b")]
    env = [{}, {"PYTHONPATH": pythonpath(fake)}]
    marks = start(net, nodes, tmp_path, same, "--cold-start", env=env)
    assert [n.finish() for n in nodes] == [2, 2], nodes[0].stderr + nodes[1].stderr
    assert ran(marks) == []
    real = subprocess.run(
        [sys.executable, "-c", "import importlib.metadata as m; print(m.version('torch'))"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout.strip()  # fmt: skip
    for node in nodes:
        assert "(they differ in: torch):" in node.stderr, node.stderr
        rows = table_rows(node.stderr)
        assert rows["0"][3] == real and rows["1"][3] == "*9.9.9"



@pytest.mark.parametrize("allow", [False, True], ids=["stops", "allow_mismatch"])
def test_phalanx_spawn_compares_the_programs_own_script(tmp_path: Path, allow: bool) -> None:
    """phalanx.spawn's workers run phalanx's entry point; what the nodes compare is the
    program's script (sys.argv[0]), through the same static rendezvous (two nodes on
    loopback, as the TRELLIS.2 test)."""
    marks = tmp_path / "marks"
    marks.mkdir()
    port = port_pair()
    procs = []
    for node, tail in ((0, ""), (1, "#")):
        where = tmp_path / f"node{node}"
        where.mkdir()
        shutil.copy(WORKERS / "spawn_marks.py", where / "train.py")
        with open(where / "train.py", "a") as script:
            script.write(tail)
        argv = [sys.executable, "train.py", str(marks), str(node), str(port)]
        procs.append(
            subprocess.Popen(
                [*argv, *(["allow"] if allow else [])],
                cwd=where,
                env={**os.environ, "PYTHONPATH": pythonpath()},
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
        )
    try:
        outputs = [proc.communicate(timeout=120) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
    errs = [err for _, err in outputs]
    assert [p.returncode for p in procs] == ([0, 0] if allow else [2, 2]), errs
    assert [m.split()[0] for m in ran(marks)] == (["rank0", "rank1"] if allow else [])
    for err in errs:
        assert "(they differ in: script):" in err, err
        rows = table_rows(err)
        assert rows["1"][3] == "*" + file_hash(tmp_path / "node1" / "train.py")


def test_a_node_that_comes_later_with_other_code_is_refused_and_the_job_runs_on(
    hosts: object, nodes: list[Node], tmp_path: Path
) -> None:
    """Elastic (c10d, 1:2): node 0 runs alone; node 1 comes from a checkout whose script
    differs. It is compared with the running round before it queues, so it alone leaves
    (exit 2, one line naming the field) and node 0's worker is never stopped to let it in."""
    net = hosts(2)  # type: ignore[operator]
    marks = tmp_path / "marks"
    marks.mkdir()
    port = free_port()
    checkouts = [checkout(tmp_path, "a"), checkout(tmp_path, "b", script_tail="#")]
    for i, where in enumerate(checkouts):
        args = ["--nnodes", "1:2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                "--rdzv-endpoint", f"{net.addr(0)}:{port}", "--rdzv-id", "late",
                "--rdzv-conf", FAST + ",last_call_timeout=1", "--cold-start",
                "train.py", str(marks)]  # fmt: skip
        env = {"PYTHONPATH": pythonpath()}
        nodes.append(Node(net, i, args, tmp_path, f"n{i}", cwd=where, env=env))
        if i == 0:
            wait_for(lambda: ran(marks) != [], 90, "node 0 to start alone after the last call")
    assert nodes[1].finish() == 2, nodes[1].stderr
    last = nodes[1].stderr.strip().splitlines()[-1]
    assert "rendezvous 'late': not joining the running job (round 0, 1 node(s)" in last, last
    assert "this node differs in script: here " in last, last
    assert nodes[0].proc.poll() is None, nodes[0].stderr  # the job runs on
    assert ran(marks) == [f"rank0 {checkouts[0]} 1"]  # its one worker, never restarted


@needs_etcd
def test_over_etcd_a_differing_script_stops_both_nodes(nodes: list[Node], tmp_path: Path) -> None:
    """The same check on the etcd backend (a real server on loopback), elastic ranks."""
    checkouts = [checkout(tmp_path, "a"), checkout(tmp_path, "b", script_tail="#")]
    marks = tmp_path / "marks"
    marks.mkdir()
    with EtcdCluster(size=1) as etcd:
        endpoint = etcd.endpoints[0].split("://", 1)[-1]
        for i, where in enumerate(checkouts):
            args = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "etcd",
                    "--rdzv-endpoint", endpoint, "--rdzv-id", "etcd-mismatch",
                    "--rdzv-conf", "lease_ttl=4,request_timeout=4,heartbeat_interval=0.5,"
                    "heartbeat_timeout=8,join_timeout=60", "--cold-start",
                    "train.py", str(marks)]  # fmt: skip
            env = {"PYTHONPATH": pythonpath()}
            nodes.append(Node(Loopback(), i, args, tmp_path, f"n{i}", cwd=where, env=env))
        assert [n.finish() for n in nodes] == [2, 2], nodes[0].stderr + nodes[1].stderr
    assert ran(marks) == []
    for node in nodes:
        assert "(they differ in: script):" in node.stderr, node.stderr
