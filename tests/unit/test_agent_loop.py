"""The agent's loop as a state machine (``agent.loop.Rounds``): each way a run ends is the
``RunEnd`` value it returns. No process is started: a scripted supervisor returns each
round's result, the rendezvous is the single-node one (in memory) or a scripted one, and
nothing is reported (the ``Reporter`` is not called): the value is what is checked."""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from phalanx.agent.between import Between
from phalanx.agent.endings import Endings
from phalanx.agent.filewriter import REPORT_FILE, RunFiles
from phalanx.agent.loop import Rounds
from phalanx.agent.runend import Reporter, RunEnd, Said
from phalanx.config import LaunchConfig, RecoveryConfig, WorkersConfig
from phalanx.errors import Interrupted, JobFailed, Preempted, RendezvousError
from phalanx.events.log import EventLog
from phalanx.rendezvous.api import EventKind, JobEvent
from phalanx.rendezvous.local import LocalRendezvous, LocalRound
from phalanx.rendezvous.roundend import ENDS_CHECK, ENDS_ROUND
from phalanx.status import StatusService
from phalanx.supervisor.exits import WorkerExit
from phalanx.supervisor.group import Outcome, RoundResult
from phalanx.supervisor.preempt import Preemption


class Signals:
    """The signal watcher as the loop reads it: the preemption signals ``preempts`` and the
    stop signal ``stop`` arrived before the first round formed (none by default)."""

    stacks_active = False

    def __init__(self, preempts: tuple[int, ...] = (), stop: int | None = None) -> None:
        self.preempts = list(preempts)
        self.stop = stop

    def pending(self) -> int | None:
        return self.stop

    def take_preempt(self) -> int | None:
        return self.preempts.pop(0) if self.preempts else None

    @contextlib.contextmanager
    def raising(self) -> Iterator[None]:
        yield


class Supervisor:
    """Returns the scripted result of each round, in order; records the rounds it ran."""

    stop_began = None

    def __init__(self, results: list[Callable[[int], RoundResult]]) -> None:
        self.results = list(results)
        self.rounds: list[int] = []

    def run(self, plan: Any, *args: object) -> RoundResult:
        self.rounds.append(len(self.rounds))
        return self.results.pop(0)(len(plan.workers))

    def wake(self) -> None:
        pass


class Closing(LocalRendezvous):
    """The single-node rendezvous, which cannot form round ``closed_at`` (its store closed)."""

    def __init__(self, closed_at: int) -> None:
        super().__init__(run_id="loop")
        self.closed_at = closed_at

    def next_round(self, local_world_size: int) -> LocalRound:
        if self._round + 1 == self.closed_at:
            raise RendezvousError("the rendezvous is closed")
        return super().next_round(local_world_size)


class Remembering(LocalRendezvous):
    """The single-node rendezvous, which keeps the round it formed last (``joined``)."""

    def __init__(self) -> None:
        super().__init__(run_id="loop")
        self.joined: LocalRound | None = None

    def next_round(self, local_world_size: int) -> LocalRound:
        self.joined = super().next_round(local_world_size)
        return self.joined


class Hearing(LocalRendezvous):
    """The single-node rendezvous whose watch heard ``heard[round]`` before that round's
    workers could start (``poll`` gives it once; the round's ``poll`` after it, nothing)."""

    def __init__(self, heard: dict[int, JobEvent]) -> None:
        super().__init__(run_id="loop")
        self.heard = dict(heard)

    def poll(self) -> JobEvent | None:
        return self.heard.pop(self._round, None)


class Polling(Supervisor):
    """Polls once as its round runs (the real one does at its first tick): what it got."""

    def __init__(self, results: list[Callable[[int], RoundResult]]) -> None:
        super().__init__(results)
        self.polled: list[JobEvent | None] = []

    def run(self, plan: Any, *args: object) -> RoundResult:
        poll: Any = args[1]
        self.polled.append(poll())
        return super().run(plan, *args)


