"""The run's event log, ``<run dir>/events.jsonl``: a real job with one failure and one
restart writes the expected events in order; the format's own rules."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from phalanx.events import EVENTS_FILE, KINDS, read_events, recovery
from phalanx.events.kinds import COMMON
from support.launch import run_phalanx, worker


def _events(logs: Path) -> list[dict[str, object]]:
    (path,) = logs.glob(f"*/{EVENTS_FILE}")
    return read_events(path)


def test_no_kind_has_a_field_named_like_a_common_one() -> None:
    for kind, names in KINDS.items():
        assert not set(names) & set(COMMON), kind


def test_a_torn_or_foreign_line_is_skipped(tmp_path: Path) -> None:
    good = {"v": 1, "kind": "rdzv_start", "attempt": 1}
    path = tmp_path / EVENTS_FILE
    path.write_text(
        json.dumps(good) + "\n" + json.dumps({"kind": "not-ours"}) + "\n" + '{"v": 1, "ki'
    )
    assert read_events(path) == [good]


def test_one_failure_and_one_restart_in_order(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    done = run_phalanx(
        ["--nproc-per-node", "2", "--max-restarts", "1", "--log-dir", str(logs),
         worker("steps_then_fail.py"), "6", "1", "2"],
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    events = _events(logs)
    kinds = [e["kind"] for e in events if e["kind"] != "progress"]
    attempt = ["rdzv_start", "rdzv_done", "workers_started", "worker_exit", "worker_exit"]
    assert kinds == [
        "run_start", *attempt, "failure", "stopped", "restart", *attempt, "job_end",
    ]  # fmt: skip
    assert [e["seq"] for e in events] == list(range(len(events)))
    (failure,) = (e for e in events if e["kind"] == "failure")
    assert (failure["rank"], failure["exit_code"], failure["local"]) == (1, 3, True)
    assert failure["failure_kind"] == "exit_code"
    first = [e for e in events if e["kind"] == "worker_exit" and e["attempt"] == 1]
    assert {(e["rank"], e["failed"]) for e in first} == {(0, False), (1, True)}
    assert next(e for e in first if e["rank"] == 0)["stopped_by_phalanx"] is True
    # The failing rank's last progress before the failure is its step 2, exactly.
    before = [
        e for e in events if e["kind"] == "progress" and e["rank"] == 1 and e["round"] == 0
    ]
    assert before[-1]["step"] == 2
    second = [e for e in events if e["kind"] == "rdzv_done"][1]
    assert (second["restart_count"], second["attempt"], second["world_size"]) == (1, 2, 2)
    assert events[-1]["outcome"] == "succeeded" and events[-1]["exit_code"] == 0


def test_recovery_figures_of_one_failure_and_one_restart(tmp_path: Path) -> None:
    """The figures from the real events: one incident whose four parts are the recorded
    values' differences and add up to its downtime; said at the end and saved in the
    report.json a job that succeeded after a restart writes."""
    logs = tmp_path / "logs"
    done = run_phalanx(
        ["--nproc-per-node", "1", "--max-restarts", "1", "--log-dir", str(logs),
         worker("steps_then_fail.py"), "6", "0", "2"],
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    events = _events(logs)
    figures = recovery(events)
    (incident,) = figures.incidents
    failure, stopped = (next(e for e in events if e["kind"] == k) for k in ("failure", "stopped"))
    formed = [e for e in events if e["kind"] == "rdzv_done"][1]
    back = next(
        e for e in events
        if e["kind"] == "progress" and e["round"] == formed["round"] and e["step"] >= 2
    )  # fmt: skip
    # The incident begins at the earlier of the failure and the ranks' last progress before
    # it: the reading before the one that saw their last move (``age``), on the node's clock.
    shift = failure["t"] - failure["mono"]
    moved = [e["mono"] - e["age"] for e in events if e["kind"] == "progress" and e["round"] == 0]
    began = min(failure["failed_at"] - shift, max(moved))
    expected = {
        "detect": failure["detected_at"] - shift - began,
        "stop": stopped["seconds"],
        # The fold takes durations on the node's monotonic clock (a wall-clock step must
        # not bend them), so the expected figures do too: ``t`` and ``mono`` can round
        # a millisecond apart.
        "reform": formed["mono"] - stopped["mono"],
        "back": back["mono"] - formed["mono"],
    }
    # Each figure is rounded to the millisecond, from values of the events rounded to the
    # microsecond (``age`` to the millisecond): a part may be a millisecond off, their sum a
    # few.
    for part, value in expected.items():
        assert getattr(incident, part) == pytest.approx(value, abs=0.0015), part
    assert incident.recovered and incident.target == "step 2"
    assert incident.downtime == pytest.approx(sum(expected.values()), abs=0.005)
    assert figures.ettr is not None and 0 < figures.ettr < 1
    # Said at the end, and saved in report.json (the job succeeded after the restart).
    assert "phalanx: recovery: incident 1 (round 0), rank 0 exit_code on" in done.stderr
    assert re.search(r"^phalanx: recovery: ETTR 0\.\d\d \(the share of the run spent making progress\): ", done.stderr, re.M), done.stderr
    (path,) = logs.glob("*/report.json")
    report = json.loads(path.read_text())
    assert report["outcome"] == "succeeded" and report["attempts"] == 2
    saved = report["recovery"]
    assert len(saved["incidents"]) == 1 and 0 < saved["ettr"] < 1
    assert saved["incidents"][0]["downtime"] == pytest.approx(incident.downtime, abs=0.01)


def test_a_job_without_incident_says_no_recovery_and_its_report_has_none(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    done = run_phalanx(
        [
            "--nproc-per-node",
            "1",
            "--log-dir",
            str(logs),
            worker("steps_then_fail.py"),
            "2",
            "9",
            "0",
        ]
    )
    assert done.returncode == 0, done.stderr
    assert "recovery:" not in done.stderr
    # report.json is written at every end (issue 42); without an incident it has no figures.
    (path,) = logs.glob("*/report.json")
    report = json.loads(path.read_text())
    assert report["outcome"] == "succeeded" and report["recovery"] is None, report


def test_a_failed_job_reports_the_incident_it_never_recovered_from(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    done = run_phalanx(
        ["--nproc-per-node", "1", "--log-dir", str(logs), worker("steps_then_fail.py"), "6", "0", "1"]
    )
    assert done.returncode == 3, done.stderr
    (path,) = logs.glob("*/report.json")
    report = json.loads(path.read_text())
    assert report["outcome"] == "failed" and report["root_cause"]["rank"] == 0
    (incident,) = report["recovery"]["incidents"]
    assert (incident["recovered"], incident["back"], incident["reform"]) == (False, None, None)
    assert "recovery:" not in done.stderr, done.stderr  # no restart: nothing recovered from
