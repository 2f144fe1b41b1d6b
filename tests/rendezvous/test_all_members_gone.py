"""A round whose every member is gone closes: the agents started again resume the job.

Seen in the etcd soak under load: every member of the running round fenced and left, and
the agents started again waited for ever as spares ("round 1 is running without this node"):
only a member opens a restart round, and none was left. Now a waiting node that finds every
member of the running round lost (by the rule their watchers use for ``node_lost``) opens
the restart round itself (``rendezvous.dynamic.abandoned``).

Real agents on loopback, a real etcd, one worker per node that does not import torch (it
keeps its step in a checkpoint file): every member made to go, by SIGKILL of each agent's
whole session, or (the soak's way) by SIGSTOP of each agent and its guardian past
``fence_after``, so that each fences itself when it wakes and exits 1. Then two fresh
agents with the same ``--rdzv-id`` form the restart round between them, resume from the
checkpoint with the restart counted once, and say so in the event log.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.etcd_server import EtcdCluster
from support.hosts import Loopback, Node
from support.launch import alive, wait_for, worker
from support.tools import needs_etcd

pytestmark = [pytest.mark.slow, needs_etcd]

HANG = 120.0
# lease_ttl 3 s: fence_after 1 s; a member SIGSTOPped for 5 s has fenced when it wakes.
CONF = "heartbeat_interval=0.5,lease_ttl=3,last_call_timeout=1,join_timeout=60"


@pytest.fixture(scope="module")
def etcd() -> Iterator[EtcdCluster]:
    with EtcdCluster(size=1) as cluster:
        yield cluster


def _events(node: Node) -> list[dict[str, object]]:
    (run_dir,) = node.logs.iterdir()
    lines = (run_dir / "events.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


@pytest.mark.parametrize("how", ["sigkill", "fenced"])
def test_agents_started_again_after_every_member_went_resume_the_job(
    etcd: EtcdCluster, nodes: list[Node], tmp_path: Path, how: str
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    endpoint = etcd.endpoints[0].removeprefix("http://")
    args = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "etcd",
            "--rdzv-endpoint", endpoint, "--rdzv-id", f"gone-{how}-{os.getpid()}",
            "--rdzv-conf", CONF, "--max-restarts", "2", "--cold-start",
            worker("resume_after_all_lost.py"), str(shared)]  # fmt: skip
    first = [Node(Loopback(), i, args, tmp_path, f"first{i}") for i in range(2)]
    nodes.extend(first)
    wait_for(lambda: all((shared / f"up.{r}").exists() for r in (0, 1)), HANG, "round 0")
    pids = [int((shared / f"pid.{r}").read_text()) for r in (0, 1)]
    if how == "sigkill":
        for node in first:
            node.kill()  # the agent's whole session: its guardian too (no last word)
    else:  # the soak's way: a whole node starved past fence_after (its workers run on)
        for node in first:
            os.killpg(node.proc.pid, signal.SIGSTOP)
        time.sleep(5)  # > lease_ttl: both leases lapse, and with them the members' keys
        for node in first:
            os.killpg(node.proc.pid, signal.SIGCONT)
        codes = [node.finish(HANG) for node in first]
        assert codes == [1, 1], [node.stderr for node in first]
        assert all("fenced" in node.stderr for node in first), [n.stderr for n in first]
    wait_for(lambda: not any(alive(pid) for pid in pids), 30, "the first workers to be gone")

    again = [Node(Loopback(), i, args, tmp_path, f"again{i}") for i in range(2)]
    nodes.extend(again)

    def ended() -> bool:
        return all(node.proc.poll() is not None for node in again)

    try:
        wait_for(ended, HANG, "the agents started again to end")
    except AssertionError:
        raise AssertionError("\n".join(node.stderr[-2000:] for node in again)) from None
    assert [node.proc.returncode for node in again] == [0, 0], [n.stderr for n in again]
    said = sorted(node.stdout.strip() for node in again)
    assert said == [f"[rank{r}]: resumed rank={r} step=5 restart=1 world=2" for r in (0, 1)], said
    for node in again:
        (gone,) = [e for e in _events(node) if e["kind"] == "round_abandoned"]
        assert (gone["round"], gone["restart_count"]) == (0, 1), gone
        assert "every member of round 0 is gone" in str(gone["reason"]), gone
    # The node that opened the round says so in its log (both may, racing: one claim won).
    assert any("every member of round 0 is gone" in n.stderr for n in again), again[0].stderr
