"""Step 3 of forming a round (``formation``): its membership and its workers' master port.

Slot 1 reads the n arrivals (with the membership, if another node wrote it, and the last
round's restart claim: one round trip), assigns node ranks and writes ``members``: a
deterministic result, so any node can redo it if slot 1 died (the first write wins). Node rank 0 picks a
free port on its host and publishes ``master``. The others wait for each key and read it in
the wait's round trip where the store can (``BatchedStore.wait_get``): one call each. When
slot 1 is node rank 0 itself (a first round's first arrival, unless another node hosts the
store), it publishes ``master`` just before ``members``, and the others read both in the
membership's round trip: the master no longer waits until node 0 has read the membership
like every other node, and no node waits for it (a call and a wake-up fewer per node).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from phalanx.errors import RendezvousError
from phalanx.rendezvous.api import NodeInfo
from phalanx.rendezvous.dynamic.board import Board, claim_of
from phalanx.rendezvous.dynamic.members import Arrival, Membership, assign_ranks
from phalanx.rendezvous.dynamic.records import decode, parsed
from phalanx.rendezvous.settings import RendezvousSettings
from phalanx.resources.ports import free_port


def members_of(
    board: Board,
    settings: RendezvousSettings,
    t: int,
    count: int,
    slot: int,
    prior: Membership | None = None,
    worker_port: int | None = None,
) -> tuple[Membership, dict[str, Any] | None]:
    """Round t's membership (closed with ``count`` arrivals), as the node in ``slot`` gets it,
    and its ``master`` record when it came with it (None: ``master_of`` gets it). ``prior``:
    the round before, if this node was in it (what did not change is taken from it rather
    than built again: ``Membership.from_json``)."""
    key, master_key = board.keys.round(t, "members"), board.keys.round(t, "master")
    master: dict[str, Any] | None = None
    read: _Read | None = None
    if slot == 1:  # the membership (written already if slot 1 was slow), the arrivals, the claim
        read = _read(board, settings, t, count)
        found = read.members
    else:  # (returns at once if it is written already)
        _, (data, published) = board.wait_get([key], settings.close_timeout, [key, master_key])
        found = None if data is None else decode(data, key)
        master = None if published is None else decode(published, master_key)
    if found is None:  # slot 1 (or, if it died, everyone) assembles: same result for all
        read = read or _read(board, settings, t, count)
        found, mine, master = _assemble(board, t, read, prior, worker_port)
        prior = mine or prior  # (what it proposed is what it reads back, unless it lost)
    if "fail" in found:
        raise RendezvousError(f"round {t}: {found['fail']}")
    return parsed(key, found, lambda body: Membership.from_json(body, like=prior)), master


@dataclass(frozen=True)
class _Read:
    """What assembling round t takes from the store, read in one round trip: its membership
    (None: nobody wrote it yet), its arrivals in slot order, and the restart claimed after
    round t-1 (``Board.claimed_restart``'s answer; (False, "") for round 0)."""

    members: dict[str, Any] | None
    arrivals: list[Arrival]
    claimed: tuple[bool, str]


def _read(board: Board, settings: RendezvousSettings, t: int, count: int) -> _Read:
    """Wait for round t's ``count`` arrivals and read them, the membership and the last
    round's claim behind the wait: one round trip on a ``BatchedStore`` (slot 1 read the
    membership, then the arrivals, then the claim: three on etcd's critical path)."""
    keys = [board.keys.node(t, s) for s in range(1, count + 1)]
    members, claim = board.keys.round(t, "members"), board.keys.round(t - 1, "claim")
    extra = [members, claim] if t > 0 else [members]
    announced, values = board.wait_get(keys, settings.close_timeout, [*keys, *extra])
    found = None if (data := values[count]) is None else decode(data, members)
    claimed = (False, "")
    if t > 0 and (body := values[count + 1]) is not None:
        claimed = parsed(claim, decode(body, claim), claim_of)
    if found is not None:  # assembled already: the arrivals are not needed (maybe swept)
        return _Read(found, [], claimed)
    if not announced:
        missing = [s for s, data in enumerate(values[:count], 1) if data is None]
        raise RendezvousError(
            f"round {t} closed with {count} nodes, but the node(s) in slot(s) {missing} "
            f"never announced themselves within close_timeout={settings.close_timeout:g}s"
        )
    arrivals = []
    for k, data in zip(keys, values[:count], strict=True):
        if data is None:
            raise RendezvousError(f"round {t}: arrival {k!r} vanished from the store")
        arrivals.append(parsed(k, decode(data, k), Arrival.from_json))
    return _Read(None, arrivals, claimed)


def _assemble(
    board: Board,
    t: int,
    read: _Read,
    prior: Membership | None,
    worker_port: int | None,
) -> tuple[dict[str, Any], Membership | None, dict[str, Any] | None]:
    """Write round t's membership unless another node did first: (what the key holds, the
    membership this node proposed (None: a failure), the master record if this node is
    node rank 0 and published it)."""
    if read.members is not None:
        return read.members, None, None
    arrivals, count = read.arrivals, len(read.arrivals)
    restarts, abandoned = 0, ""
    if t > 0:
        restarts = _restarts_before(board, t, prior)
        claimed, abandoned = read.claimed
        restarts += int(claimed)
    try:
        ranks = assign_ranks(arrivals)
    except ValueError as exc:
        return board.put_first(board.keys.round(t, "members"), {"fail": str(exc)}), None, None
    order = sorted(range(count), key=lambda i: ranks[i])
    membership = Membership(
        round=t,
        restart_count=restarts,
        node_ids=tuple(arrivals[i].node_id for i in order),
        nodes=tuple(
            NodeInfo(ranks[i], arrivals[i].hostname, arrivals[i].addr, arrivals[i].local_world_size)
            for i in order
        ),
        fingerprints=tuple(arrivals[i].fingerprint for i in order),
        abandoned=abandoned,
    )
    # Node 0's master before the membership: whoever reads the one finds the other.
    master = (
        _publish(board, membership, worker_port)
        if membership.node_ids[0] == board.node_id
        else None
    )
    # put_first adds the writer's id; the membership itself is the same from any writer.
    found = board.put_first(board.keys.round(t, "members"), membership.to_json())
    return found, membership, master


def _restarts_before(board: Board, t: int, prior: Membership | None) -> int:
    """Round t-1's restart count: from ``prior`` when it is that round (a member's rejoin:
    no read of a membership of a thousand nodes on the round's critical path)."""
    if prior is not None and prior.round == t - 1:
        return prior.restart_count
    before = board.keys.round(t - 1, "members")
    previous = board.get_json(before)
    return parsed(before, previous, lambda b: int(b["restart_count"])) if previous else 0


def master_of(
    board: Board,
    settings: RendezvousSettings,
    membership: Membership,
    rank: int,
    worker_port: int | None,
    known: dict[str, Any] | None = None,
) -> tuple[str, int]:
    """The workers' master address and port of the round (node ``rank`` 0 picks the port:
    ``worker_port``, or a free one on its host). ``known``: the record, read already."""
    key = board.keys.round(membership.round, "master")
    if known is not None:
        found = known
    elif rank == 0:
        found = _publish(board, membership, worker_port)
    else:
        published, (data,) = board.wait_get([key], settings.close_timeout, [key])
        if not published:
            raise RendezvousError(
                f"round {membership.round}: node 0 ({membership.nodes[0].hostname}) did not "
                f"publish the master port within close_timeout={settings.close_timeout:g}s"
            )
        found = {} if data is None else decode(data, key)
    return parsed(key, found, lambda b: (str(b["addr"]), int(b["port"])))


def _publish(board: Board, membership: Membership, worker_port: int | None) -> dict[str, Any]:
    """As node rank 0 of ``membership``: pick the port, publish the master; what won."""
    addr = membership.nodes[0].addr
    port = worker_port or free_port("::" if ":" in addr else "")
    return board.put_first(
        board.keys.round(membership.round, "master"), {"addr": addr, "port": port}
    )
