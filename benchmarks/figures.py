"""How close the recovery figures come to what the workers did: ``python benchmarks/figures.py``.

A 2-rank job (``tests/workers/stamped_steps.py``) steps every 0.3 s, fails at step
``--fail-at`` and is restarted; the new round steps to ``--steps`` and finishes. Every step is
stamped by the worker on the host's monotonic clock, the clock of the events' ``mono``. From
the stamps: the true startup (the agent's start to the first step), downtime (the last step
before the failure to the failed step again) and productive time (wall minus both); from the
agent's ``report.json``: its figures. Run ``--reps`` times on one node (``--standalone``: the
agent reads the counters 0.1 s after the attempt's start, then less often, down to about
once a second) and as two c10d nodes on loopback, a rank each (each agent reads them every
``--monitor-interval``, 0.1 s); each node's figures are compared with its own ranks' stamps
(the ranks step on their own, without a collective; a node whose rank did not fail is down
from its rank's last step until it steps past the failed step again).

Prints each run's errors (figure minus truth, seconds) and their medians and maxima: the
figures are good to one reading of the counters, never in the job's favour (startup and
downtime not below the truth, productive time not above it). The suite checks the same job's
invariant (each figure between the truth and the truth plus the readings' gaps):
``tests/agent/test_recovery_words.py::test_a_short_run_counts_its_steps_to_the_agents_reading``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from phalanx.events import read_events
from phalanx.resources.ports import free_port

WORKER = Path(__file__).resolve().parent.parent / "tests" / "workers" / "stamped_steps.py"
MODES = ("standalone", "two-nodes")


def _stamps(folder: Path, rank: int, restart: int) -> dict[int, float]:
    lines = (folder / f"r{rank}-{restart}.stamps").read_text().split()
    return {int(step): float(at) for step, at in zip(lines[::2], lines[1::2], strict=True)}


def _jobs(mode: str, folder: Path, steps: int, fail_at: int) -> list[Path]:
    """Run the job (``standalone``: one agent, 2 ranks; ``two-nodes``: two c10d agents on
    loopback, a rank each, node 0 hosting the store); its agents' log directories."""
    job = [str(WORKER), str(folder), str(steps), str(fail_at)]
    if mode == "standalone":
        logs = [folder / "logs"]
        argvs = [["--standalone", "--nproc-per-node", "2", "--log-dir", str(logs[0])]]
    else:
        port, logs = free_port(), [folder / "logs0", folder / "logs1"]
        argvs = [
            ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
             "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "figures", "--rdzv-conf",
             f"is_host={str(i == 0).lower()}", "--log-dir", str(logs[i])]
            for i in (0, 1)
        ]  # fmt: skip
    command = [sys.executable, "-m", "phalanx", "--max-restarts", "1"]
    procs = [
        subprocess.Popen([*command, *argv, *job], stderr=subprocess.PIPE, text=True)
        for argv in argvs
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        if proc.returncode != 0:
            raise SystemExit(f"the job failed ({proc.returncode}):\n{err[-3000:]}")
    return logs


def one_run(mode: str, steps: int, fail_at: int) -> list[dict[str, float]]:
    """Each node's figures' errors in one job (figure minus what the stamps say)."""
    found = []
    with tempfile.TemporaryDirectory(prefix="phalanx-figures-") as scratch:
        folder = Path(scratch)
        all_logs = _jobs(mode, folder, steps, fail_at)
        per_node = [(0, 1)] if len(all_logs) == 1 else [(0,), (1,)]
        for logs, ranks in zip(all_logs, per_node, strict=True):
            (run_dir,) = logs.iterdir()
            events = read_events(run_dir / "events.jsonl")
            node = json.loads((run_dir / "report.json").read_text())["recovery"]["nodes"][0]
            began, wall = events[0]["mono"], node["wall"]
            # A node's figures are of its own ranks (they step on their own: no collective).
            startup = min(_stamps(folder, r, 0)[0] for r in ranks) - began
            down = min(_stamps(folder, r, 1)[fail_at] for r in ranks) - max(
                _stamps(folder, r, 0)[fail_at] for r in ranks
            )
            productive = wall - startup - down
            found.append(
                {
                    "startup": node["startup"] - startup,
                    "downtime": node["downtime"] - down,
                    "productive": node["productive"] - productive,
                    "ettr": node["ettr"] - productive / wall,
                }
            )
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--fail-at", type=int, default=5)
    args = parser.parse_args()
    for mode in MODES:
        runs = [node for _ in range(args.reps) for node in one_run(mode, args.steps, args.fail_at)]
        for i, run in enumerate(runs):
            print(f"{mode:<10} node run {i}: " + "  ".join(f"{k} {v:+.3f}" for k, v in run.items()))
        for key in runs[0]:
            values = [r[key] for r in runs]
            worst = max(values, key=abs)
            print(
                f"{mode:<10} {key:<10} median {statistics.median(values):+.3f}  worst {worst:+.3f}"
            )


if __name__ == "__main__":
    main()
