"""The job-wide verdict on a round that ended in failure (``RendezvousHandler.judge_round``).

Why the store: a node judging alone sees only its own evidence. A node whose ranks never
save a checkpoint would call a healthy job a crash loop, and each node's "same failure as
last time" would be about its own ranks only. So every member posts whether it saw
progress, the first node that sees every member accounted for writes the verdict, and
everyone reads that one (``put_first``, as the restart claim).

Store operations: per node, two ``add``s, one read of the verdict and the counts per
``event_interval`` while it waits, and one ``put_first``; only the nodes that race to write
the verdict read the round's failure records (the others find it written). A member is
accounted for once it has judged (``judged``) or its fate in the round is settled
(``settled``: it rejoined the next round after a scale-up, finished, gave up, or was found
lost by the heartbeats). A member that judged may settle later too; it does so only after
its own wait ended, so the sum can over-count only once someone already saw it complete.
"""

from __future__ import annotations

import logging
import time

from phalanx.rendezvous.api import RoundVerdict, Signature
from phalanx.rendezvous.dynamic.board import Board
from phalanx.rendezvous.dynamic.members import Membership
from phalanx.rendezvous.dynamic.records import count_in, decode, parsed
from phalanx.rendezvous.settings import RendezvousSettings

log = logging.getLogger("phalanx")


def judge(
    board: Board,
    membership: Membership,
    progressed: bool,
    signature: Signature,
    settings: RendezvousSettings,
) -> RoundVerdict:
    """Post this member's evidence on round ``membership.round``, wait until every member
    is accounted for (at most ``join_timeout``: then judge with what is there), and return
    the verdict that won. Store errors propagate (``StoreUnavailable``)."""
    r, count = membership.round, membership.count
    keys = board.keys
    judged = board.post_progress(r, progressed)
    deadline = time.monotonic() + settings.join_timeout
    # The verdict and the counts it waits on, read together (one round trip on a
    # BatchedStore, also after each wait: ``wait_get``), not one request each.
    reads = [keys.round(r, "verdict"), keys.round(r, "settled"), keys.round(r, "judged")]
    state = board.get_many(reads[:2])
    while (found := _verdict(reads[0], state[0])) is None:
        if judged + count_in(reads[1], state[1]) >= count:
            break
        left = deadline - time.monotonic()
        if left <= 0:
            log.warning(
                "rendezvous: %d of %d nodes judged round %d within join_timeout=%gs; "
                "judging it with what they posted",
                judged, count, r, settings.join_timeout,
            )  # fmt: skip
            break
        _, state = board.wait_get(reads[:1], min(left, settings.event_interval), reads)
        judged = count_in(reads[2], state[2])
    if found is not None:
        return found
    records = [f for f in board.failures() if f.get("round") == r]
    anyone = board.counter(keys.round(r, "progressed")) > 0
    before = board.verdict(r - 1) if r > 0 else None
    proposal = RoundVerdict.after(before, signature(records), anyone)
    return board.propose_verdict(r, proposal)


def _verdict(key: str, data: bytes | None) -> RoundVerdict | None:
    """``Board.verdict`` from the key's value as read."""
    return None if data is None else parsed(key, decode(data, key), RoundVerdict.from_json)
