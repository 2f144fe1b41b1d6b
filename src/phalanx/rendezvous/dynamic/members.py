"""Plain data of the join algorithm: what a node announces, who is in a round, and the pure
rule that gives node ranks."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from operator import attrgetter
from typing import Any

from phalanx.rendezvous.api import NodeInfo


@dataclass(frozen=True)
class Arrival:
    """What a node writes when it joins a round."""

    node_id: str
    hostname: str
    addr: str
    local_world_size: int
    prev_rank: int = -1  # its rank in the last round it was a member of (-1: none)
    prev_round: int = -1
    fixed_rank: int | None = None  # static rendezvous: the --node-rank given
    hosts_store: bool = False  # this node's agent serves the rendezvous store (c10d)
    # Its code and versions, as short strings (phalanx.consistency.fingerprint)
    fingerprint: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> Arrival:
        known = {k: v for k, v in body.items() if k in cls.__dataclass_fields__}
        # As the membership reads it back (``Membership.from_json``): strings to strings.
        known["fingerprint"] = _strings(known.get("fingerprint", {}))
        return cls(**known)


# The membership's lists of node facts: (its key in the JSON, ``NodeInfo``'s field), in the
# order of ``NodeInfo``'s fields.
_COLUMNS = (
    ("ranks", "node_rank"),
    ("hostnames", "hostname"),
    ("addrs", "addr"),
    ("local_world_sizes", "local_world_size"),
)


@dataclass(frozen=True)
class Membership:
    """Who is in round ``round``, ordered by node rank."""

    round: int
    restart_count: int
    node_ids: tuple[str, ...]
    nodes: tuple[NodeInfo, ...]
    fingerprints: tuple[dict[str, str], ...] = ()  # by node rank, as ``nodes``
    # Why the round before was abandoned (every member gone: ``abandoned``); "" it was not.
    abandoned: str = ""

    @property
    def count(self) -> int:
        return len(self.nodes)

    def to_json(self) -> dict[str, Any]:
        # A list per field (by node rank), not an object per node: every node reads the
        # membership each round, and at 1,024 nodes the lists are about half the bytes
        # (67 KB, not 120) and a third quicker to parse.
        return {
            "round": self.round,
            "restart_count": self.restart_count,
            "node_ids": list(self.node_ids),
            **{column: [getattr(node, field) for node in self.nodes] for column, field in _COLUMNS},
            "fingerprints": list(self.fingerprints),
            **({"abandoned": self.abandoned} if self.abandoned else {}),
        }

    @classmethod
    def from_json(cls, body: dict[str, Any], like: Membership | None = None) -> Membership:
        """The membership ``body`` holds. ``like``: one this node has (the round before):
        where ``body``'s lists are the same as its, its tuples are taken as they are. Every
        node reads every round's membership, and building a ``NodeInfo`` per node took most
        of a driver's CPU in a round of 1,024 (``benchmarks/store_load.py``); a restart
        round's members are mostly the last round's, in the same ranks."""
        if "nodes" in body:  # an object per node, as phalanx wrote it before the lists
            nodes = tuple(NodeInfo(**node) for node in body["nodes"])
        else:
            columns = [body[column] for column, _ in _COLUMNS]
            if len({len(body["node_ids"]), *map(len, columns)}) != 1:
                raise ValueError("the membership's lists differ in length")
            nodes = like.nodes if like is not None and like._same_nodes(columns) else ()
            nodes = nodes or tuple(map(NodeInfo, *columns))
        ids, prints = body["node_ids"], body.get("fingerprints", [])
        return cls(
            round=int(body["round"]),
            restart_count=int(body["restart_count"]),
            node_ids=like.node_ids
            if like is not None and list(like.node_ids) == ids
            else tuple(str(i) for i in ids),
            nodes=nodes,
            fingerprints=like.fingerprints
            if like is not None and list(like.fingerprints) == prints
            else tuple(map(_strings, prints)),
            abandoned=str(body.get("abandoned", "")),
        )

    def _same_nodes(self, columns: list[list[Any]]) -> bool:
        """Whether ``columns`` (as ``to_json`` writes them) hold exactly ``nodes``."""
        return len(columns[0]) == self.count and all(
            list(map(attrgetter(field), self.nodes)) == column
            for (_, field), column in zip(_COLUMNS, columns, strict=True)
        )


def assign_ranks(arrivals: Sequence[Arrival]) -> list[int]:
    """Node rank for each arrival (in arrival order); raises ``ValueError`` for bad fixed ranks.

    Static rendezvous: every node brings its rank, which must be 0..n-1, each once.
    Dynamic: a node keeps the rank it had in its last round when that rank still exists and
    nobody from a newer round holds it; the rest fill the free ranks in arrival order, the
    node serving the store first (so in a first round it is node 0, the host its endpoint
    names, however the nodes' starts raced).
    """
    n = len(arrivals)
    if any(a.fixed_rank is not None for a in arrivals):
        given = [a.fixed_rank for a in arrivals]
        problems = []
        if None in given:
            problems.append("some nodes gave --node-rank and some did not")
        ranks = [r for r in given if r is not None]
        for rank in sorted(set(ranks)):
            if not 0 <= rank < n:
                problems.append(f"--node-rank {rank} is outside 0..{n - 1} for {n} nodes")
            if ranks.count(rank) > 1:
                hosts = ", ".join(a.hostname for a in arrivals if a.fixed_rank == rank)
                problems.append(f"--node-rank {rank} was given to more than one node ({hosts})")
        if problems:
            raise ValueError("; ".join(problems))
        return [r for r in given if r is not None]
    result = [-1] * n
    taken: set[int] = set()
    for i in sorted(range(n), key=lambda i: (-arrivals[i].prev_round, i)):
        rank = arrivals[i].prev_rank
        if 0 <= rank < n and rank not in taken:
            result[i] = rank
            taken.add(rank)
    free = iter(sorted(set(range(n)) - taken))
    unranked = [i for i in range(n) if result[i] < 0]
    for i in sorted(unranked, key=lambda i: not arrivals[i].hosts_store):  # stable: arrival order
        result[i] = next(free)
    return result


def _strings(fingerprint: dict[Any, Any]) -> dict[str, str]:
    return {str(k): str(v) for k, v in fingerprint.items()}
