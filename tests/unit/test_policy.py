"""The restart policy (``phalanx.agent.policy.decide``) and its job-wide inputs (the round's
verdict, the failure signature): tables of round endings."""

from __future__ import annotations

import pytest

from phalanx.agent.crashloop import failure_signature
from phalanx.agent.policy import Step, decide, judged
from phalanx.rendezvous.api import EventKind, RoundVerdict

E = EventKind
TABLE = [
    # failed here, event, the job's verdict: same failure as the last one, progress anywhere
    (True, None, False, False, Step.RESTART),
    (True, None, True, True, Step.RESTART),  # the same failure, but training moved on
    (True, None, True, False, Step.CRASH_LOOP),
    (True, E.PEER_FAILED, True, False, Step.CRASH_LOOP),
    # A node whose workers did not fail reads the same verdict, so it takes the same step.
    (False, E.PEER_FAILED, True, False, Step.CRASH_LOOP),
    (False, E.PEER_FAILED, True, True, Step.RESTART),  # e.g. this node's checkpoint
    (False, E.PEER_FAILED, False, False, Step.RESTART),
    (False, E.NODE_LOST, False, False, Step.RESTART),
    (False, E.NODE_LOST, True, False, Step.CRASH_LOOP),
    (True, E.JOB_STOPPED, False, False, Step.RESTART),  # claim_restart then says no
    (True, E.NODE_WAITING, False, False, Step.RESTART),  # our failure is the story
    (False, E.NODE_WAITING, False, False, Step.REFORM),  # a scale-up spends nothing
    (False, E.JOB_STOPPED, False, False, Step.FAIL),
    (False, E.STORE_LOST, False, False, Step.FAIL),
    (False, None, False, False, Step.RESTART),
]


@pytest.mark.parametrize(("failed_here", "event", "repeated", "progressed", "step"), TABLE)
def test_decide(
    failed_here: bool, event: EventKind | None, repeated: bool, progressed: bool, step: Step
) -> None:
    assert (
        decide(failed_here=failed_here, event=event, repeated=repeated, progressed=progressed)
        is step
    )


@pytest.mark.parametrize(("failed_here", "event", "step"), [(f, e, s) for f, e, _, _, s in TABLE])
def test_only_rounds_to_restart_from_are_judged(
    failed_here: bool, event: EventKind | None, step: Step
) -> None:
    """A scale-up or a peer that ended the job needs no verdict; every other round does
    while a restart is left, and without one (both inputs False) it is a restart (which
    ``claim_restart`` refuses when the budget is spent)."""
    assert not judged(failed_here=failed_here, event=event, budget_left=False)
    needs = judged(failed_here=failed_here, event=event, budget_left=True)
    assert needs is (step not in (Step.REFORM, Step.FAIL))
    if needs:
        assert decide(failed_here=failed_here, event=event, repeated=False, progressed=False) is (
            Step.RESTART
        )


VERDICTS = [
    # verdict before (None: none), this round's failure, progressed -> repeated, latest
    (None, "rank 1, exit code 3: boom", False, False, "rank 1, exit code 3: boom"),
    (RoundVerdict("A"), "A", False, True, "A"),
    (RoundVerdict("A"), "A", True, True, "A"),  # repeated, but decide sees the progress
    (RoundVerdict("A"), "B", False, False, "B"),
    (RoundVerdict("A"), "", False, False, "A"),  # a lost node: the last failure carries on
    (RoundVerdict("", "A"), "A", False, True, "A"),  # ... and is compared with the next
    (RoundVerdict(""), "", False, False, ""),  # no failure is never a repeat
]


@pytest.mark.parametrize(("before", "failure", "progressed", "repeated", "latest"), VERDICTS)
def test_verdict_after(
    before: RoundVerdict | None, failure: str, progressed: bool, repeated: bool, latest: str
) -> None:
    verdict = RoundVerdict.after(before, failure, progressed)
    assert (verdict.repeated, verdict.latest, verdict.progressed) == (repeated, latest, progressed)
    assert RoundVerdict.from_json(verdict.to_json()) == verdict


@pytest.mark.parametrize(
    "body",
    [
        {"failure": 1, "previous": "", "progressed": False},
        {"failure": "", "previous": "", "progressed": "yes"},
        {"failure": ""},
    ],
)
def test_malformed_verdict_is_refused(body: dict[str, object]) -> None:
    with pytest.raises((KeyError, TypeError)):
        RoundVerdict.from_json(body)


def _record(rank: int, node: int, time: float, code: int, last: str, **more: object) -> dict:
    return {
        "rank": rank, "local_rank": 0, "host": f"h{node}", "pid": 10 + rank, "returncode": code,
        "time": time, "stopped_by_launcher": False, "stderr_tail": ["Traceback", last, ""],
        "node_rank": node, "round": 0, **more,
    }  # fmt: skip


SIGNATURES = [
    ([], ""),
    ([{"hang": {"ranks": []}}], ""),  # a node that only posted where its ranks were
    ([_record(1, 1, 5.0, 3, "ValueError: boom")], "rank 1, exit code 3: ValueError: boom"),
    # The job's root cause is the first the store recorded, whichever node posted it and
    # whatever the nodes' clocks say.
    (
        [_record(0, 0, 5.0, 1, "RuntimeError: Gloo", seq=2), _record(1, 1, 7.0, -9, "step 3", seq=1)],
        "rank 1, killed by SIGKILL: step 3",
    ),
    # Stopped by phalanx: not a failure of its own.
    ([_record(0, 0, 7.0, -15, "x", stopped_by_launcher=True)], ""),
]


@pytest.mark.parametrize(("records", "signature"), SIGNATURES)
def test_failure_signature_is_the_jobs_root_cause(records: list[dict], signature: str) -> None:
    assert failure_signature(records) == signature
