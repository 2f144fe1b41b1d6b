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
ranks on the other nodes up to the wait later. The wait connects and closes (the store sees a
client come and go); a refused connection is retried every ``_POLL`` seconds.

How long: ``PHALANX_MASTER_WAIT`` seconds (``WAIT_ENV``, in the launcher's environment, which
the workers inherit), ``MASTER_WAIT`` by default; 0 turns the wait off. A bound, not a
measure of rank 0: its node may fork its ranks seconds after this one on a loaded host, and
torch's back-off costs at most about half a second after the store listens, so waiting
longer saves at most that, while a script that never listens pays the whole wait at every
start. Raise it where nodes start far apart (a slow shared filesystem under one of them, a
loaded host; the real-process test on the loaded test machine does), set 0 for a script
that never listens at ``MASTER_ADDR:MASTER_PORT``.
"""

from __future__ import annotations

import math
import socket
import time
from collections.abc import Mapping

WAIT_ENV = "PHALANX_MASTER_WAIT"
MASTER_WAIT = 1.0  # seconds: rank 0 of a warm restart listens within tens of milliseconds,
# under load within a few hundred
_POLL = 0.005


def master_wait(environ: Mapping[str, str]) -> float | None:
    """The wait ``environ`` asks for (``WAIT_ENV``; unset or empty: ``MASTER_WAIT``); None
    for anything but a number of seconds >= 0, which the agent refuses at start (worker-side
    code raises no phalanx error)."""
    text = environ.get(WAIT_ENV, "").strip()
    if not text:
        return MASTER_WAIT
    try:
        seconds = float(text)
    except ValueError:
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def await_master(environ: Mapping[str, str]) -> bool:
    """Wait at most ``master_wait(environ)`` seconds for rank 0's store, when this rank is one
    that connects to it from another node; True once it listens (False: not such a rank, not
    in time, or a wait the agent would have refused: the script runs as without it)."""
    where = _master(environ)
    if where is None:
        return False
    wait = master_wait(environ)
    if wait is None:
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
