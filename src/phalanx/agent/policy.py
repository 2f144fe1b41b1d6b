"""What a node does after a round ended without success: a pure function, tested by tables.

The budget itself is job-wide and lives in the rendezvous (``claim_restart``): ``RESTART``
means "spend a restart if one is left", and the loop asks the rendezvous for it.
"""

from __future__ import annotations

from enum import Enum

from phalanx.rendezvous.api import EventKind


class Step(Enum):
    RESTART = "restart"  # spend one restart of the job's budget (or fail when none is left)
    REFORM = "reform"  # re-form the round without spending one (a node waits to join)
    FAIL = "fail"  # stop the job: report and exit with the root cause's code
    CRASH_LOOP = "crash loop"  # stop the job, saying that restarting would not help


# Events from other nodes that end the job however much budget is left.
FINAL_EVENTS = frozenset({EventKind.JOB_STOPPED, EventKind.STORE_LOST})


def decide(*, failed_here: bool, event: EventKind | None, repeated: bool, progressed: bool) -> Step:
    """``failed_here``: a worker of this node failed (it is then the round's story, whatever
    event came with it). ``repeated``: with the same failure as this node's last one.
    ``progressed``: a checkpoint was completed during the round. ``event``: what stopped the
    workers otherwise (a peer's failure, a lost node, a node waiting to join, ...)."""
    if failed_here:
        return Step.CRASH_LOOP if repeated and not progressed else Step.RESTART
    if event is EventKind.NODE_WAITING:
        return Step.REFORM
    if event in FINAL_EVENTS:
        return Step.FAIL
    return Step.RESTART
