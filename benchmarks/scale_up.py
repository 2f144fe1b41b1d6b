"""What a node joining a running elastic job costs the job (issue 41's second lead).

``python benchmarks/scale_up.py [--reps 3]``: two agents on loopback, c10d, ``--nnodes 1:2``,
``--preload torch._inductor.config`` (as the soak). Node 0 runs alone; then node 1 starts,
and the job re-forms at a world of 2. Printed per rep, seconds from node 1's start: when it
joined (``rdzv_start``), when node 0 stopped its lone worker for the re-form (the job stands
still from then), and when both ranks were past one all-reduce of the new round; *still* is
the time the job stood still (stop to both ranks past the all-reduce).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
from phalanx.resources.ports import free_port  # noqa: E402
from support.hosts import Loopback, Node  # noqa: E402
from support.multinode import c10d_args  # noqa: E402

WORKER = """import os, sys, time
if os.environ["WORLD_SIZE"] == "1":
    open(os.path.join(sys.argv[1], "alone"), "w").close()
    time.sleep(120)
    sys.exit(9)
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
dist.all_reduce(torch.ones(1))
with open(os.path.join(sys.argv[1], "done." + os.environ["RANK"]), "w") as f:
    f.write(repr(time.time()))
dist.destroy_process_group()
"""


def events(logs: Path) -> list[dict[str, Any]]:
    (path,) = logs.glob("*/events.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines()]


def once(root: Path) -> dict[str, float]:
    (root / "w.py").write_text(WORKER)
    net, port = Loopback(), free_port()
    args = [*c10d_args(net, port, "1:2"), "--preload", "torch._inductor.config",
            str(root / "w.py"), str(root)]  # fmt: skip
    nodes = [Node(net, 0, args, root, "n0")]
    try:
        deadline = time.monotonic() + 120
        while not (root / "alone").exists():
            if time.monotonic() > deadline:
                raise RuntimeError("node 0 did not start alone")
            time.sleep(0.05)
        time.sleep(1.0)  # node 0 settled in its lone round
        arrived = time.time()
        nodes.append(Node(net, 1, args, root, "n1"))
        codes = [n.finish(180) for n in nodes]
        if codes != [0, 0]:
            raise RuntimeError(f"exit codes {codes}: {nodes[1].stderr[-2000:]}")
    finally:
        for node in nodes:
            node.kill()
    joined = min(float(e["t"]) for e in events(nodes[1].logs) if e["kind"] == "rdzv_start")
    stopped = min(
        float(e["t"]) for e in events(nodes[0].logs) if e["kind"] in ("stopped", "reform")
    )
    back = max(float(p.read_text()) for p in root.glob("done.*"))
    return {"joined": joined - arrived, "stopped": stopped - arrived, "back": back - arrived,
            "still": back - stopped}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    rows = []
    print(f"{'rep':>3} {'joined':>7} {'stopped':>7} {'back':>7} {'still':>7}")
    for rep in range(args.reps):
        with tempfile.TemporaryDirectory(prefix="phalanx-scale-up-") as tmp:
            row = once(Path(tmp))
        rows.append(row)
        print(
            f"{rep + 1:>3} "
            + " ".join(f"{row[k]:7.2f}" for k in ("joined", "stopped", "back", "still")),
            flush=True,
        )
    print(f"median still {statistics.median(r['still'] for r in rows):.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
