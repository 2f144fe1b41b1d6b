"""What the c10d failover tests share (``tests/multinode/test_store_failover.py`` and
``test_member_cut_off.py``): three agents at ``--nnodes 2:3``, each in a network namespace
of its own, training a checkpointing trainer whose result does not depend on the world size
(``tests/workers/failover_train.py``); its weights after an uninterrupted run; the agents'
events."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from support.hosts import NamespaceHosts, Node
from support.launch import wait_for, worker
from support.multinode import FAST, c10d_args
from support.netns import NetNamespaces

HANG = 240.0
STEPS = 40
PORT = 29400  # each namespace has its own ports
HOST = socket.gethostname()  # (a network namespace keeps the machine's name)
# All three in round 0 (the last call waits for the third), restarts to spend on the loss.
CONF = FAST.replace("last_call_timeout=1", "last_call_timeout=5")

# A worker that needs no torch: it writes its node and world size per restart (whole or
# absent: written aside, then renamed), waits to be stopped in restart 0 (the job re-forms
# after the fault) and ends at once later. Its one argument is the shared folder.
NODE_SLEEPER = """import os, pathlib, sys, time
restart = os.environ["TORCHELASTIC_RESTART_COUNT"]
name, shared = f"r{restart}-rank{os.environ['RANK']}", pathlib.Path(sys.argv[1])
(shared / f".{name}").write_text(f"{os.environ['NODE']} {os.environ['WORLD_SIZE']}")
(shared / f".{name}").rename(shared / name)  # whole or absent: the test polls these files
if restart == "0":
    time.sleep(600)
"""


def reference_weights(factory: pytest.TempPathFactory) -> bytes:
    """The trainer's weights after an uninterrupted run (one process: the same steps).

    Computed once per test session, not once per module (each import of torch in it took 3-9
    s of a loaded run, in four modules): the session's pytest-xdist workers share one copy in
    the session's temporary root, made by whichever needs it first under a lock, the others
    reading it; keyed by the trainer's text and steps."""
    root = factory.getbasetemp()
    root = root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root
    trainer = Path(worker("failover_train.py"))
    key = hashlib.sha256(trainer.read_bytes() + f" {STEPS}".encode()).hexdigest()[:12]
    out = root / f"failover-reference-{key}"
    out.mkdir(exist_ok=True)
    with open(out / "lock", "w") as lock:
        deadline = time.monotonic() + HANG
        while True:  # (bounded: the holder's run is, by HANG)
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                assert time.monotonic() < deadline, "another worker's reference run never ended"
                time.sleep(0.1)
        done = out / "reference.bin"
        if not done.exists():
            subprocess.run(
                [sys.executable, str(trainer), str(out), str(STEPS), "reference"],
                check=True, timeout=HANG,
            )  # fmt: skip
        return done.read_bytes()


def start_three(
    spaces: NetNamespaces,
    nodes: list[Node],
    tmp_path: Path,
    nnodes: str = "2:3",
    listed: bool = False,
    delay: str = "",
) -> tuple[NamespaceHosts, Path]:
    """Three agents; ``listed``: the candidates named, ``--rdzv-endpoint`` n0,n1,n2."""
    hosts, shared = NamespaceHosts(spaces), tmp_path / "shared"
    shared.mkdir()
    for i in range(3):
        nodes.append(agent(hosts, i, tmp_path, nnodes, listed, delay=delay))
    return hosts, shared


def agent(
    hosts: NamespaceHosts,
    i: int,
    tmp_path: Path,
    nnodes: str,
    listed: bool,
    name: str = "",
    delay: str = "",
) -> Node:
    rdzv = c10d_args(hosts, PORT, nnodes, "failover", CONF)
    if listed:
        where = rdzv.index("--rdzv-endpoint") + 1
        rdzv[where] = ",".join(f"{hosts.addr(j)}:{PORT}" for j in range(3))
    # The trainer's step delay: time for a node to come back (listed: 0.5 s unless given), or for
    # the fault to come while the job still runs; unlisted and not given, its 0.2 s.
    delay = delay or ("0.5" if listed else "")
    env = {"FAILOVER_STEP_DELAY": delay} if delay else {}
    args = [*rdzv, "--max-restarts", "2",
            worker("failover_train.py"), str(tmp_path / "shared"), str(STEPS)]  # fmt: skip
    return Node(hosts, i, args, tmp_path, name, env=env)


