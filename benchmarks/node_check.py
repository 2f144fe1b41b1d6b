"""What the node check costs: ``python benchmarks/node_check.py`` (root: network namespaces).

``phalanx check`` on 4 and on 8 hosts, each host a network namespace of this machine
(``tests/support/netns.py``: a veth per host on one bridge), repeated ``--reps`` times. For
each size it prints the median and the worst of the check's own time (what every round of a
multi-node job pays: the compute probe, the hello and result records through the store, one
link test per node; the largest over the nodes of a run), the median time of the whole
``phalanx check`` command (interpreter start, rendezvous, check, exit barrier), and how many
healthy runs named a node (false positives). The goal: the check in 10 s or less for 8.

Every "host" shares this machine's cores (2 here, shared with other work), where real hosts
each have their own: the compute probes of 8 nodes run on 2 cores at once, so the figures
here are an upper bound.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from phalanx.resources.ports import free_port
from support.netns import NetNamespaces

SECONDS = re.compile(r"^node check, round \d+, \d+ nodes \(this is node \d+\), ([\d.]+) s:", re.M)
TIMEOUT = 300


def one_run(spaces: NetNamespaces, count: int, run: int, tmp: Path) -> tuple[float, float, bool]:
    """(the check's time, the command's wall time, whether a node was named)."""
    port = free_port()
    env = dict(os.environ, PHALANX_RDZV_TOKEN="bench-node-check")
    procs = []
    began = time.monotonic()
    for i in range(count):
        conf = f"join_timeout=120,last_call_timeout=1,is_host={str(i == 0).lower()}"
        argv = [sys.executable, "-m", "phalanx", "check", "--local-addr", spaces.addr(i),
                "--log-dir", str(tmp / f"logs{i}"), "--nnodes", str(count), "--rdzv-backend",
                "c10d", "--rdzv-endpoint", f"{spaces.addr(0)}:{port}", "--rdzv-id",
                f"bench{count}-{run}", "--rdzv-conf", conf]  # fmt: skip
        procs.append(subprocess.Popen(spaces.command(i, argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))  # fmt: skip
    outputs = [p.communicate(timeout=TIMEOUT) for p in procs]
    wall = time.monotonic() - began
    seconds = [float(m.group(1)) for out, _ in outputs if (m := SECONDS.search(out))]
    if len(seconds) != count:
        raise RuntimeError("a node printed no table:\n" + "\n".join(o + e for o, e in outputs))
    named = any(p.returncode != 0 for p in procs)
    if named:
        print(outputs[0][0], file=sys.stderr)
    return max(seconds), wall, named


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--sizes", default="4,8")
    args = parser.parse_args()
    for count in (int(s) for s in args.sizes.split(",")):
        spaces = NetNamespaces(count)
        spaces.create()
        try:
            with tempfile.TemporaryDirectory() as tmp:
                runs = [one_run(spaces, count, run, Path(tmp)) for run in range(args.reps)]
        finally:
            spaces.destroy()
        checks, walls = [r[0] for r in runs], [r[1] for r in runs]
        print(
            f"{count} nodes, {args.reps} runs: the check {statistics.median(checks):.2f} s "
            f"median, {max(checks):.2f} s worst; the whole 'phalanx check' "
            f"{statistics.median(walls):.2f} s median; nodes named in healthy runs: "
            f"{sum(r[2] for r in runs)} of {args.reps} runs"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