def exit_of(rank: int, code: int, stopped: bool = False) -> WorkerExit:
    return WorkerExit(rank, rank, "host", 1000 + rank, code, time.time(), stopped)


def succeeded(n: int) -> RoundResult:
    return RoundResult(Outcome.SUCCEEDED, tuple(exit_of(r, 0) for r in range(n)))


def failed(n: int) -> RoundResult:
    """Rank 0 exits 3; the others are stopped by the launcher."""
    exits = (exit_of(0, 3), *(exit_of(r, -15, True) for r in range(1, n)))
    return RoundResult(Outcome.FAILED, exits)


def remote(kind: EventKind, **failure: object) -> Callable[[int], RoundResult]:
    """Another node's event stopped this node's workers."""
    event = JobEvent(kind, 1, "", dict(failure))

    def result(n: int) -> RoundResult:
        return RoundResult(Outcome.REMOTE, tuple(exit_of(r, -15, True) for r in range(n)), event)

    return result


def interrupted(n: int) -> RoundResult:
    exits = tuple(exit_of(r, -15, True) for r in range(n))
    return RoundResult(Outcome.INTERRUPTED, exits, signum=signal.SIGTERM)


def preempted(n: int) -> RoundResult:
    notice = Preemption("SIGUSR1", time.time(), 0, 30.0, time.monotonic() + 30.0)
    exits = tuple(exit_of(r, 0) for r in range(n))
    return RoundResult(Outcome.PREEMPTED, exits, preemption=notice)


class Run:
    """One agent run's loop over a scripted supervisor, in ``tmp_path``."""

    def __init__(self, tmp_path: Path, max_restarts: int, rendezvous: LocalRendezvous) -> None:
        self.config = LaunchConfig(
            WorkersConfig(program="train.py", nproc_per_node=2),
            recovery=RecoveryConfig(max_restarts=max_restarts),
        )
        self.rdzv = rendezvous
        self.run_dir = tmp_path / "run"
        self.run_dir.mkdir()
        self.events = EventLog(self.run_dir, time.time)
        self.names: list[str] = []
        self.events.listen(lambda event: self.names.append(str(event["kind"])))
        self.status = StatusService(self.run_dir, self.events)

    def end(self, *results: Callable[[int], RoundResult], signals: Any = None) -> RunEnd:
        signals = signals or Signals()
        self.supervisor = Polling(list(results))
        supervisor: Any = self.supervisor
        ends = Endings(self.config, self.rdzv, signals, self.events)
        rounds = Rounds(
            self.config, self.rdzv, supervisor, signals, self.run_dir, {}, self.status,
            Between(ends),
        )  # fmt: skip
        try:
            end = rounds.run()
        finally:
            self.status.close()
            self.events.close()
        assert not supervisor.results, "a scripted round was not run"
        return end


@pytest.fixture
def run(tmp_path: Path) -> Callable[..., Run]:
    def make(max_restarts: int = 0, rendezvous: LocalRendezvous | None = None) -> Run:
        return Run(tmp_path, max_restarts, rendezvous or LocalRendezvous(run_id="loop"))

    return make


def test_success_returns_a_succeeded_end(run: Callable[..., Run]) -> None:
    end = run().end(succeeded)
    assert (end.outcome, end.error, end.exit_code) == ("succeeded", None, 0)
    assert end.report is not None and end.report["outcome"] == "succeeded"
    assert [e["rank"] for e in end.report["exits"]] == [0, 1]  # type: ignore[index,union-attr]


def test_a_worker_failure_within_the_budget_restarts(run: Callable[..., Run]) -> None:
    r = run(max_restarts=1)
    end = r.end(failed, succeeded)
    assert (end.outcome, end.exit_code) == ("succeeded", 0)
    assert end.report is not None and end.report["attempts"] == 2
    assert r.names.count("restart") == 1


