"""Before a rank on another node than rank 0 runs its script: wait, briefly, until rank 0's
store listens on ``MASTER_ADDR:MASTER_PORT``.

Why: ``init_process_group(env://)`` makes rank 0 host the workers' ``TCPStore`` and every
other rank connect to it. A client that finds no listener backs off before it tries again,
and torch's back-off is long: a server 0.02 s late cost its client 0.44 s, 0.2 s late 0.72 s
(torch 2.13, measured on the test machine). After a restart every node forks its ranks at
the same moment, and rank 0 needs a few tens of milliseconds to reach its ``TCPStore``: the
ranks of the other nodes used to lose that race in most restarts (two-node restart: the
first collective took 0.29 to 0.73 s in 11 of 20, instead of 0.01 s). Ranks on rank 0's node
are forked after it and are left alone; so is a job on one node.

The cost: a script that never listens there (no ``env://`` store, its own port) starts its
ranks on the other nodes up to ``MASTER_WAIT`` later. The wait connects and closes (the
store sees a client come and go); a refused connection is retried every ``_POLL`` seconds.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Mapping

MASTER_WAIT = 1.0  # seconds: rank 0 of a warm restart listens within tens of milliseconds,
# under load within a few hundred
_POLL = 0.005


def await_master(environ: Mapping[str, str], wait: float = MASTER_WAIT) -> bool:
    """Wait at most ``wait`` seconds for rank 0's store, when this rank is one that connects
    to it from another node; True once it listens (False: not such a rank, or not in time)."""
    where = _master(environ)
    if where is None:
        return False
    deadline = time.monotonic() + wait
    while True:
        left = deadline - time.monotonic()
        try:
            with socket.create_connection(where, timeout=max(0.05, left)):
                return True
        except OSError:
            if left <= 0:
                return False
            time.sleep(min(_POLL, left))


def _master(environ: Mapping[str, str]) -> tuple[str, int] | None:
    """(MASTER_ADDR, MASTER_PORT) for a rank of a node other than node 0 of a multi-node job
    whose rank 0 hosts the store (``TORCHELASTIC_USE_AGENT_STORE=False``); None otherwise."""
    try:
        nodes = int(environ.get("GROUP_WORLD_SIZE", "1"))
        node = int(environ.get("GROUP_RANK", "0"))
        port = int(environ.get("MASTER_PORT", ""))
    except ValueError:
        return None
    addr = environ.get("MASTER_ADDR", "")
    if nodes < 2 or node == 0 or not addr or environ.get("TORCHELASTIC_USE_AGENT_STORE") != "False":
        return None
    return addr, port
