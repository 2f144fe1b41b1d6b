"""One node check: this node's probes, the records of every node through the round's store,
the links tested in a ring, the same verdict on every node.

Order, so that no probe disturbs another: once every node has said it is ``ready`` (so
they all probe at the same time, alike in what they share), the compute probe (an agent
measures it once: at its first check, or before it joins a running job; later checks reuse
that figure, ``agent.checking.CheckedNodes``) and the local checks; then the ``hello`` record (this node's check port and token); once every node's hello is in, each
node tests its link to the next node of the ring while answering the one before it; then
the ``result`` record; once every result is in (or ``RESULT_TIMEOUT`` passed), the verdict.
A node whose record is missing is named as not answering. Cost on an idle machine: the
compute probe (about 0.15 s of one core), three store writes and three waits per node, one link
test (a few ms on a fast network; ``LINK_DEADLINE`` at most).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from phalanx.nodecheck.link import Listener, test_link
from phalanx.nodecheck.probes import LocalFacts, compute_probe, directory_problem
from phalanx.nodecheck.settings import CheckSettings
from phalanx.nodecheck.verdict import Verdict, judge
from phalanx.rendezvous.api import CheckExchange, RendezvousResult
from phalanx.worker.slowio import Answers

log = logging.getLogger("phalanx")

HELLO_TIMEOUT = 60.0  # a slow node's compute probe (a node at a tenth of a core: seconds)
RESULT_TIMEOUT = 30.0  # after the hellos: one link test each, then one write
DIRECTORY_WAIT = 2.0  # a small write into the run directory (local disk: milliseconds)
STOP_CHECK = 1.0  # s: how often a wait for the other nodes' records asks whether to stop
_PROBES: Answers[str] = Answers("phalanx-check-dir")
# The ready record of a node that checks, of one that runs with --node-check off, and of one
# that was checked in an earlier round (``agent.checking.CheckedNodes``)
READY, OFF, SAME = b"1", b"off", b"same"
# Why no node checks: one OFF record skips it for all; SAME records, only from every node
SKIPPED_BY = {
    OFF: "a node runs with --node-check off",
    SAME: "each node was checked in an earlier round",
}


@dataclass(frozen=True)
class Skipped:
    """No node checked this round (every node skips it alike), and why."""

    reason: str

    @property
    def same(self) -> bool:
        """Skipped since every node of the round was checked in an earlier round."""
        return self.reason == SKIPPED_BY[SAME]


def check_round(
    exchange: CheckExchange,
    joined: RendezvousResult,
    settings: CheckSettings,
    run_dir: Path,
    nproc_per_node: int,
    ready: bytes = READY,
    stop: Callable[[], None] = lambda: None,
    probe: Callable[[], LocalFacts] | None = None,
) -> Verdict | Skipped:
    """Run the node check with the other nodes of ``joined``; every node gets the same
    verdict (from the same records). ``ready``: this node's ready record (``SAME``: it was
    checked before). ``Skipped`` when a node runs with the check off (it would never
    answer), or every node was checked before: then no node checks. ``stop``: called while
    this node waits for the others' records (about once a second); it raises
    ``RendezvousError`` to end the check now, as a lost store does (the agent's: a
    preemption signal to this node). ``probe``: this node's compute figure (a fresh copy
    each call; the agent's is measured once per agent: ``agent.checking.CheckedNodes``);
    by default the compute probe, run here."""
    ranks = [node.node_rank for node in joined.nodes]
    hosts = [(n.hostname, n.addr) for n in sorted(joined.nodes, key=lambda n: n.node_rank)]
    exchange.post_check("ready", ready)  # every node probes at once: alike, whatever is shared
    readies = _gather(exchange, "ready", ranks, HELLO_TIMEOUT, stop)
    if OFF in readies.values():
        return Skipped(SKIPPED_BY[OFF])
    if len(readies) == len(ranks) and set(readies.values()) == {SAME}:
        return Skipped(SKIPPED_BY[SAME])
    facts = probe() if probe is not None else compute_probe(nproc_per_node) or LocalFacts()
    limits = settings.thresholds
    for path, what in ((run_dir, "the run directory"), (settings.checkpoint_dir, "the checkpoint directory")):  # fmt: skip
        problem = _bounded_probe(path, what, limits.min_free_mb) if path else None
        if problem is not None:
            facts.problems.append(problem)
    token = os.urandom(16)
    listener = Listener(joined.this_node.addr, token)
    try:
        hello = {"addr": joined.this_node.addr, "port": listener.port, "token": token.hex()}
        exchange.post_check("hello", _encode(hello))
        successor = (joined.node_rank + 1) % joined.num_nodes
        hellos = _gather(exchange, "hello", [successor], HELLO_TIMEOUT, stop)
        link = _test(hellos.get(successor))
        record: dict[str, Any] = {
            "host": joined.this_node.hostname or socket.gethostname(),
            "device": facts.device,
            "compute": facts.compute,
            "problems": facts.problems,
            "link": link,
        }
        exchange.post_check("result", _encode(record))
        results = _gather(exchange, "result", ranks, RESULT_TIMEOUT, stop)
    finally:
        listener.close()
    records = {rank: data for rank, raw in results.items() if (data := _decode(raw)) is not None}
    return judge(hosts, records, limits)


def _gather(
    exchange: CheckExchange,
    phase: str,
    node_ranks: Sequence[int],
    timeout: float,
    stop: Callable[[], None],
) -> dict[int, bytes]:
    """``gather_check`` in slices of ``STOP_CHECK``, calling ``stop`` before each: a node
    told to stop (a preemption signal to its agent) ends its check within a second, not at
    the end of a minute-long wait for a node that is itself held up; the others then hear
    the preemption through the store and end theirs (``roundend.ENDS_CHECK``)."""
    deadline = time.monotonic() + timeout
    while True:
        stop()
        left = deadline - time.monotonic()
        found = exchange.gather_check(phase, node_ranks, max(0.0, min(left, STOP_CHECK)))
        if len(found) == len(node_ranks) or left <= STOP_CHECK:
            return found


def _test(raw: bytes | None) -> dict[str, object] | None:
    """This node's link to the next node, from that node's hello (None: it sent none)."""
    hello = _decode(raw) if raw is not None else None
    if hello is None:
        return None
    try:
        addr, port, token = str(hello["addr"]), int(hello["port"]), bytes.fromhex(hello["token"])
    except (KeyError, TypeError, ValueError):
        return None
    return test_link(addr, port, token).to_json()


def _encode(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj).encode()


def _decode(raw: bytes) -> dict[str, Any] | None:
    try:
        data = json.loads(raw)
    except ValueError:
        log.warning("node check: a malformed record in the store (ignored)")
        return None
    return data if isinstance(data, dict) else None


def _bounded_probe(path: Path, what: str, min_free_mb: float) -> str | None:
    """``directory_problem``, waiting at most ``DIRECTORY_WAIT`` for the filesystem: one
    that answers slower (a struggling NFS) is named as the problem, and the check goes on."""
    found = _PROBES.ask(
        object(), lambda: directory_problem(path, what, min_free_mb) or "", DIRECTORY_WAIT,
        stale=False,
    )  # fmt: skip
    if found is None:
        return f"{what} {path} did not answer a small write within {DIRECTORY_WAIT:g} s"
    return found or None
