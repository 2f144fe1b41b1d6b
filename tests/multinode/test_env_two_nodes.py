"""The worker environment of a 2-node c10d job (1 worker per node), compared with torchrun's on
the same job: every rank's variables, by tests/cli/test_env.py's rules; and the ranks of a job
whose nodes run different numbers of workers (2 + 1)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from phalanx.plan import WORKER_ENV_KEYS
from phalanx.resources.ports import free_port
from support.hosts import Loopback, NamespaceHosts, Node
from support.launch import worker

Hosts = Loopback | NamespaceHosts
RUN_ID = "envjob"
# Values that differ by design between two launches of the same job: compared by shape.
RUN_SPECIFIC = {"MASTER_PORT", "TORCHELASTIC_ERROR_FILE"}
# Node ranks follow the order of arrival, in both launchers: which host is the master (node
# rank 0's) may differ between the two runs. Checked against where rank 0 ran instead.
PLACEMENT = {"MASTER_ADDR"}


def job_args(net: Hosts, port: int, out: Path, conf: str = "join_timeout=60") -> list[str]:
    return [
        "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"{net.addr(0)}:{port}", "--rdzv-id", RUN_ID,
        "--rdzv-conf", conf, worker("dump_env.py"), str(out),
    ]  # fmt: skip


def run_torchrun(net: Hosts, tmp_path: Path, out: Path) -> None:
    """Both torchrun nodes, each on its host, to completion (their sessions killed after)."""
    port, procs = free_port(), []
    env = dict(os.environ, **net.env())
    try:
        for i in (0, 1):
            # torchrun's own module, not a `torchrun` shim on PATH (see tests/cli/test_env.py).
            # is_host: torchrun finds the store's host by matching the endpoint against the
            # machine's hostname, which in a namespace resolves to the outer host's address.
            conf = f"join_timeout=60,is_host={i == 0}"
            argv = [sys.executable, "-m", "torch.distributed.run", "--local-addr", net.addr(i),
                    *job_args(net, port, out, conf)]  # fmt: skip
            with open(tmp_path / f"torchrun{i}.err", "wb") as err:
                procs.append(
                    subprocess.Popen(
                        net.command(i, argv),
                        stdout=subprocess.DEVNULL,
                        stderr=err,
                        env=env,
                        start_new_session=True,
                    )
                )
        codes = [p.wait(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)
    errors = [(tmp_path / f"torchrun{i}.err").read_text()[-2000:] for i in (0, 1)]
    assert codes == [0, 0], errors


def environments(out: Path) -> dict[int, dict[str, str]]:
    found = {int(p.stem.removeprefix("env_")): json.loads(p.read_text()) for p in out.iterdir()}
    assert sorted(found) == [0, 1]
    return found


def test_two_node_c10d_environment_matches_torchrun(
    hosts: Any, nodes: list[Node], tmp_path: Path
) -> None:
    net: Hosts = hosts(2)
    theirs_out, ours_out = tmp_path / "torchrun", tmp_path / "phalanx"
    theirs_out.mkdir()
    ours_out.mkdir()
    run_torchrun(net, tmp_path, theirs_out)
    port = free_port()
    for i in (0, 1):
        nodes.append(Node(net, i, job_args(net, port, ours_out), tmp_path, f"n{i}"))
    assert [n.finish() for n in nodes] == [0, 0], nodes[0].stderr + nodes[1].stderr

    theirs, ours = environments(theirs_out), environments(ours_out)
    for rank in (0, 1):
        mine, ref = ours[rank], theirs[rank]
        assert set(mine) ^ set(ref) == {"PHALANX_CHECKPOINT_LOG"}, rank
        # One worker per node: neither launcher sets OMP_NUM_THREADS.
        assert set(WORKER_ENV_KEYS) - {"OMP_NUM_THREADS"} <= set(ref)
        for key in sorted(set(ref) - RUN_SPECIFIC - PLACEMENT):
            if key == "TORCHELASTIC_USE_AGENT_STORE":
                # The deliberate difference: rank 0 hosts the workers' store (plan.worker_env).
                assert (ref[key], mine[key]) == ("True", "False")
            else:
                assert ref[key] == mine[key], (rank, key, ref[key], mine[key])
        assert mine["MASTER_PORT"].isdigit() and ref["MASTER_PORT"].isdigit()
        assert Path(mine["TORCHELASTIC_ERROR_FILE"]).name == "error.json"
        assert Path(mine["TORCHELASTIC_ERROR_FILE"]).parent.name == f"rank_{rank}"
    # One job: both ranks were told the same master (the host where rank 0 ran: phalanx's
    # logs say which), and their own node rank.
    rank0_host = next(i for i, n in enumerate(nodes) if list(n.logs.glob("*/attempt_0/rank_0")))
    assert {ours[r]["MASTER_ADDR"] for r in (0, 1)} == {net.addr(rank0_host)}
    assert len({theirs[r]["MASTER_ADDR"] for r in (0, 1)}) == 1
    assert theirs[0]["MASTER_ADDR"] in {net.addr(0), net.addr(1)}
    for env in (ours, theirs):
        assert len({env[r]["MASTER_PORT"] for r in (0, 1)}) == 1
        assert [env[r]["GROUP_RANK"] for r in (0, 1)] == ["0", "1"]


def test_nodes_with_different_worker_counts_get_one_rank_each(
    hosts: Any, nodes: list[Node], tmp_path: Path
) -> None:
    """Node 0 runs 2 workers, node 1 runs 1 (``--nproc-per-node`` differs per node): the
    world is 3, and each node's ranks start where the nodes before it (by node rank, which
    follows arrival) end -- not at node rank x this node's own count, which would give two
    workers one rank or a rank past the world."""
    net: Hosts = hosts(2)
    out, port = tmp_path / "env", free_port()
    out.mkdir()
    for i, nproc in ((0, "2"), (1, "1")):
        args = job_args(net, port, out)
        args[args.index("--nproc-per-node") + 1] = nproc
        nodes.append(Node(net, i, args, tmp_path, f"n{i}"))
    assert [n.finish() for n in nodes] == [0, 0], nodes[0].stderr + nodes[1].stderr
    envs = {int(p.stem.removeprefix("env_")): json.loads(p.read_text()) for p in out.iterdir()}
    assert sorted(envs) == [0, 1, 2], sorted(envs)
    by_node: dict[str, list[dict[str, str]]] = {}
    for rank in sorted(envs):
        env = envs[rank]
        assert (env["RANK"], env["WORLD_SIZE"], env["GROUP_WORLD_SIZE"]) == (str(rank), "3", "2")
        by_node.setdefault(env["GROUP_RANK"], []).append(env)
    assert sorted(by_node) == ["0", "1"]
    offset = 0
    for group_rank in ("0", "1"):  # node rank order: each node's ranks follow the last's
        mine = by_node[group_rank]
        count = len(mine)
        assert [e["LOCAL_RANK"] for e in mine] == [str(r) for r in range(count)], mine
        assert [int(e["RANK"]) for e in mine] == list(range(offset, offset + count))
        assert {e["LOCAL_WORLD_SIZE"] for e in mine} == {str(count)}
        offset += count
    assert sorted(len(v) for v in by_node.values()) == [1, 2]
