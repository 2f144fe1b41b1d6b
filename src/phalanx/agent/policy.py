"""What a node does after a round ended without success: a pure function, tested by tables.

The budget itself is job-wide and lives in the rendezvous (``claim_restart``): ``RESTART``
means "spend a restart if one is left", and the loop asks the rendezvous for it. So is the
crash-loop evidence: ``repeated`` and ``progressed`` come from the job's verdict on the
round (``judge_round``), the same on every node, so every node takes the same step.
"""

from __future__ import annotations

from enum import Enum

from phalanx.rendezvous.api import EventKind


class Step(Enum):
    RESTART = "restart"  # spend one restart of the job's budget (or fail when none is left)
    REFORM = "reform"  # re-form the round without spending one (a node waits to join)
    FAIL = "fail"  # stop the job: report and exit with the root cause's code
    CRASH_LOOP = "crash loop"  # stop the job, saying that restarting would not help


# Events from other nodes that end the job however much budget is left: two of the events
# that end a round (``rendezvous.roundend.ENDS_ROUND``), after any of which the step is this
# policy's, whether the round's workers ran or it ended before they started.
FINAL_EVENTS = frozenset({EventKind.JOB_STOPPED, EventKind.STORE_LOST})


def _settled(failed_here: bool, event: EventKind | None) -> Step | None:
    """The step that needs no verdict: a scale-up, or a peer that ended the job. A failure
    of this node's workers is the round's story, whatever event came with it."""
    if failed_here:
        return None
    if event is EventKind.NODE_WAITING:
        return Step.REFORM
    if event in FINAL_EVENTS:
        return Step.FAIL
    return None


def judged(*, failed_here: bool, event: EventKind | None, budget_left: bool) -> bool:
    """Whether the job's verdict on the round is needed: it is one to restart from (a
    failure here or on a peer, a lost node; not a scale-up or the job's end) and the job
    has a restart left to spend (``restart_count``, the same on every node, is below
    ``--max-restarts``). Without one there is nothing to decide, and nothing to wait for."""
    return budget_left and _settled(failed_here, event) is None


def decide(*, failed_here: bool, event: EventKind | None, repeated: bool, progressed: bool) -> Step:
    """``failed_here``: a worker of this node failed. ``event``: what stopped the workers
    otherwise (a peer's failure, a lost node, a node waiting to join, ...). From the job's
    verdict (both False for a round that is not ``judged``): ``repeated``, the round's
    root-cause failure is the same as the previous failure's; ``progressed``, some node
    saw progress during the round (a checkpoint, a progress counter that moved)."""
    settled = _settled(failed_here, event)
    if settled is not None:
        return settled
    return Step.CRASH_LOOP if repeated and not progressed else Step.RESTART
