"""The timeline of an agent SIGKILL on etcd, from the kill (seconds, wall clock):

``python benchmarks/died_timeline.py [--kills 5] [--out DIR]`` starts a real etcd and two
agents on loopback (``--nnodes 1:2``, Gloo all-reduces: ``tests/workers/steps_until_go.py``,
``heartbeat_interval=0.5`` as the soak, ``lease_ttl=30`` so only the last word can tell),
SIGKILLs node 1's agent once both ranks step, and prints for each kill: *died*, when the
guardian's ``died`` was in etcd (etcd read every 2 ms); *rank exit*, when the survivor's
rank exited (its peer's went: "Connection closed by peer"); *failure*, the survivor's
``failure`` event (the first fact of the soak's *detect*) and its kind. A fresh pair of
agents per kill, a few seconds each."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
from phalanx.rendezvous.dynamic.board import DIED  # noqa: E402
from phalanx.rendezvous.dynamic.keys import Keys  # noqa: E402
from phalanx.rendezvous.stores.etcd.conf import run_prefix  # noqa: E402
from support.etcd_server import EtcdCluster  # noqa: E402
from support.hosts import Loopback, Node  # noqa: E402
from support.launch import wait_for, worker  # noqa: E402

CONF = ("lease_ttl=30,request_timeout=3,heartbeat_interval=0.5,heartbeat_timeout=6,"
        "last_call_timeout=1,join_timeout=60,exit_barrier_timeout=30")  # fmt: skip


def events(node: Node) -> list[dict[str, object]]:
    return [json.loads(line) for path in node.logs.glob("*/events.jsonl")
            for line in path.read_text().splitlines()]  # fmt: skip


def one_kill(etcd: EtcdCluster, folder: Path, run_id: str, phase: float) -> dict[str, object]:
    folder.mkdir(parents=True)
    endpoint = etcd.endpoints[0].removeprefix("http://")
    nodes: list[Node] = []
    try:
        for i in range(2):
            args = ["--nnodes", "1:2", "--nproc-per-node", "1", "--max-restarts", "1",
                    "--rdzv-backend", "etcd", "--rdzv-endpoint", endpoint, "--rdzv-id", run_id,
                    "--rdzv-conf", CONF, worker("steps_until_go.py"), str(folder)]  # fmt: skip
            nodes.append(Node(Loopback(), i, args, folder, f"n{i}"))
            if i == 0:  # node 0 first, so that node 1 joins its round
                wait_for(lambda: "rendezvous" in nodes[0].stderr, 60, "node 0 to reach etcd")
        stepping = [folder / "stepping.0", folder / "stepping.1"]
        wait_for(lambda: all(p.exists() for p in stepping), 120, "both ranks to step")
        heartbeats = run_prefix(run_id) + "kv/" + Keys(run_id).heartbeat("")
        time.sleep(phase)  # each kill at another point of the watch's heartbeat interval
        killed = time.time()
        nodes[1].proc.kill()
        died = None
        while died is None and time.time() - killed < 10:
            if DIED in etcd.under(heartbeats).values():
                died = time.time() - killed
            time.sleep(0.002)

        def failed() -> bool:
            return any(e["kind"] == "failure" for e in events(nodes[0]))

        wait_for(failed, 60, "the survivor's failure event")
        seen = [e for e in events(nodes[0]) if float(str(e["t"])) > killed - 1]
        exit_ = next(e for e in seen if e["kind"] == "worker_exit")
        failure = next(e for e in seen if e["kind"] == "failure")
        return {"died": died, "rank_exit": float(str(exit_["t"])) - killed,
                "failure": float(str(failure["t"])) - killed, "kind": failure["failure_kind"]}  # fmt: skip
    finally:
        for node in nodes:
            node.kill()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--out", default="", help="the agents' files (default: a temp dir)")
    args = parser.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="phalanx-died-"))
    print(f"{'#':>2} {'died':>6} {'rank exit':>9} {'failure':>7}  kind")
    with EtcdCluster(size=1) as etcd:
        for n in range(args.kills):
            row = one_kill(etcd, out / f"kill{n}", f"died{n}", 0.3 + 0.137 * n)
            died = f"{row['died']:6.3f}" if row["died"] is not None else f"{'-':>6}"
            print(f"{n + 1:>2} {died} {row['rank_exit']:9.3f} {row['failure']:7.3f}  {row['kind']}",
                  flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
