"""Stacks on request across every node of a round: asked on one node, answered by all, written
as one file on the node that asked.

``phalanx stacks`` on any node (``STACK_SIGNAL`` to its agent) has that node's watch call
``JobStacks.request``, which numbers a request through the rendezvous. On every supervisor
tick each node's watch asks ``unanswered()`` (no network: the rendezvous heartbeat thread
reads the request count), dumps its ranks once for whatever is new, and ``answer``s: a
peer's request by posting the text to the store (one write), its own by starting a helper
thread that waits for the other nodes' answers -- at most ``PEER_DUMP_WAIT`` -- and writes
one ``<run dir>/stacks_<time>.txt``: this node first, then the others by node rank, each under
a ``##### node <rank> (<host>) #####`` header, and a line naming the nodes that did not answer.
A tick never waits for another node.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from phalanx.errors import RendezvousError
from phalanx.hang.files import write_stacks_file
from phalanx.hang.stacks import PEER_DUMP_WAIT
from phalanx.rendezvous.api import RendezvousResult, StackExchange

log = logging.getLogger("phalanx")

# Requests answered with one dump when several arrived together; older ones are dropped
# (their askers have stopped waiting). A node's own requests are always answered.
ANSWER_AT_MOST = 8


class JobStacks:
    """One round's side of job-wide stacks requests, for a round of more than one node.

    Called from the agent's thread only; the gather threads it starts read only what never
    changes (the round, the run directory)."""

    def __init__(
        self,
        rdzv: StackExchange,
        joined: RendezvousResult,
        run_dir: Path,
        *,
        timeout: float = PEER_DUMP_WAIT,  # a peer notices within a heartbeat, then dumps
    ) -> None:
        self._rdzv = rdzv
        self._joined = joined
        self._run_dir = run_dir
        self._timeout = timeout
        self._answered = 0  # the newest request this node answered
        self._mine: set[int] = set()

    def request(self) -> bool:
        """Ask every node for its ranks' stacks; this node answers in its next ``answer``.
        False when the others cannot be asked: the caller then writes this node's alone."""
        try:
            self._mine.add(self._rdzv.request_stacks())
        except RendezvousError as exc:
            log.warning("stacks: cannot ask the other nodes (%s); writing this node's only", exc)
            return False
        return True

    def unanswered(self) -> list[int]:
        """The requests of this round, from any node, this node has not answered yet."""
        newest = self._rdzv.stack_requests()
        oldest = newest - ANSWER_AT_MOST + 1
        return [
            request
            for request in range(self._answered + 1, newest + 1)
            if request >= oldest or request in self._mine
        ]

    def answer(self, requests: Sequence[int], text: str) -> None:
        """Answer ``requests`` (from ``unanswered``) with this node's stacks ``text``."""
        if not requests:
            return
        for request in requests:
            if request in self._mine:
                threading.Thread(
                    target=self._gather,
                    args=(request, text),
                    name=f"phalanx-stacks-{request}",
                    daemon=True,  # a job that ends meanwhile does not wait for it
                ).start()
            else:
                self._rdzv.post_stacks(request, text)
        self._answered = max(self._answered, *requests)
        peers = [r for r in requests if r not in self._mine]
        if peers:
            log.info("stacks of this node sent to the node that asked (request %d)", peers[-1])

    def _gather(self, request: int, text: str) -> None:
        joined = self._joined
        others = [n.node_rank for n in joined.nodes if n.node_rank != joined.node_rank]
        answers = self._rdzv.gather_stacks(joined.round, request, others, self._timeout)
        try:
            path = write_stacks_file(self._run_dir, combine(joined, text, answers, self._timeout))
        except OSError as exc:
            log.warning("stacks: cannot write the stacks file in %s: %s", self._run_dir, exc)
            return
        log.info(
            "stacks of %d of %d node(s) written to %s", len(answers) + 1, len(joined.nodes), path
        )


def combine(
    joined: RendezvousResult,
    own: str,
    answers: Mapping[int, str],
    timeout: float,
    at: str | None = None,
) -> str:
    """One file's text: this node's stacks ``own``, then every other node's in ``answers``
    (by node rank), each headed with its node rank and host; nodes missing are named."""
    me = joined.this_node
    others = [node for node in joined.nodes if node.node_rank != me.node_rank]
    missing = [node for node in others if node.node_rank not in answers]
    lines = [
        f"stacks of {joined.num_nodes - len(missing)} of {joined.num_nodes} node(s), "
        f"requested on {me.hostname} (node {me.node_rank}) at {at or time.ctime()}"
    ]
    if missing:
        names = ", ".join(f"node {node.node_rank} ({node.hostname})" for node in missing)
        lines.append(f"no answer within {timeout:g} s from: {names}")
    sections = [(me, own)]
    sections += [(node, answers[node.node_rank]) for node in others if node.node_rank in answers]
    for node, text in sections:
        lines += ["", f"##### node {node.node_rank} ({node.hostname}) #####", text.rstrip("\n")]
    return "\n".join(lines) + "\n"
