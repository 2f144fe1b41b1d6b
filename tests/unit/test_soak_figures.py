"""The soak's per-fault figures are the job's (``benchmarks/soak_report.job_per_fault``), from
every agent's events: a member pushed out of the next round by the spare (it waits as the
new spare until a later fault) does not make the re-form look as long as its wait. With
figures per agent run, one worker exception in the soak read as a 44 s re-form when the
job re-formed in 0.6 s."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import soak_report


def _ev(t: float, kind: str, **fields: Any) -> dict[str, Any]:
    return {"t": t, "kind": kind, **fields}


EVENTS = [
    _ev(99.0, "progress", round=3),
    _ev(100.2, "failure", round=3, failure_kind="exception", node=1),  # node A's worker
    _ev(100.25, "stopped", round=3, node=1, seconds=0.04),
    _ev(100.3, "failure", round=3, failure_kind="exception", node=0),  # node B hears of it
    _ev(100.35, "stopped", round=3, node=0, seconds=0.02),
    _ev(100.8, "rdzv_done", round=4, world_size=2, node=0),  # B and the spare form round 4
    _ev(100.9, "rdzv_done", round=4, world_size=2, node=1),
    _ev(103.0, "progress", round=4),
    _ev(140.0, "rdzv_done", round=5, world_size=2, node=1),  # A, pushed out, joins later
]


@pytest.mark.parametrize(
    ("marks", "back", "down"),
    [
        ([(101.5, "0.0"), (101.6, "2.1"), (150.0, "1.0")], 0.7, 1.6),  # every rank's first step
        (None, 2.1, 3.0),  # no marks: the round's first progress sample
    ],
)
def test_the_figures_are_the_jobs_not_the_pushed_out_members(
    marks: list[tuple[float, str]] | None, back: float, down: float
) -> None:
    faults: list[dict[str, Any]] = [{"kind": "worker_exception", "at": 100.0, "node": 1},
                                    {"kind": "log_disk_full", "at": 130.0, "skipped": "x"}]  # fmt: skip
    soak_report.job_per_fault(faults, EVENTS, marks)
    fig = faults[0]
    assert fig["round"] == 3 and fig["seen_as"] == "exception"
    assert fig["detect"] == pytest.approx(0.2)
    assert fig["stop"] == pytest.approx(0.15)
    assert fig["kill"] == pytest.approx(0.04)  # the slowest node's own stop, not in the sum
    assert fig["reform"] == pytest.approx(0.55)
    assert fig["back"] == pytest.approx(back)
    assert fig["downtime"] == pytest.approx(down)
    assert "reform" not in faults[1]


def test_a_frozen_nodes_late_stop_is_not_the_jobs() -> None:
    events = [
        _ev(104.5, "failure", round=2, failure_kind="node_lost", node=0),
        _ev(104.55, "stopped", round=2, node=0),
        _ev(104.8, "rdzv_done", round=3, world_size=2, node=0),
        _ev(104.9, "rdzv_done", round=3, world_size=2, node=1),
        _ev(110.1, "stopped", round=2, node=2),  # the frozen node, thawed
        _ev(107.0, "progress", round=3),
    ]
    faults: list[dict[str, Any]] = [{"kind": "node_freeze", "at": 100.0, "node": 2}]
    soak_report.job_per_fault(faults, sorted(events, key=lambda e: e["t"]))
    assert faults[0]["reform"] == pytest.approx(0.35)
    assert faults[0]["downtime"] == pytest.approx(7.0)


def test_the_steps_run_again_are_counted_per_restart(tmp_path: Path) -> None:
    """``rerun_steps``: the highest step a worker of round k-1 completed against the step
    round k resumed from, from every agent run's logs (a restarted agent's run dir too)."""
    steps = tmp_path / "steps"
    steps.mkdir()
    for name, value in {"0.0.0.11": 530, "0.1.1.12": 531, "1.0.0.13": 700, "2.1.1.14": 900}.items():
        (steps / name).write_text(f"{value:12d}")
    (steps / "1.1.1.15").write_text("")  # killed before its first step
    logs = [tmp_path / "n0-logs", tmp_path / "n1-logs"]
    said = {(0, 0): "starting at step 0", (0, 1): "resumed from step 520",
            (1, 2): "resumed from step 700"}  # fmt: skip
    for (node, attempt), words in said.items():
        rank0 = logs[node] / "run" / f"attempt_{attempt}" / "rank_0"
        rank0.mkdir(parents=True)
        (rank0 / "stdout.log").write_text(f"world size 2, gloo on cpu; {words}\n")
    found = soak_report.rerun_steps(logs, steps)
    assert found == {
        "per_restart": [
            {"restart": 1, "reached": 531, "resumed": 520, "rerun": 11},
            {"restart": 2, "reached": 700, "resumed": 700, "rerun": 0},
        ],
        "total": 11,
    }
