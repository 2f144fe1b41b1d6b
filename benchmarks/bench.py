"""phalanx against torchrun, side by side in one run: ``python benchmarks/bench.py --reps 3``.

Measures, for each launcher (alternating which goes first, ``--reps`` repetitions, medians):

- launch: starting the launcher -> every rank past a Gloo barrier, for N = 1, 2, 4, 8 workers;
- launch to exit: the same jobs, starting the launcher -> the launcher exited (the workers
  leave right after the barrier: this adds their exit and the launcher's to the launch);
- teardown: a worker's SIGKILL -> launcher and all workers gone (``--max-restarts 0``);
- restart: a worker's SIGKILL -> every rank past its first collective after the restart
  (``--max-restarts 1``);
- idle: the launcher's own CPU time, RSS and PSS over ``--idle-seconds`` of idle workers.
- restart on two nodes (``--multinode-reps``, 20 by default; 0 leaves it out): two agents in
  network namespaces, a worker's SIGKILL -> every rank on both nodes past its first
  collective of the next round; p50 and max, and for phalanx where the time went
  (``multinode.py``); ``--launchers phalanx,torchrun,phalanx-nocheck`` adds phalanx with
  ``--node-check off``, to show what the check before each round costs.

Both launchers are started the same way (``python -m phalanx`` / ``python -m
torch.distributed.run``, ``--standalone``, default monitor interval 0.1 s) with the same
environment, and run the same worker (``bench_worker.py``). Prints a Markdown table with the
medians and the ratio phalanx / torchrun (lower is better for every row). Machines shared
with other work are noisy: compare the ratios, and read the load averages printed with them.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time
from collections.abc import Callable
from importlib.metadata import version

import scenarios

import multinode  # next to this file: python benchmarks/bench.py puts them on sys.path

PY = sys.executable
LAUNCHERS: dict[str, scenarios.Command] = {
    "phalanx": lambda n, r, logs: [PY, "-m", "phalanx", "--standalone", "--nproc-per-node",
                                   str(n), "--max-restarts", str(r), "--log-dir", logs],
    "phalanx-cold": lambda n, r, logs: [PY, "-m", "phalanx", "--cold-start", "--standalone",
                                        "--nproc-per-node", str(n), "--max-restarts", str(r),
                                        "--log-dir", logs],
    # the node check runs only on several nodes: this shows its cost in the two-node rows
    "phalanx-nocheck": lambda n, r, logs: [PY, "-m", "phalanx", "--node-check", "off",
                                           "--standalone", "--nproc-per-node", str(n),
                                           "--max-restarts", str(r), "--log-dir", logs],
    "torchrun": lambda n, r, logs: [PY, "-m", "torch.distributed.run", "--standalone",
                                    "--nproc-per-node", str(n), "--max-restarts", str(r)],
}  # fmt: skip
# torchrun's restarts with its default shared store failed 2 times in 5 on this machine (the
# restarted ranks read attempt 0's Gloo addresses: "Connection refused", or hung). With the
# store per attempt that torch offers for this, they work; the restart row uses it. Two nodes
# (multinode.py): with the shared store (the same one in both rounds) the restarted rank 1
# read the first round's Gloo address of rank 0, "Connection refused", and the job hung, 1 of
# 2 tries; torch's restart count, meant to keep rounds apart, is per node (pytorch#135712).
RESTART_ENV = {"torchrun": {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}}
# Row label prefix -> the speed-up (torchrun / phalanx) the issue asks for.
SPEEDUP_TARGETS = {
    "launch N=8": 4.0,
    "launch N=1": 1.6,
    "launch to exit N=8": 4.0,
    "restart": 5.0,
}
TEARDOWN_TARGET = 0.5  # seconds, on one node


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3, help="repetitions of every measurement")
    parser.add_argument("--sizes", default="1,2,4,8", help="N for the launch rows")
    parser.add_argument("--nproc", type=int, default=2, help="N for teardown, restart, idle")
    parser.add_argument("--idle-seconds", type=float, default=30.0)
    parser.add_argument("--multinode-reps", type=int, default=20, help="two-node restarts")
    parser.add_argument(
        "--launchers",
        default="phalanx,torchrun",
        help=f"comma-separated, from {', '.join(LAUNCHERS)}; the first is the one compared",
    )
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    names = args.launchers.split(",")
    unknown = [n for n in names if n not in LAUNCHERS]
    if unknown or len(names) < 2:
        sys.exit(f"--launchers: need two or more of {', '.join(LAUNCHERS)}, got {args.launchers}")
    sizes = [int(n) for n in args.sizes.split(",")]
    nproc = args.nproc
    # row label -> launcher -> samples
    samples: dict[str, dict[str, list[float]]] = {}
    units: dict[str, str] = {}
    failures: list[str] = []

    def record(label: str, unit: str, name: str, value: float) -> None:
        units[label] = unit
        samples.setdefault(label, {}).setdefault(name, []).append(value)

    def attempt(label: str, name: str, measure: Measure) -> None:
        try:
            for row, value in measure(name).items():
                record(row, "s", name, value)
        except scenarios.BenchError as exc:
            failures.append(f"{label}, {name}: {exc}")
            print(f"failed: {failures[-1]}", file=sys.stderr, flush=True)

    load_before = os.getloadavg()
    started = time.monotonic()
    for name in names:  # warm the page cache: the first torch import of a session is slower
        scenarios.launch(LAUNCHERS[name], 1)
    for rep in range(args.reps):
        order = names if rep % 2 == 0 else names[::-1]
        for label, measure in timed_rows(sizes, nproc):
            for name in order:
                attempt(label, name, measure)
        try:
            idle = scenarios.idle({n: LAUNCHERS[n] for n in order}, nproc, args.idle_seconds)
        except scenarios.BenchError as exc:
            failures.append(f"idle: {exc}")
            idle = {}
        for name, (cpu, rss, pss) in idle.items():
            record(f"idle CPU over {args.idle_seconds:g} s, N={nproc}", "s", name, cpu)
            record(f"idle RSS, N={nproc}", "MiB", name, rss)
            record(f"idle PSS, N={nproc}", "MiB", name, pss)
        print(f"repetition {rep + 1}/{args.reps} done ({time.monotonic() - started:.0f} s)",
              file=sys.stderr, flush=True)  # fmt: skip
    print(table(samples, units, names, args.reps))
    print()
    print(
        f"{args.reps} repetitions, medians; torch {version('torch')}, python "
        f"{sys.version.split()[0]}, {os.cpu_count()} CPUs; load average before "
        f"{load_before[0]:.2f}, after {os.getloadavg()[0]:.2f}; "
        f"{time.monotonic() - started:.0f} s in all."
    )
    print(targets(samples, names))
    if args.multinode_reps:
        print()
        print(multinode.report(names, args.multinode_reps, RESTART_ENV))
    for failure in failures:
        print(f"failed run (left out of the medians): {failure}")
    return 0


def targets(samples: dict[str, dict[str, list[float]]], names: list[str]) -> str:
    """One line per target of the issue: the figure and whether it was met."""
    first, second = names[0], names[1]
    lines = []
    for label, row in samples.items():
        if first not in row or second not in row:
            continue
        mine, theirs = statistics.median(row[first]), statistics.median(row[second])
        for prefix, target in SPEEDUP_TARGETS.items():
            if label.startswith(prefix):
                verdict = "met" if theirs / mine >= target else "NOT met"
                lines.append(f"target {label}: {first} >= {target:g}x faster than {second}: "
                             f"{theirs / mine:.1f}x, {verdict}")  # fmt: skip
        if label.startswith("teardown"):
            verdict = "met" if mine < TEARDOWN_TARGET else "NOT met"
            lines.append(
                f"target {label}: {first} under {TEARDOWN_TARGET} s: {mine:.2f} s, {verdict}"
            )
    return "\n".join(lines)


# launcher name -> {row label: seconds}: one run can fill several rows.
Measure = Callable[[str], dict[str, float]]


def _launch(name: str, nproc: int) -> dict[str, float]:
    barrier, exited = scenarios.launch(LAUNCHERS[name], nproc)
    return {f"launch N={nproc}": barrier, f"launch to exit N={nproc}": exited}


def _teardown(name: str, nproc: int) -> dict[str, float]:
    return {f"teardown N={nproc}": scenarios.teardown(LAUNCHERS[name], nproc)}


def _restart(name: str, nproc: int) -> dict[str, float]:
    seconds = scenarios.restart(LAUNCHERS[name], nproc, RESTART_ENV.get(name))
    return {f"restart N={nproc}": seconds}


def timed_rows(sizes: list[int], nproc: int) -> list[tuple[str, Measure]]:
    """(what it measures, launcher name -> {row: seconds}) for every timed run, in order."""
    rows: list[tuple[str, Measure]] = [
        (f"launch N={n}", functools.partial(_launch, nproc=n)) for n in sizes
    ]
    rows.append((f"teardown N={nproc}", functools.partial(_teardown, nproc=nproc)))
    rows.append((f"restart N={nproc}", functools.partial(_restart, nproc=nproc)))
    return rows


def _figure(value: float, unit: str) -> str:
    if unit == "MiB":
        return f"{value:.0f} MiB"
    return f"{value:.3f} {unit}" if value < 1 else f"{value:.2f} {unit}"


def table(
    samples: dict[str, dict[str, list[float]]], units: dict[str, str], names: list[str], reps: int
) -> str:
    first, second = names[0], names[1]
    header = ["", *names, f"{first} / {second}", f"speed-up ({second} / {first})"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for label, row in samples.items():
        if any(name not in row for name in names):
            continue  # every run of a launcher failed: listed below the table
        medians = {name: statistics.median(row[name]) for name in names}
        unit = units[label]
        cells = [label, *(_figure(medians[name], unit) for name in names)]
        if medians[first] > 0 and medians[second] > 0:
            ratio = medians[first] / medians[second]
            cells += [f"{ratio:.2f}", f"{1 / ratio:.1f}x"]
        else:
            cells += ["-", "-"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
