"""Recovery figures (``phalanx.events.figures``) from hand-made event lists: the pure
function, table-driven. The real job's figures are in test_events.py."""

from __future__ import annotations

from typing import Any

import pytest

from phalanx.events import recovery
from phalanx.events.figures import RecoveryTracker
from phalanx.report.recovery import ettr_line, summary_lines


class Node:
    """One agent's events, ``seq`` counted as the agent counts it."""

    def __init__(self, host: str = "hostA", node: int | None = 0) -> None:
        self.host, self.node, self.events = host, node, []  # type: list[dict[str, Any]]

    def __call__(self, kind: str, t: float, **fields: Any) -> Node:
        common = {"v": 1, "t": t, "mono": t, "seq": len(self.events), "host": self.host}
        self.events.append({**common, "node": self.node, "kind": kind, **fields})
        return self

    def progress(
        self, t: float, round: int, step: int | None, beats: int = 1, age: float | None = None
    ) -> Node:
        """``age``: as an agent that reads the counters every tick records it (None: an
        agent before it, which sampled every 2 s)."""
        extra = {} if age is None else {"age": age}
        return self("progress", t, round=round, rank=0, step=step, beats=beats, **extra)

    def fail(self, t: float, round: int, failed_at: float | None, detected_at: float) -> Node:
        return self(
            "failure", t, round=round, attempt=round + 1, rank=1, failed_node=0,
            failure_kind="exit_code", reason="exit 3", exit_code=3, local=True,
            failed_at=failed_at, detected_at=detected_at,
        )  # fmt: skip

    def restart(self, t_stopped: float, seconds: float, round: int, t_formed: float) -> Node:
        self("stopped", t_stopped, round=round - 1, attempt=round, seconds=seconds)
        self("restart", t_stopped, restart=round, max_restarts=3, round=round - 1)
        self("rdzv_start", t_stopped, attempt=round + 1)
        return self("rdzv_done", t_formed, round=round, attempt=round + 1, seconds=0.1)


def started(host: str = "hostA", node: int = 0) -> Node:
    """As an agent starts: no node rank until the first round forms."""
    run = Node(host, None)("run_start", 0.0, run_id="r")("rdzv_start", 0.0, attempt=1)
    run.node = node
    return run("rdzv_done", 1.0, round=0, attempt=1)


def one_incident(host: str = "hostA", node: int = 0) -> Node:
    """Peak step 4 in round 0; fails at 5.5, detected 5.8, stopped 0.5 s later (t 6.3);
    round 1 forms at 8.0 and is back at step 4 at 11.0; ends at 20."""
    run = started(host, node).progress(3.0, 0, 0).progress(5.0, 0, 4).fail(6.0, 0, 5.5, 5.8)
    run.restart(6.3, 0.5, 1, 8.0).progress(9.0, 1, 2).progress(11.0, 1, 4)
    return run("job_end", 20.0, outcome="succeeded", exit_code=0)


