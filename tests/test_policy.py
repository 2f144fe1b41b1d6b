"""The restart policy (``phalanx.agent.policy.decide``): a table of round endings."""

from __future__ import annotations

import pytest

from phalanx.agent.policy import Step, decide
from phalanx.rendezvous.api import EventKind

E = EventKind
TABLE = [
    # failed here, event, same failure as last time, a checkpoint since -> step
    (True, None, False, False, Step.RESTART),
    (True, None, True, True, Step.RESTART),  # the same failure, but training moved on
    (True, None, True, False, Step.CRASH_LOOP),
    (True, E.PEER_FAILED, True, False, Step.CRASH_LOOP),  # our failure is the story
    (True, E.JOB_STOPPED, False, False, Step.RESTART),  # claim_restart then says no
    (False, E.PEER_FAILED, False, False, Step.RESTART),
    (False, E.NODE_LOST, False, False, Step.RESTART),
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
