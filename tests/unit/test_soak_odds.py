"""``benchmarks/soak_odds.py``: the ETTR one run's per-kind costs give other seeds' draws.

A report built here the way the soak writes one (its seed's schedule, a downtime per fault,
the split of its lost time) must be predicted exactly for its own seed when every fault of a
kind cost the same, and a costlier kind must lower the share of seeds at the goal."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import soak
import soak_odds

COSTS = {"worker_hang": 10.0, "node_cut": 4.0, "node_freeze": 4.0, "link_flap": 4.0,
         "spare_freeze": 3.0, "worker_kill_in_collective": 0.9, "agent_kill": 0.5,
         "worker_kill": 0.4, "worker_exception": 0.3}  # fmt: skip


def _report(seed: int, costs: dict[str, float], rest: float) -> dict[str, Any]:
    kinds = tuple(kind for kind in soak.KINDS if kind != "store_host_lost")
    plan = soak.schedule(seed, 10, 30, kinds)
    faults = [{"kind": kind, "downtime": costs.get(kind, 0.0)} for _, kind in plan]
    faults.append({"kind": "worker_kill", "downtime": 99.0, "skipped": "no worker"})
    down = sum(costs.get(kind, 0.0) for _, kind in plan)
    steps, step = 12000, 0.06
    wall = steps * step + down + rest
    return {"seed": seed, "backend": "etcd", "minutes": 10, "every": 30, "steps": steps,
            "step_s": step, "faults": faults, "ettr_job": steps * step / wall,
            "lost_split": {"rest": rest}}  # fmt: skip


def test_the_runs_own_seed_is_predicted_as_measured() -> None:
    report = _report(314244, COSTS, rest=2.0)
    cost, useful, rest = soak_odds.run_costs(report)
    assert cost["worker_kill"] == 0.4  # the skipped one (99 s) is not a cost
    assert (useful, rest) == (pytest.approx(720.0), 2.0)
    own = soak_odds.draw_ettr(314244, report, cost, useful, rest)
    assert own == pytest.approx(report["ettr_job"])


def test_a_costlier_kind_lowers_the_share_at_the_goal() -> None:
    def share(hang: float) -> float:
        report = _report(1, {**COSTS, "worker_hang": hang}, rest=2.0)
        cost, useful, rest = soak_odds.run_costs(report)
        values = [soak_odds.draw_ettr(s, report, cost, useful, rest) for s in range(300)]
        return sum(v >= 0.93 for v in values) / len(values)

    assert share(8.0) > share(10.0) > share(12.0)


def test_a_kind_the_run_never_drew_is_refused() -> None:
    report = _report(1, COSTS, rest=0.0)
    report["faults"] = [f for f in report["faults"] if f["kind"] != "etcd_member"]
    cost, useful, rest = soak_odds.run_costs(report)
    with pytest.raises(SystemExit, match="etcd_member"):
        soak_odds.draw_ettr(1, report, cost, useful, rest)


def test_the_ceiling_is_the_waits_alone_and_no_higher_reaction_keeps_the_share() -> None:
    """The ceiling costs each kind what it waits out (a hang 10 s, a node fault its lease);
    ``reaction_for`` finds the largest reaction per restart that keeps the share the run's
    own costs give (each restarting kind at its wait plus the same reaction): at least that
    reaction, less than where the next seed falls below the goal, and less for a larger
    share."""
    waits = soak.waits(False, "etcd")
    bare = soak_odds.ceiling({"backend": "etcd"})
    assert bare["worker_hang"] == waits["worker_hang"] == 10.0
    assert bare["node_freeze"] == 4.0 and bare["worker_kill"] == 0.0
    reaction = 0.3
    costs = {kind: bare.get(kind, 0.0) + reaction for kind in COSTS}
    report = _report(1, costs, rest=1.0)
    cost, useful, rest = soak_odds.run_costs(report)
    values = [soak_odds.draw_ettr(s, report, cost, useful, rest) for s in range(300)]
    share = sum(v >= 0.93 for v in values) / len(values)
    assert 0.0 < share < 1.0  # the test's costs sit where the goal depends on the draw
    found = soak_odds.reaction_for(share, 0.93, report, cost, useful, rest, seeds=300)
    assert reaction - 0.001 <= found < reaction + 0.1
    assert soak_odds.reaction_for(0.95, 0.93, report, cost, useful, rest, seeds=300) < found