CASES: dict[str, tuple[list[dict[str, Any]], float | None, dict[str, Any], dict[str, Any]]] = {
    "recovered at the step it failed at": (
        one_incident().events, None,
        {"detect": 0.3, "stop": 0.5, "reform": 1.7, "back": 3.0, "downtime": 5.5,
         "recovered": True, "target": "step 4"},
        {"wall": 20.0, "startup": 3.0, "downtime": 5.5, "productive": 11.5, "ettr": 0.575},
    ),
    "no step reported: beats": (
        started().progress(3.0, 0, None, 1).progress(5.0, 0, None, 7).fail(6.0, 0, 5.0, 5.5)
        .restart(6.0, 0.5, 1, 7.0).progress(8.0, 1, None, 3).progress(10.0, 1, None, 7)
        ("job_end", 10.0).events, None,
        {"detect": 0.5, "stop": 0.5, "reform": 1.0, "back": 1.0, "downtime": 3.0,
         "target": None},  # beats count from 0 again: back at the new round's first beat
        {"wall": 10.0, "startup": 3.0, "productive": 4.0, "ettr": 0.4},
    ),
    "never re-formed: down to the end of the run": (
        started().progress(2.0, 0, 1).fail(4.0, 0, 3.0, 3.5)
        ("stopped", 4.0, round=0, attempt=1, seconds=0.5)("job_end", 10.0).events, None,
        {"detect": 0.5, "stop": 0.5, "reform": None, "back": None, "downtime": 7.0,
         "recovered": False},
        {"wall": 10.0, "startup": 2.0, "downtime": 7.0, "productive": 1.0, "ettr": 0.1},
    ),
    "the step never reached again: down until the next failure": (
        started().progress(2.0, 0, 5).fail(4.0, 0, 3.0, 3.0).restart(4.0, 0.0, 1, 5.0)
        .progress(6.0, 1, 2).fail(7.0, 1, 7.0, 7.0).restart(7.0, 0.0, 2, 8.0)
        .progress(9.0, 2, 2)("job_end", 12.0).events, None,
        {"back": None, "downtime": 4.0, "recovered": False, "target": "step 5"},  # cut at 7
        {"wall": 12.0, "startup": 2.0, "downtime": 6.0, "productive": 4.0},
    ),
    "a running job ends now": (
        started().progress(2.0, 0, 1).fail(4.0, 0, 4.0, 4.0).events, 14.0,
        {"downtime": 10.0, "recovered": False},
        {"wall": 14.0, "startup": 2.0, "productive": 2.0},
    ),
    "failed_at unknown: no detect, downtime from detection": (
        started().progress(2.0, 0, 1).fail(4.0, 0, None, 4.0).restart(4.5, 0.5, 1, 5.0)
        .progress(6.0, 1, 1)("job_end", 8.0).events, None,
        {"detect": None, "stop": 0.5, "reform": 0.5, "back": 1.0, "downtime": 2.0},
        {"wall": 8.0, "startup": 2.0, "productive": 4.0, "ettr": 0.5},
    ),
    "a failure before any progress: startup ends at the failure": (
        started().fail(3.0, 0, 3.0, 3.0).restart(3.0, 0.0, 1, 4.0).progress(6.0, 1, 0)
        ("job_end", 10.0).events, None,
        {"reform": 1.0, "back": 2.0, "downtime": 3.0, "target": None},
        {"wall": 10.0, "startup": 3.0, "downtime": 3.0, "productive": 4.0, "ettr": 0.4},
    ),
    # Events with ``age`` (the agent reads the counters every tick; ``age``: since its
    # previous reading, 0.1 s here): the incident begins at the ranks' last progress.
    "a short run: its steps count from the first one, the incident from the last": (
        started().progress(3.0, 0, 0, age=0.1).progress(4.0, 0, 5, age=0.1)
        .fail(4.3, 0, 4.3, 4.3).restart(4.4, 0.1, 1, 4.5).progress(5.0, 1, 0, age=0.1)
        .progress(5.8, 1, 5, age=0.1).progress(6.5, 1, 9, age=0.1)("job_end", 6.6).events, None,
        {"detect": 0.4, "stop": 0.1, "reform": 0.1, "back": 1.3, "downtime": 1.9},
        {"wall": 6.6, "startup": 3.0, "downtime": 1.9, "productive": 1.7, "ettr": 0.2576},
    ),
    "the agent stopped 12.5 s: down from where it last saw progress": (
        started().progress(3.0, 0, 0, age=0.1).progress(10.0, 0, 20, age=0.1)
        .progress(22.5, 0, 30, age=12.5).fail(22.5, 0, 22.5, 22.5).restart(22.6, 0.1, 1, 22.7)
        .progress(23.0, 1, 0, age=0.1).progress(25.0, 1, 30, age=0.1)("job_end", 30.0).events,
        None,
        {"detect": 12.5, "stop": 0.1, "reform": 0.1, "back": 2.3, "downtime": 15.0},
        {"wall": 30.0, "startup": 3.0, "downtime": 15.0, "productive": 12.0, "ettr": 0.4},
    ),
    "a second failure just after back: not before it": (
        started().progress(2.0, 0, 3, age=0.1).fail(3.0, 0, 3.0, 3.0).restart(3.0, 0.0, 1, 4.0)
        .progress(5.0, 1, 3, age=0.5).fail(5.1, 1, 5.1, 5.1).restart(5.1, 0.0, 2, 6.0)
        .progress(7.0, 2, 3, age=0.1)("job_end", 8.0).events, None,
        {"downtime": 3.1, "back": 1.0, "recovered": True},
        {"wall": 8.0, "startup": 1.9, "downtime": 5.1, "productive": 1.0},
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", CASES)
def test_incident_and_run_figures(name: str) -> None:
    events, now, incident, run = CASES[name]
    figures = recovery(events, now)
    first = figures.incidents[0].to_json()
    assert {k: first[k] for k in incident} == incident
    (node,) = figures.nodes
    assert {k: node.to_json()[k] for k in run} == run
    recovered = [i for i in figures.incidents if i.recovered]
    for i in recovered:  # the parts add up
        parts = [p for p in (i.detect, i.stop, i.reform, i.back) if p is not None]
        assert i.downtime == pytest.approx(sum(parts), abs=1e-9)


def test_no_progress_at_all_has_no_ettr() -> None:
    events = started().fail(3.0, 0, 3.0, 3.0)("job_end", 5.0).events
    figures = recovery(events)
    assert figures.ettr is None and figures.nodes[0].ettr is None
    assert "no ETTR" in ettr_line(figures, figures.nodes[0])
    assert summary_lines(figures) == []  # no restart: nothing was recovered from


def test_a_script_that_reports_no_progress_is_back_when_its_workers_finish() -> None:
    """No step, no beat (a ``phalanx.spawn`` program that only all-reduces): the new round
    is back at its first worker that exits 0 on its own; one stopped by phalanx is not."""

    def exit_(run: Node, t: float, round: int, code: int, stopped: bool) -> Node:
        return run("worker_exit", t, round=round, attempt=round + 1, rank=0, local_rank=0,
                   pid=1, returncode=code, signal=None, failed=code != 0,
                   stopped_by_phalanx=stopped, exited_at=t)  # fmt: skip

    run = exit_(started().fail(3.0, 0, 3.0, 3.0), 3.0, 0, 1, False).restart(3.2, 0.2, 1, 4.0)
    exit_(run, 6.0, 1, 0, True)  # stopped by phalanx: not its own finish
    (incident,) = recovery(run.events).incidents
    assert not incident.recovered
    exit_(run, 7.0, 1, 0, False)("job_end", 7.5, outcome="succeeded", exit_code=0)
    figures = recovery(run.events)
    (incident,) = figures.incidents
    assert (incident.recovered, incident.back, incident.downtime) == (True, 3.0, 4.0), incident
    assert figures.ettr is None  # nothing tells its startup from its training
    first, ettr = summary_lines(figures)
    assert ": making progress again after 4.00 s down (" in first, first
    assert "never" not in first and ettr.startswith("recovery: no ETTR: the workers reported")


def test_no_incident_prints_nothing() -> None:
    events = started().progress(2.0, 0, 1)("job_end", 4.0).events
    figures = recovery(events)
    assert figures.incidents == () and figures.nodes[0].ettr == 0.5
    assert summary_lines(figures) == []


def _interleaved(*nodes: Node) -> list[dict[str, Any]]:
    merged = [e for n in nodes for e in n.events]
    return sorted(merged, key=lambda e: e["t"])


@pytest.mark.parametrize("order", ["concatenated", "by time"])
@pytest.mark.parametrize("hosts", [("hostA", "hostB"), ("hostA", "hostA")])
def test_merged_nodes_are_told_apart(order: str, hosts: tuple[str, str]) -> None:
    """Two nodes' events merged (two hosts, or two agents on one host, told apart by their
    seq chains): each node's figures as if read alone; the run's ETTR is the lower one."""
    a = one_incident(hosts[0], 0)
    b = started(hosts[1], 1).progress(2.0, 0, 1)("job_end", 10.0)
    merged = a.events + b.events if order == "concatenated" else _interleaved(a, b)
    figures = recovery(merged)
    alone = recovery(a.events).nodes + recovery(b.events).nodes
    assert sorted(figures.nodes, key=str) == sorted(alone, key=str)
    assert len(figures.incidents) == 1 and figures.incidents[0].host == hosts[0]
    assert figures.ettr == min(n.ettr for n in alone if n.ettr is not None)


def test_the_tracker_fed_one_at_a_time_is_the_function() -> None:
    events = one_incident().events
    tracker = RecoveryTracker()
    for e in events:
        tracker.add(e)
    assert tracker.result() == recovery(events)
    lines = summary_lines(tracker.result())
    assert lines[0].startswith("recovery: incident 1 (round 0), rank 1 exit_code on hostA (node 0)")
    assert "back at step 4 after 5.50 s down (" in lines[0] and lines[1].startswith("recovery: ETTR 0.57")


def test_the_lines_say_the_parts_in_words() -> None:
    """A script with no step (its optimizer steps counted as beats): back at its first beat
    of the new attempt (beats count from 0 again), no "beats", no "re-form ?"."""
    events = (
        started().progress(2.0, 0, None, beats=7).fail(3.0, 0, 3.0, 3.0)
        .restart(3.5, 0.5, 1, 4.0).progress(5.0, 1, None, beats=0)
        .progress(6.0, 1, None, beats=3)("job_end", 9.0).events
    )  # fmt: skip
    first, _ = summary_lines(recovery(events))
    assert first == (
        "recovery: incident 1 (round 0), rank 1 exit_code on hostA (node 0): making progress "
        "again after 3.00 s down (noticed in 0.00 s, workers stopped in 0.50 s, the nodes "
        "regrouped in 0.50 s, progress again in 2.00 s)"
    )
    unformed = (
        started().progress(2.0, 0, 4).fail(3.0, 0, 3.0, 3.0)
        ("restart", 3.0, restart=1, max_restarts=3, round=0)("job_end", 5.0).events
    )  # fmt: skip
    assert "the nodes never regrouped)" in summary_lines(recovery(unformed))[0]


def test_a_peers_failure_names_the_failing_node_and_the_node_that_saw_it() -> None:
    run = started().progress(2.0, 0, 1)
    run("failure", 3.0, round=0, attempt=1, rank=1, failed_node=1, failure_kind="exit_code",
        reason="exit 3", exit_code=None, local=False, failed_at=2900.0, detected_at=3.0)
    run.restart(3.5, 0.5, 1, 4.0).progress(5.0, 1, 1)("job_end", 6.0)
    figures = recovery(run.events)
    (incident,) = figures.incidents
    assert incident.detect is None  # the peer's ``failed_at`` is on the peer's clock
    # With ``age`` the incident begins at this node's last progress: detect is on its clock.
    run = started().progress(2.0, 0, 1, age=0.1)
    run("failure", 3.0, round=0, attempt=1, rank=1, failed_node=1, failure_kind="exit_code",
        reason="exit 3", exit_code=None, local=False, failed_at=2900.0, detected_at=3.0)
    (incident,) = recovery(run.events).incidents
    assert incident.detect == 1.1 and incident.downtime == 1.1, incident
    assert summary_lines(figures)[0].startswith(
        "recovery: incident 1 (round 0), rank 1 exit_code on node 1 (as seen on hostA (node 0)): "
    )


def test_a_wall_clock_step_changes_no_figure() -> None:
    """``t`` steps an hour back mid-run; ``mono`` runs on: the figures are ``mono``'s."""
    steady = one_incident().events
    stepped = [{**e, "t": e["t"] - 3600.0 if e["t"] > 7.0 else e["t"]} for e in steady]
    assert recovery(stepped) == recovery(steady)
    assert recovery(stepped).nodes[0].ettr == 0.575


def test_a_stall_is_not_productive_and_a_slow_step_is() -> None:
    """Running, no progress for 30 s (more than STALLED_AFTER): stalled, not productive;
    the same gap closed by a step (a slow step) counts again; a succeeded job's tail counts."""
    hung = started().progress(2.0, 0, 1).events
    (node,) = recovery(hung, now=32.0).nodes
    assert (node.stalled, node.productive, node.wall) == (30.0, 0.0, 32.0)
    slow = started().progress(2.0, 0, 1).progress(32.0, 0, 2).events
    assert recovery(slow, now=33.0).nodes[0].stalled == 0.0
    ended = started().progress(2.0, 0, 1)("job_end", 40.0, outcome="succeeded").events
    assert recovery(ended).nodes[0].stalled == 0.0
    stopped = started().progress(2.0, 0, 1)("job_end", 40.0, outcome="interrupted").events
    assert recovery(stopped).nodes[0].stalled == 38.0
    figures = recovery(stopped)
    assert "38.00 s without progress since" in ettr_line(figures, figures.nodes[0])
