"""What one soak run's costs make of every other seed's draw:
``python benchmarks/soak_odds.py REPORT.json [--seeds 20000] [--goal 0.93] [--rest S]``.

A soak's ETTR depends on which faults its seed draws as much as on phalanx. ``soak.schedule``
deals every kind once, shuffled, then deals again: a 10-minute run at a fault every 30 s has
20 faults of 12 kinds, so 8 kinds come twice, and which 8 decides how much of the run is
waited out by the faults' nature (a hang fails its round at 10 s at the soak's pace, a node cut
off, frozen or flapping is found at its lease; a full disk or a killed guardian costs
nothing). Two hangs and six node faults in one run cost about 20 s more than one hang and four.

This takes one run's ``report.json``: its useful time (steps x the job's own step time), each
kind's median downtime, and its *rest* (lost time outside the faults' windows), and computes
the ETTR those costs give the schedule of every seed from 0 to ``--seeds``: the median, the 5th
and 95th percentiles, and the share of seeds at or above ``--goal``. The run's own seed is
predicted too, beside what it measured: a check of the model (which uses medians where the run
had several faults of a kind, and the run's own rest for every draw).

Last, the ceiling: the same draws with nothing lost but what each fault must wait out by its
nature at the run's settings (``soak.waits``: no reaction, no rest): the share of seeds that
any launcher could bring to the goal at these settings; and the reaction per restart (the
same for every fault the run restarted for, on top of its wait, with the run's own rest or
``--rest``'s) under which half, 90% and 95% of seeds would reach it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from soak import KINDS, schedule, waits


def run_costs(report: dict[str, Any]) -> tuple[dict[str, float], float, float]:
    """(each kind's median seconds down, the useful seconds, the rest) of one run."""
    downs: dict[str, list[float]] = {}
    for fault in report["faults"]:
        if "skipped" not in fault:
            downs.setdefault(fault["kind"], []).append(float(fault.get("downtime") or 0.0))
    useful = report["steps"] * report["step_s"]
    return (
        {kind: statistics.median(values) for kind, values in downs.items()},
        useful,
        report["lost_split"]["rest"],
    )


def draw_ettr(
    seed: int, report: dict[str, Any], cost: dict[str, float], useful: float, rest: float
) -> float:
    """The ETTR seed's schedule gets at these costs (the soak's own kinds, in its order)."""
    other = "store_host_lost" if report["backend"] == "etcd" else "etcd_member"
    kinds = tuple(kind for kind in KINDS if kind != other)
    plan = schedule(seed, report["minutes"], report["every"], kinds)
    missing = sorted({kind for _, kind in plan} - set(cost))
    if missing:
        raise SystemExit(f"the run has no fault of kind {missing}: pass a full run's report")
    lost = sum(cost[kind] for _, kind in plan) + rest
    return useful / (useful + lost)


def restarts(report: dict[str, Any]) -> int:
    """The run's restarts: its faults that cost it time (a kind that costs nothing, such as a
    killed guardian, restarts nothing)."""
    return sum(1 for f in report["faults"] if "skipped" not in f and f.get("downtime"))


def ceiling(report: dict[str, Any]) -> dict[str, float]:
    """Each kind's cost with no reaction: what it waits out by its nature (``soak.waits``
    at the run's settings; 0 for a kind that waits nothing)."""
    held = waits(bool(report.get("default_timeouts", False)), report["backend"])
    return {kind: held.get(kind, 0.0) for kind in KINDS}


def reaction_for(
    share: float,
    goal: float,
    report: dict[str, Any],
    cost: dict[str, float],
    useful: float,
    rest: float,
    seeds: int = 2000,
) -> float:
    """The largest reaction per restart (seconds, to the millisecond) at which ``share`` of
    the seeds 0..``seeds``-1 reach ``goal``: each kind the run restarted for (``cost`` > 0) at its
    wait plus that reaction, the others at 0, and the run's ``rest``."""
    bare = ceiling(report)
    restarted = {kind for kind, seconds in cost.items() if seconds > 0}

    def reached(reaction: float) -> float:
        costs = {k: bare[k] + (reaction if k in restarted else 0.0) for k in bare}
        return sum(draw_ettr(s, report, costs, useful, rest) >= goal for s in range(seeds)) / seeds

    low, high = 0.0, 2.0
    if reached(low) < share:
        return 0.0
    while high - low > 0.001:
        middle = (low + high) / 2
        low, high = (middle, high) if reached(middle) >= share else (low, middle)
    return low


def spread(values: list[float], goal: float) -> str:
    """The median, the 5th and 95th percentiles and the share at or above ``goal``."""
    values = sorted(values)
    share = sum(v >= goal for v in values) / len(values)
    return (
        f"median {statistics.median(values):.3f}, 5th percentile {values[len(values) // 20]:.3f}, "
        f"95th {values[-len(values) // 20]:.3f}; at or above {goal:g}: {share:.0%}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("report", type=Path, help="a soak run's report.json")
    parser.add_argument("--seeds", type=int, default=20000, help="seeds 0..N-1 to draw")
    parser.add_argument("--goal", type=float, default=None, help="etcd 0.93, c10d 0.90")
    parser.add_argument(
        "--rest", type=float, default=None,
        help="the reaction line's rest, seconds, in place of the run's (a quieter machine's)",
    )  # fmt: skip
    args = parser.parse_args()
    report = json.loads(args.report.read_text())
    goal = args.goal if args.goal is not None else (0.93 if report["backend"] == "etcd" else 0.90)
    cost, useful, rest = run_costs(report)
    values = [draw_ettr(s, report, cost, useful, rest) for s in range(args.seeds)]
    bare = ceiling(report)
    best = [draw_ettr(s, report, bare, useful, 0.0) for s in range(args.seeds)]
    own = draw_ettr(report["seed"], report, cost, useful, rest)
    print(
        f"{report['backend']} seed {report['seed']}: measured ETTR {report['ettr_job']:.3f}, "
        f"predicted {own:.3f} (each kind at its median: "
        + ", ".join(f"{k} {v:.2f}" for k, v in sorted(cost.items(), key=lambda kv: -kv[1]))
        + f"; rest {rest:.1f} s)"
    )
    print(f"over {args.seeds} seeds at these costs: {spread(values, goal)}")
    print(
        "the ceiling, no reaction and no rest (only what each fault waits out: "
        + ", ".join(f"{k} {v:g}" for k, v in sorted(bare.items(), key=lambda kv: -kv[1]) if v)
        + f" s): {spread(best, goal)}"
    )
    at = rest if args.rest is None else args.rest
    print(
        f"the reaction per restart that would bring seeds to the goal, at a rest of {at:.1f} s: "
        + ", ".join(
            f"{share:.0%} of them {reaction_for(share, goal, report, cost, useful, at):.3f} s"
            for share in (0.5, 0.9, 0.95)
        )
        + f" (this run: {report['lost_split']['reaction'] / restarts(report):.3f} s)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