def test_the_budget_spent_ends_with_the_root_cause_code(run: Callable[..., Run]) -> None:
    r = run(max_restarts=1)
    end = r.end(failed, failed)
    assert end.outcome == "failed" and isinstance(end.error, JobFailed)
    assert end.exit_code == 3  # rank 0's
    assert end.report is not None and end.report["attempts"] == 2
    assert end.report["crash_loop"] is False
    assert any(s.level is None and "rank 0" in s.text for s in end.said)  # the framed report


def test_the_same_failure_twice_without_progress_is_a_crash_loop(run: Callable[..., Run]) -> None:
    end = run(max_restarts=5).end(failed, failed)
    assert isinstance(end.error, JobFailed) and end.exit_code == 3
    assert end.report is not None and end.report["crash_loop"] is True
    assert any(s.level is None and "crash loop" in s.text for s in end.said)


def test_a_peer_failure_spends_a_restart(run: Callable[..., Run]) -> None:
    r = run(max_restarts=1)
    end = r.end(remote(EventKind.PEER_FAILED), succeeded)
    assert end.outcome == "succeeded" and r.names.count("restart") == 1


def test_a_peer_failure_with_no_budget_ends_the_job(run: Callable[..., Run]) -> None:
    rdzv = Remembering()
    peer = {"rank": 3, "local_rank": 1, "host": "peer", "pid": 7, "returncode": 9, "time": 1.0}
    told = remote(EventKind.PEER_FAILED, **peer)

    def result(n: int) -> RoundResult:  # the peer's record, in the store as the event says
        rdzv.joined.report_failure({**peer, "stopped_by_launcher": False, "node_rank": 1})
        return told(n)

    end = run(rendezvous=rdzv).end(result)
    assert end.outcome == "failed" and isinstance(end.error, JobFailed)
    assert end.exit_code == 9  # the peer's rank is the job's root cause


def test_a_lost_node_spends_a_restart_and_ends_the_job_without_one(
    run: Callable[..., Run],
) -> None:
    r = run(max_restarts=1)
    end = r.end(remote(EventKind.NODE_LOST), remote(EventKind.NODE_LOST))
    assert r.names.count("restart") == 1
    assert end.outcome == "failed" and isinstance(end.error, RendezvousError)
    assert str(end.error) == "the job stopped: node 1 was lost"
    assert end.report is not None and end.report["outcome"] == "failed"


def test_a_node_waiting_to_join_reforms_without_a_restart(run: Callable[..., Run]) -> None:
    r = run(max_restarts=0)
    end = r.end(remote(EventKind.NODE_WAITING), succeeded)
    assert end.outcome == "succeeded"
    assert r.names.count("reform") == 1 and r.names.count("restart") == 0


def test_a_round_that_ended_before_its_workers_started_restarts_without_them(
    run: Callable[..., Run],
) -> None:
    """A member lost before round 0's workers started (its node check stopped on it): the
    step after it is the restart a lost node spends, and no worker is started for round 0
    (the supervisor runs one round, the next; one ``workers_started``). The failure and the
    stop are still recorded, so the incident is in the recovery figures."""
    r = run(max_restarts=1, rendezvous=Hearing({0: JobEvent(EventKind.NODE_LOST, 1, "gone")}))
    end = r.end(succeeded)
    assert (end.outcome, end.exit_code) == ("succeeded", 0)
    assert r.supervisor.rounds == [0]  # round 1's workers only
    assert r.names.count("workers_started") == 1 and r.names.count("restart") == 1
    assert r.names.index("failure") < r.names.index("stopped") < r.names.index("restart")
    assert end.report is not None and end.report["attempts"] == 2


def test_a_round_that_ended_before_its_workers_started_without_budget_ends_the_job(
    run: Callable[..., Run],
) -> None:
    r = run(max_restarts=0, rendezvous=Hearing({0: JobEvent(EventKind.NODE_LOST, 1, "gone")}))
    end = r.end()
    assert end.outcome == "failed" and isinstance(end.error, RendezvousError)
    assert str(end.error) == "the job stopped: node 1 was lost: gone"
    assert "workers_started" not in r.names and r.supervisor.rounds == []


