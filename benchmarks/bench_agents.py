"""M node agents on this machine, phalanx against torchrun: ``python benchmarks/bench_agents.py``.

For M = 2, 4, 8 agents (one worker each, c10d rendezvous on a loopback endpoint, ``--nnodes M``),
the time from starting the M agents to every worker past a Gloo barrier. Both launchers run the
same worker (``bench_worker.py launch``) in the same run, alternating which goes first, over
``--reps`` repetitions; it prints medians and the ratio phalanx / torchrun (lower is better).
The rendezvous algorithm's cost per agent at 1,024 agents is ``benchmarks/rdzv_sim.py``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import scenarios  # next to this file

from phalanx.resources.ports import free_port

PY = sys.executable


def agent_argv(launcher: str, m: int, port: int, run_id: str, logs: Path) -> list[str]:
    common = ["--nnodes", str(m), "--nproc-per-node", "1", "--rdzv-backend", "c10d",
              "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", run_id, "--local-addr", "127.0.0.1"]  # fmt: skip
    if launcher == "phalanx":
        return [PY, "-m", "phalanx", *common, "--log-dir", str(logs)]
    return [PY, "-m", "torch.distributed.run", *common]


def run_agents(launcher: str, m: int) -> float:
    """Seconds from starting M agents to every worker past its first barrier."""
    scratch = Path(tempfile.mkdtemp(prefix=f"bench-agents-{launcher}-"))
    out = scratch / "stamps"
    out.mkdir()
    port, run_id = free_port(), f"bench-{uuid.uuid4().hex[:8]}"
    env = dict(os.environ)
    started = time.time()
    procs = [
        scenarios._start(
            [
                *agent_argv(launcher, m, port, run_id, scratch / "logs"),
                scenarios.WORKER,
                "launch",
                str(out),
            ],
            scratch / f"agent{i}.log",
            env,
        )
        for i in range(m)
    ]
    codes = [scenarios._finish(proc)[0] for proc in procs]
    if any(codes):
        raise scenarios.BenchError(f"{launcher} M={m}: exit codes {codes}; see {scratch}")
    stamps = scenarios._stamps(out, "barrier", 0)
    if len(stamps) != m:
        raise scenarios.BenchError(
            f"{launcher} M={m}: {len(stamps)} of {m} workers passed; see {scratch}"
        )
    shutil.rmtree(scratch, ignore_errors=True)
    return max(when for when, _ in stamps.values()) - started


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--agents", default="2,4,8", help="M values")
    args = parser.parse_args(argv)
    sizes = [int(m) for m in args.agents.split(",")]
    launchers = ["phalanx", "torchrun"]
    samples: dict[int, dict[str, list[float]]] = {
        m: {name: [] for name in launchers} for m in sizes
    }
    load_before = os.getloadavg()[0]
    began = time.monotonic()
    for rep in range(args.reps):
        order = launchers if rep % 2 == 0 else launchers[::-1]
        for m in sizes:
            for name in order:
                try:
                    samples[m][name].append(run_agents(name, m))
                except scenarios.BenchError as exc:
                    print(f"failed: {exc}", file=sys.stderr)
    print("| agents (1 worker each) | phalanx | torchrun | phalanx / torchrun |")
    print("|---|---|---|---|")
    for m in sizes:
        ours, theirs = samples[m]["phalanx"], samples[m]["torchrun"]
        if not ours or not theirs:
            print(f"| M={m} | n/a | n/a | n/a |")
            continue
        a, b = statistics.median(ours), statistics.median(theirs)
        print(f"| M={m} start -> all past a barrier | {a:.2f} s | {b:.2f} s | {a / b:.2f} |")
    print(
        f"\n{args.reps} repetitions, medians; {os.cpu_count()} CPUs; load average before "
        f"{load_before:.2f}, after {os.getloadavg()[0]:.2f}; {time.monotonic() - began:.0f} s in all."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
