"""A round of three members as the failover and majority unit tests publish it on an
in-memory store (``support.memory_store``): node ids h (the store's host), a and b."""

from __future__ import annotations

from phalanx.rendezvous.api import NodeInfo
from phalanx.rendezvous.dynamic.keys import Keys
from phalanx.rendezvous.dynamic.members import Membership

KEYS = Keys("job")
ROUND = Membership(
    round=4,
    restart_count=2,
    node_ids=("h", "a", "b"),
    nodes=tuple(NodeInfo(r, f"n{r}", f"10.0.0.{r + 1}", 1) for r in range(3)),
)