def test_a_stop_heard_before_the_workers_started_ends_as_interrupted(
    run: Callable[..., Run],
) -> None:
    stop = JobEvent(EventKind.JOB_STOPPED, 1, "", {"signal": int(signal.SIGTERM)})
    r = run(max_restarts=3, rendezvous=Hearing({0: stop}))
    end = r.end()
    assert isinstance(end.error, Interrupted) and end.exit_code == 128 + signal.SIGTERM
    assert r.supervisor.rounds == []


def test_a_node_waiting_before_the_workers_started_is_acted_on_once_they_run(
    run: Callable[..., Run],
) -> None:
    """Not a round's end before its workers start: they start, and the supervisor's first
    poll hands it on (then the round re-forms, as it always did)."""
    waiting = JobEvent(EventKind.NODE_WAITING, 1)
    r = run(max_restarts=0, rendezvous=Hearing({0: waiting}))
    end = r.end(remote(EventKind.NODE_WAITING), succeeded)
    assert end.outcome == "succeeded" and r.supervisor.rounds == [0, 1]
    assert r.supervisor.polled == [waiting, None]


def test_the_node_check_stops_on_every_event_that_ends_a_round_before_its_workers() -> None:
    """The check stops on the round's end and on a preemption (``CheckRecords``) so that the
    agent acts on it; only a node waiting to join lets it go on (a new kind must choose)."""
    assert ENDS_ROUND < ENDS_CHECK == ENDS_ROUND | {EventKind.PREEMPTED}
    assert set(EventKind) == ENDS_CHECK | {EventKind.NODE_WAITING}


def preempted_before(r: Run, end: RunEnd, node: int) -> None:
    """``end`` is a preempted round's, whose workers never started: exit 75, no restart, the
    ``preempt`` event and the report as after a preemption; ``node``: where it came from."""
    assert end.outcome == "preempted" and isinstance(end.error, Preempted)
    assert end.exit_code == 75 and r.supervisor.rounds == []
    assert "preempt" in r.names and "workers_started" not in r.names
    assert "restart" not in r.names and "failure" not in r.names
    assert end.report is not None and end.report["exit_code"] == 75 and end.report["exits"] == []
    assert end.report["preempted"]["node"] == node  # type: ignore[index]
    assert end.report["preempted"]["signal"] == "SIGUSR1"  # type: ignore[index]
    (text,) = [s.text for s in end.said if s.level is None]
    assert "last step on this node: none: no worker started in this round" in text, text


def test_a_preemption_heard_before_the_workers_started_ends_as_preempted_without_them(
    run: Callable[..., Run],
) -> None:
    """Another node's notice (its node check stopped on it): no worker forked for a job
    being preempted, and the run ends as a preempted round's does."""
    notice = {"signal": "SIGUSR1", "time": time.time(), "node": 1, "grace": 30.0}
    r = run(max_restarts=3, rendezvous=Hearing({0: JobEvent(EventKind.PREEMPTED, 1, "", notice)}))
    preempted_before(r, r.end(), node=1)


def test_a_preemption_signal_before_the_workers_started_ends_as_preempted_without_them(
    run: Callable[..., Run],
) -> None:
    """This node's own signal during its node check: told to the job (the round's notice is
    this node's), and the run ends as preempted with no worker forked."""
    r = run(max_restarts=3, rendezvous=Remembering())
    preempted_before(r, r.end(signals=Signals((signal.SIGUSR1,))), node=0)
    assert r.rdzv.joined is not None and r.rdzv.joined.preemption() is not None  # type: ignore[attr-defined]


