"""The run's event log, ``<run dir>/events.jsonl``: a real job with one failure and one
restart writes the expected events in order; the format's own rules."""

from __future__ import annotations

import json
from pathlib import Path

from phalanx.events import EVENTS_FILE, KINDS, read_events
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
