"""A run's etcd keys stay bounded by the job's size and a few rounds, however many faults.

Three real agents on a real etcd (``--nnodes 2:3``), their agents SIGKILLed (and started
again, as a node's supervisor would) and their workers SIGKILLed in turn; after each fault,
once the job is back at a world of 3, the run's keys are read back over etcd's API. Two
kinds of keys used to grow with the faults (issue 41: 22 keys at the start of a 30-minute
soak, 166 after 60 faults): each SIGKILLed agent's receipt key (``receipts/<id>``: a plain
key that only the agent's own ``close`` deleted; now its guardian's last word does), and the
straggler watch's rates (``check/rates/<rank>``, posted in every round and left out of the
sweep)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from phalanx.rendezvous.stores.etcd.conf import run_prefix
from support.etcd_server import EtcdCluster
from support.hosts import Loopback, Node
from support.launch import alive, wait_for, worker
from support.tools import needs_etcd

pytestmark = pytest.mark.slow

RUN_ID = "keys-bounded"
CONF = (
    "lease_ttl=4,request_timeout=4,heartbeat_interval=0.5,heartbeat_timeout=6,"
    "last_call_timeout=1,join_timeout=120,exit_barrier_timeout=30"
)
AGENTS = 3
FAULTS = 10  # half agent SIGKILLs, half worker SIGKILLs: the old code's count rose ~3 a fault
HANG = 120.0


@pytest.fixture
def etcd() -> Iterator[EtcdCluster]:
    with EtcdCluster(size=1) as cluster:
        yield cluster


def _keys(etcd: EtcdCluster) -> list[str]:
    """Every key of the run now (its prefix read back over etcd's API)."""
    return list(etcd.under(run_prefix(RUN_ID)))


def _kinds(keys: list[str]) -> Counter[str]:
    """The keys by pattern: round numbers, ranks, ids and indices replaced."""
    found: Counter[str] = Counter()
    for key in keys:
        key = key.removeprefix(run_prefix(RUN_ID)).removeprefix(f"kv/phalanx/rdzv/{RUN_ID}/")
        key = re.sub(r"^r\d+/", "r<n>/", key)
        key = re.sub(r"^(receipts|hb)/.*", r"\1/<id>", key)
        found[re.sub(r"/\d+", "/<i>", key)] += 1
    return found


def _world_of_3(shared: Path, after: int) -> int | None:
    """The restart count of a round of 3 past ``after`` whose ranks all stepped (rank 2 has
    files only in a round of 3), or None."""
    counts = {
        int(m.group(1)) for p in shared.glob("r2-*.steps") if (m := re.match(r"r2-(\d+)", p.name))
    }
    for count in sorted(c for c in counts if c > after):
        if all((shared / f"r{rank}-{count}.steps").exists() for rank in range(AGENTS)):
            return count
    return None


def _worker_pids(node: Node) -> list[int]:
    """The pids of the node's workers of its latest round (its run's events)."""
    pids: list[int] = []
    for events in node.logs.glob("*/events.jsonl"):
        for line in events.read_text().splitlines():
            event = json.loads(line)
            if event.get("kind") == "workers_started":
                pids = list(event["pids"])
    return pids


@needs_etcd
def test_agent_and_worker_kills_leave_no_keys_behind(
    etcd: EtcdCluster, nodes: list[Node], tmp_path: Path
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    endpoint = etcd.endpoints[0].removeprefix("http://")
    args = [
        "--nnodes", f"2:{AGENTS}", "--nproc-per-node", "1", "--max-restarts", "100",
        "--rdzv-backend", "etcd", "--rdzv-endpoint", endpoint, "--rdzv-id", RUN_ID,
        "--rdzv-conf", CONF, worker("lossy_steps.py"), str(shared),
    ]  # fmt: skip
    started = [0] * AGENTS  # how many times each node's agent was started

    def start(i: int) -> Node:
        started[i] += 1
        node = Node(Loopback(), i, args, tmp_path, f"n{i}-{started[i]}")
        nodes.append(node)
        return node

    agents = [start(i) for i in range(AGENTS)]
    count = -1

    def back() -> bool:
        nonlocal count
        found = _world_of_3(shared, count)
        if found is None:
            return False
        count = found
        return True

    wait_for(back, HANG, "the job to run at a world of 3")
    seen = [len(_keys(etcd))]
    for fault in range(FAULTS):
        i = fault % AGENTS
        if fault % 2 == 0:
            agents[i].proc.kill()  # the agent only: its guardian ends its workers
            agents[i].proc.wait(10)
            agents[i] = start(i)
        else:
            node = agents[i]
            # (its event log is written by a thread of its own: the round's pids may lag)
            wait_for(lambda n=node: any(alive(p) for p in _worker_pids(n)), HANG, "its workers")
            for pid in _worker_pids(node):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        wait_for(back, HANG, f"the job back at a world of 3 after fault {fault}")
        seen.append(len(_keys(etcd)))
    kinds = _kinds(_keys(etcd))
    print(f"keys after each fault: {seen}; now: {dict(sorted(kinds.items()))}")
    # Three rounds' keys at most (the count at the start is one round of 3 and the job's
    # keys): not one more per fault.
    assert max(seen) <= 3 * seen[0], seen
    # One receipt per live agent (a dead one's goes with its last word) and the straggler
    # watch's rates of the rounds not yet swept (at most three rounds of three nodes).
    assert kinds["receipts/<id>"] <= AGENTS, kinds
    assert kinds["r<n>/check/rates/<i>"] <= 3 * AGENTS, kinds
    (shared / "stop").write_text("")
    for node in agents:
        assert node.finish(HANG) == 0, node.stderr
    assert _kinds(_keys(etcd)) == {"stopped": 1}  # the run's tombstone only