def test_a_stop_signal_before_the_workers_started_ends_as_interrupted_without_them(
    run: Callable[..., Run],
) -> None:
    """This node's stop signal during its node check: the end of a stop, no worker forked."""
    r = run(max_restarts=3)
    end = r.end(signals=Signals(stop=signal.SIGTERM))
    assert end.outcome == "interrupted" and isinstance(end.error, Interrupted)
    assert end.exit_code == 128 + signal.SIGTERM and r.supervisor.rounds == []
    assert "workers_started" not in r.names and "restart" not in r.names
    assert end.report is not None and end.report["signal"] == "SIGTERM"
    assert end.report["exits"] == []


def test_a_stop_signal_ends_as_interrupted(run: Callable[..., Run]) -> None:
    end = run(max_restarts=3).end(interrupted)
    assert end.outcome == "interrupted" and isinstance(end.error, Interrupted)
    assert end.exit_code == 128 + signal.SIGTERM
    assert end.report is not None and end.report["signal"] == "SIGTERM"


def test_a_stop_on_another_node_ends_as_interrupted_by_its_signal(
    run: Callable[..., Run],
) -> None:
    end = run(max_restarts=3).end(remote(EventKind.JOB_STOPPED, signal=int(signal.SIGINT)))
    assert isinstance(end.error, Interrupted) and end.exit_code == 128 + signal.SIGINT
    assert end.report is not None and end.report["stopped_on_node"] == 1


def test_a_preemption_ends_with_the_requeue_code(run: Callable[..., Run]) -> None:
    end = run(max_restarts=3).end(preempted)
    assert end.outcome == "preempted" and isinstance(end.error, Preempted)
    assert end.exit_code == 75 and end.requeue is False  # no --requeue
    assert end.report is not None and end.report["exit_code"] == 75
    assert end.report["preempted"]["signal"] == "SIGUSR1"  # type: ignore[index]


def test_a_closed_rendezvous_after_a_failure_reports_that_failure(
    run: Callable[..., Run],
) -> None:
    end = run(max_restarts=2, rendezvous=Closing(closed_at=1)).end(failed)
    assert end.outcome == "failed" and isinstance(end.error, JobFailed) and end.exit_code == 3
    assert end.report is not None
    assert end.report["ended"] == "the restart round could not form: the rendezvous is closed"


def test_a_rendezvous_closed_before_any_round_ends_with_its_error(
    run: Callable[..., Run],
) -> None:
    end = run(rendezvous=Closing(closed_at=0)).end()
    assert end.outcome == "failed" and isinstance(end.error, RendezvousError)
    assert end.report is not None and end.report["reason"] == "the rendezvous is closed"


def test_the_reporter_says_writes_and_returns_the_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = RunFiles(tmp_path)
    end = RunEnd("succeeded", None, (Said("framed", None),), {"outcome": "succeeded"})
    assert Reporter(files, {}, None).finish(end) == 0
    files.close(time.monotonic() + 10)
    assert capsys.readouterr().err == "framed\n"
    assert json.loads((tmp_path / REPORT_FILE).read_text()) == {"outcome": "succeeded"}


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.said: list[tuple[int, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.said.append((record.levelno, record.getMessage()))


def test_the_reporter_raises_the_runs_error_after_writing(tmp_path: Path) -> None:
    files = RunFiles(tmp_path)
    error = JobFailed("rank 0 on host: exit 3", 3)
    end = RunEnd("failed", error, (Said("a line", logging.WARNING),), {"outcome": "failed"})
    lines = Lines()
    logging.getLogger("phalanx").addHandler(lines)
    try:
        with pytest.raises(JobFailed) as raised:
            Reporter(files, {}, None).finish(end)
    finally:
        logging.getLogger("phalanx").removeHandler(lines)
    files.close(time.monotonic() + 10)
    assert raised.value is error and end.exit_code == 3
    assert lines.said == [(logging.WARNING, "a line")]
    assert json.loads((tmp_path / REPORT_FILE).read_text()) == {"outcome": "failed"}
