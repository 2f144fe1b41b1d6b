"""The soak's split of its lost time (``benchmarks/soak_report.lost_split`` with
``benchmarks/soak.waits``): what a fault waits out by its own nature is not counted as
phalanx's reaction. A worker SIGKILLed in a collective holds back ``COLLECTIVE_HOLD`` (0.5 s)
before it kills itself, the job stalled in the all-reduce meanwhile: in the 10-minute etcd
soak its *detect* was 0.57 and 0.59 s, the reaction it was counted as was mostly that hold."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import soak
import soak_report
from soak_trainer import COLLECTIVE_HOLD

# Downtimes from the etcd soak of issue 41 (seed 933655), and one shorter than the hold.
FAULTS = [
    {"kind": "worker_kill_in_collective", "downtime": 0.89},
    {"kind": "worker_kill_in_collective", "downtime": 1.45},
    {"kind": "worker_kill_in_collective", "downtime": 0.3},
    {"kind": "worker_kill", "downtime": 0.43},
    {"kind": "guardian_kill"},  # no downtime: nothing stopped
    {"kind": "worker_exception", "downtime": 0.4, "skipped": "no worker"},
]


@pytest.mark.parametrize("default_timeouts", [False, True])
@pytest.mark.parametrize("backend", ["etcd", "c10d"])
def test_an_in_collective_kills_hold_is_waited_out_not_reaction(
    default_timeouts: bool, backend: str
) -> None:
    held = soak.waits(default_timeouts, backend)
    assert held["worker_kill_in_collective"] == COLLECTIVE_HOLD == 0.5
    assert held["spare_freeze"] == soak.SPARE_HOLD[backend]
    assert "worker_kill" not in held  # a kill at any moment waits nothing out
    split = soak_report.lost_split(FAULTS, held, wall=100.0, useful=90.0)
    assert split["down"] == pytest.approx(0.89 + 1.45 + 0.3 + 0.43)
    assert split["waited"] == pytest.approx(0.5 + 0.5 + 0.3)  # at most each fault's down
    assert split["reaction"] == pytest.approx(0.39 + 0.95 + 0.0 + 0.43)
    assert split["rest"] == pytest.approx(10.0 - split["down"])
    assert split["ettr_without_waits"] == pytest.approx(90.0 / (100.0 - split["waited"]))