def training(nodes: list[Node], shared: Path) -> Callable[[], bool]:
    """Training with all three nodes, a few steps in (rank 0's lines for restart 0)."""

    def check() -> bool:
        for node in nodes:
            assert node.proc.poll() is None, node.stderr[-3000:]
        steps = shared / "steps-0"
        return steps.exists() and sum("world=3" in s for s in steps.read_text().split("\n")) >= 6

    return check


def then_fast(shared: Path, done: Callable[[], bool], what: str) -> None:
    """Once ``done()`` -- what the trainer's slow steps (``FAILOVER_STEP_DELAY``) kept the
    job running for -- or the job finished, its steps left go without a pause (OUT_DIR/fast):
    only the wait changes, not what the test sees (each step still a real Gloo collective)."""
    wait_for(lambda: done() or (shared / "final.bin").exists(), HANG, what)
    (shared / "fast").touch()


def world_again(shared: Path, size: int) -> Callable[[], bool]:
    """A restart after the first (steps-1, steps-2, ...) trained at world size ``size``."""
    later = lambda: (p for p in shared.glob("steps-*") if p.name != "steps-0")  # noqa: E731
    return lambda: any(f"world={size}" in p.read_text() for p in later())


def events(node: Node, kind: str) -> list[dict[str, object]]:
    found = []
    for path in node.logs.rglob("events.jsonl"):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if record.get("kind") == kind:
                found.append(record)
    return found


def survivors_finished(
    nodes: list[Node], hosts: NamespaceHosts, shared: Path, reference: bytes, listed: bool = False
) -> None:
    """Nodes 1 and 2 finished the job after a failover to node 1, bit-identical to an
    uninterrupted run, and each said (stderr, events.jsonl) which host was lost and which
    serves the store now."""
    for node in nodes[1:3]:
        assert node.finish(HANG) == 0, node.stderr[-6000:]
    survivors = {f"{hosts.addr(i)}:{PORT}" for i in (1, 2)}
    endpoints = set()
    for node in nodes[1:3]:
        (line,) = [x for x in node.stderr.splitlines() if "serves the rendezvous store now" in x]
        assert f"the store's host, node 0 ({HOST}, {hosts.addr(0)}), is lost; node " in line, line
        (moved,) = events(node, "store_moved")
        assert moved["lost_node"] == 0 and hosts.addr(0) in str(moved["lost_host"]), moved
        assert moved["epoch"] == 1, moved
        if listed:  # the next listed candidate alive: namespace 1, whatever its node rank
            assert moved["endpoint"] == f"{hosts.addr(1)}:{PORT}", moved
            assert moved["successor_node"] in (1, 2), moved
        else:  # the next member alive in node-rank order
            assert moved["successor_node"] == 1 and "node 1 (" in line, (moved, line)
        assert f"now at {moved['endpoint']} (failover 1)" in line, line
        endpoints.add(moved["endpoint"])
        report = json.loads(next(node.logs.rglob("report.json")).read_text())
        said = [i["store_moved"] for i in report["recovery"]["incidents"] if i["store_moved"]]
        assert said == [f"{moved['lost_host']} -> {moved['successor']} at {moved['endpoint']}"]
    assert len(endpoints) == 1 and endpoints <= survivors, endpoints  # one successor, a survivor
    assert "resumed at step" in nodes[1].stdout + nodes[2].stdout
    assert (shared / "final.bin").read_bytes() == reference


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and every process under it (agent, guardian, template, workers)."""
    procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
