"""Step 3 of forming a round (``formation``): its membership and its workers' master port.

Slot 1 reads the n arrivals, assigns node ranks and writes ``members``: a deterministic
result, so any node can redo it if slot 1 died (the first write wins). Node rank 0 picks a
free port on its host and publishes ``master``. The others wait for each key and read it in
the wait's round trip where the store can (``BatchedStore.wait_get``): one call each.
"""

from __future__ import annotations

from phalanx.errors import RendezvousError
from phalanx.rendezvous.api import NodeInfo
from phalanx.rendezvous.dynamic.board import Board, decode, parsed
from phalanx.rendezvous.dynamic.members import Arrival, Membership, assign_ranks
from phalanx.rendezvous.settings import RendezvousSettings
from phalanx.resources.ports import free_port


def members_of(
    board: Board, settings: RendezvousSettings, t: int, count: int, slot: int
) -> Membership:
    """Round t's membership (closed with ``count`` arrivals), as the node in ``slot`` gets it."""
    key = board.keys.round(t, "members")
    if slot == 1:
        found = board.get_json(key)
    else:  # (returns at once if it is written already)
        _, (data,) = board.wait_get([key], settings.close_timeout, [key])
        found = None if data is None else decode(data, key)
    if found is None:  # slot 1 (or, if it died, everyone) assembles: same result for all
        found = _assemble(board, settings, t, count)
    if "fail" in found:
        raise RendezvousError(f"round {t}: {found['fail']}")
    return parsed(key, found, Membership.from_json)


def _assemble(board: Board, settings: RendezvousSettings, t: int, count: int) -> dict[str, object]:
    keys = [board.keys.node(t, s) for s in range(1, count + 1)]
    announced, values = board.wait_get(keys, settings.close_timeout, keys)
    if not announced:
        missing = [s for s, data in enumerate(values, 1) if data is None]
        raise RendezvousError(
            f"round {t} closed with {count} nodes, but the node(s) in slot(s) {missing} "
            f"never announced themselves within close_timeout={settings.close_timeout:g}s"
        )
    arrivals = []
    for k, data in zip(keys, values, strict=True):
        if data is None:
            raise RendezvousError(f"round {t}: arrival {k!r} vanished from the store")
        arrivals.append(parsed(k, decode(data, k), Arrival.from_json))
    restarts, abandoned = 0, ""
    if t > 0:
        before = board.keys.round(t - 1, "members")
        previous = board.get_json(before)
        restarts = parsed(before, previous, lambda b: int(b["restart_count"])) if previous else 0
        claimed, abandoned = board.claimed_restart(t - 1)
        restarts += int(claimed)
    try:
        ranks = assign_ranks(arrivals)
    except ValueError as exc:
        return board.put_first(board.keys.round(t, "members"), {"fail": str(exc)})
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
    # put_first adds the writer's id; the membership itself is the same from any writer.
    return board.put_first(board.keys.round(t, "members"), membership.to_json())


def master_of(
    board: Board,
    settings: RendezvousSettings,
    membership: Membership,
    rank: int,
    worker_port: int | None,
) -> tuple[str, int]:
    """The workers' master address and port of the round (node ``rank`` 0 picks the port:
    ``worker_port``, or a free one on its host)."""
    key = board.keys.round(membership.round, "master")
    if rank == 0:
        addr = membership.nodes[0].addr
        port = worker_port or free_port("::" if ":" in addr else "")
        found = board.put_first(key, {"addr": addr, "port": port})
    else:
        published, (data,) = board.wait_get([key], settings.close_timeout, [key])
        if not published:
            raise RendezvousError(
                f"round {membership.round}: node 0 ({membership.nodes[0].hostname}) did not "
                f"publish the master port within close_timeout={settings.close_timeout:g}s"
            )
        found = {} if data is None else decode(data, key)
    return parsed(key, found, lambda b: (str(b["addr"]), int(b["port"])))
