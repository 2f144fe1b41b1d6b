"""Which of a round's job events (``api.EventKind``) end it: one set for everything that
stops on them -- the exit barrier (``dynamic.barrier``), the node check
(``dynamic.exchange``), and the agent's loop (``agent.loop``), which forks no worker for a
round that one of them ended before its workers started."""

from __future__ import annotations

from phalanx.rendezvous.api import EventKind

# A peer's workers failed, a member was lost, the job stopped, the store was lost: the round
# is over whatever this node's workers do. The exit barrier stops waiting on them; the agent,
# hearing one before the round's workers start, takes the step it takes once they ran
# (``agent.policy``). Not a node waiting to join (the round re-forms once its workers ran, as
# it always did), nor a preemption (its own end: ``ENDS_CHECK``).
ENDS_ROUND = frozenset(
    {EventKind.PEER_FAILED, EventKind.NODE_LOST, EventKind.JOB_STOPPED, EventKind.STORE_LOST}
)

# What ends the node check: a round's end, and a preemption (no check, and no workers, for a
# job about to stop: the agent ends the run as preempted). A node waiting to join joins the
# next round: the check goes on.
ENDS_CHECK = ENDS_ROUND | {EventKind.PREEMPTED}
