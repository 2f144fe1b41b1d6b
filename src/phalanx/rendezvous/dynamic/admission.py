"""A node that comes to a running job is compared with it before the job hears of it.

The same-code check (``phalanx.consistency``) runs once a round has formed, on every member,
and stops them all: right for nodes started together, wrong for a stranger that arrives
while a round runs -- an unrelated launch that reused the endpoint and the ``--rdzv-id``,
or a node with a stale checkout (script arguments are not compared: a node with its own
joins, as under torchrun, and the round names them). Its arrival alone would make the
running nodes stop their workers to let it in (``NODE_WAITING``), and the check would then stop the whole job. So a
node that is not a member yet first reads the members of the last round that formed and
compares its fingerprint with theirs; if they differ it leaves at once (``MismatchError``,
exit 2) without writing anything, and the running job never knows it came.
"""

from __future__ import annotations

from collections.abc import Mapping

from phalanx.consistency.compare import UNKNOWN, differing_fields
from phalanx.consistency.fingerprint import MISSING, VERSION_FIELDS
from phalanx.errors import MismatchError
from phalanx.rendezvous.dynamic.board import Board
from phalanx.rendezvous.dynamic.members import Membership
from phalanx.rendezvous.dynamic.records import parsed


def check_admission(board: Board, t: int, fingerprint: Mapping[str, str]) -> None:
    """Raise ``MismatchError`` when this node's ``fingerprint`` differs from the members' of
    round ``t - 1`` in a field where they agree among themselves (nothing to compare before
    round 0 forms, or with an empty fingerprint)."""
    if t <= 0 or not fingerprint:
        return
    key = board.keys.round(t - 1, "members")
    body = board.get_json(key)
    if body is None or "fail" in body:
        return
    members = parsed(key, body, Membership.from_json)
    theirs = [fp for fp in members.fingerprints if fp]
    if not theirs:
        return
    agreed = set(differing_fields(theirs))
    fields = [f for f in differing_fields([*theirs, fingerprint]) if f not in agreed]
    if not fields:
        return
    node = members.nodes[0]
    first = next(fp for fp in members.fingerprints if fp)
    absent = {f: UNKNOWN if f in VERSION_FIELDS else MISSING for f in fields}
    shown = "; ".join(
        f"{f}: here {fingerprint.get(f, absent[f])}, there {first.get(f, absent[f])}"
        for f in fields
    )
    raise MismatchError(
        f"rendezvous {board.keys.run_id!r}: not joining the running job (round {t - 1}, "
        f"{members.count} node(s), node 0 on {node.hostname} {node.addr}): this node differs "
        f"in {shown}; another job on the same endpoint and --rdzv-id? give this one its own "
        "--rdzv-id (to join anyway: --allow-mismatch)"
    )
