"""Status on request across every node of a round: asked on one node, answered by all,
written into the run directory of the node that asked.

``phalanx status`` leaves a request file (``files.new_request``); the agent notices it on its
tick (one ``scandir`` a second) and, for a round of more than one node, numbers a request
through the rendezvous (``StatusExchange.request_status``: one store write). Every other
node sees the number grow at its next heartbeat (one read per heartbeat, no matter how
many nodes) and posts one answer: its status and its events since the agent started,
capped at ``ANSWER_LIMIT`` (``cap_events``: the oldest progress samples go first, then the
oldest other events; the answer says how many were dropped). A helper thread of the asking
node waits for the answers (at most ``GATHER_WAIT``), writes ``nodes/<rank>/status.json``
and ``nodes/<rank>/events.jsonl`` for each, then the answer file naming who answered.
The agent's tick never waits for another node, nor for the disk.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from phalanx.errors import RendezvousError
from phalanx.events.log import EVENTS_FILE
from phalanx.rendezvous.api import RendezvousResult, StatusExchange
from phalanx.status import files
from phalanx.worker.nofollow import replace_file

log = logging.getLogger("phalanx")

# One node's answer, at most: etcd rejects a request over 1.5 MiB, and the asker reads each
# node's answer with a read of its own.
ANSWER_LIMIT = 512 * 1024
GATHER_WAIT = 5.0  # seconds the asker waits: a peer notices within a heartbeat (1 s default)
ANSWER_AT_MOST = 4  # peers' requests answered with one post when several arrived together


def cap_events(lines: Sequence[bytes], limit: int) -> tuple[list[bytes], int]:
    """Whole lines of ``lines`` (in their order) of at most ``limit`` bytes in all, and how
    many were dropped: the oldest ``progress`` samples first, then the oldest of the rest."""
    total = sum(len(line) for line in lines)
    if total <= limit:
        return list(lines), 0
    progress = [i for i, line in enumerate(lines) if b'"kind": "progress"' in line]
    others = [i for i, line in enumerate(lines) if b'"kind": "progress"' not in line]
    dropped: set[int] = set()
    for i in progress + others:
        if total <= limit:
            break
        dropped.add(i)
        total -= len(lines[i])
    return [line for i, line in enumerate(lines) if i not in dropped], len(dropped)


def encode_answer(status: dict[str, Any], lines: Sequence[bytes], dropped: int = 0) -> bytes:
    """One node's answer: a header line (its status, how many events were dropped), then
    its events as in ``events.jsonl``, capped to ``ANSWER_LIMIT`` in all."""

    def header(n: int) -> bytes:
        return json.dumps({"status": status, "events_dropped": n}, default=str).encode() + b"\n"

    kept, cut = cap_events(lines, max(0, ANSWER_LIMIT - len(header(len(lines) + dropped))))
    return header(dropped + cut) + b"".join(kept)


def decode_answer(data: bytes) -> tuple[dict[str, Any], bytes, int] | None:
    """(status, events.jsonl bytes, events dropped) of an answer; None if malformed."""
    first, _, events = data.partition(b"\n")
    try:
        head = json.loads(first)
    except ValueError:
        return None
    if not isinstance(head, dict) or not isinstance(head.get("status"), dict):
        return None
    dropped = head.get("events_dropped")
    return head["status"], events, dropped if isinstance(dropped, int) else 0


class StatusRequests:
    """The status requests of one agent run: from this node's ``phalanx status`` (request
    files) and from the other nodes (through the store). Called from the agent's thread."""

    def __init__(
        self,
        run_dir: Path,
        answer: Callable[[], bytes],
        snapshot: Callable[[], dict[str, Any]],
    ) -> None:
        """``answer``: this node's answer as posted to others (``encode_answer``);
        ``snapshot``: this node's status now."""
        self._run_dir = run_dir
        self._answer = answer
        self._snapshot = snapshot
        self._seen: set[str] = set()  # request files handled
        self._joined: RendezvousResult | None = None
        self._exchange: StatusExchange | None = None
        self._answered = 0  # the newest peer request of this round answered
        self._mine: set[int] = set()
        self._scanner = _Scanner(run_dir)

    def round(self, joined: RendezvousResult, exchange: StatusExchange | None) -> None:
        self._joined = joined
        self._exchange = exchange if joined.num_nodes > 1 else None
        self._answered = 0
        self._mine = set()

    def check_files(self) -> None:
        """Answer every new request file of this node's ``phalanx status`` that the scanner
        found, and have it look again (never here: a directory read can hang on NFS)."""
        for nonce in self._scanner.found():
            if nonce not in self._seen:
                self._seen.add(nonce)
                self._ask(nonce)
        self._scanner.poke()

    def close(self) -> None:
        self._scanner.close()

    def check_peers(self) -> None:
        """Post this node's answer to the other nodes' new requests (no network here: the
        heartbeat thread counted them; the post itself runs in a thread of its own)."""
        exchange = self._exchange
        if exchange is None:
            return
        newest = exchange.status_requests()
        new = [
            r
            for r in range(max(self._answered + 1, newest - ANSWER_AT_MOST + 1), newest + 1)
            if r not in self._mine
        ]
        self._answered = max(self._answered, newest)
        if new:
            data = self._answer()

            def post() -> None:
                for request in new:
                    exchange.post_status(request, data)

            threading.Thread(target=post, name="phalanx-status-post", daemon=True).start()

    def _ask(self, nonce: str) -> None:
        joined, exchange = self._joined, self._exchange
        others: list[tuple[int, str]] = []
        request = 0
        if joined is not None and exchange is not None:
            others = [
                (n.node_rank, n.hostname) for n in joined.nodes if n.node_rank != joined.node_rank
            ]
            try:
                request = exchange.request_status()
                self._mine.add(request)
            except RendezvousError as exc:
                log.warning("status: cannot ask the other nodes (%s); this node's only", exc)
        own = self._snapshot()
        threading.Thread(
            target=self._gather,
            args=(nonce, own, joined.round if joined else 0, request, others),
            name=f"phalanx-status-{nonce[:8]}",
            daemon=True,  # a job that ends meanwhile does not wait for it
        ).start()

    def _gather(
        self,
        nonce: str,
        own: dict[str, Any],
        round_: int,
        request: int,
        others: list[tuple[int, str]],
    ) -> None:
        answers: dict[int, bytes] = {}
        if request and self._exchange is not None:
            ranks = [rank for rank, _ in others]
            answers = self._exchange.gather_status(round_, request, ranks, GATHER_WAIT)
        answered = []
        for rank, data in sorted(answers.items()):
            if self._write_node(rank, data):
                answered.append(rank)
        reply = {
            "self": own,
            "answered": answered,
            "missing": [{"node": r, "host": h} for r, h in others if r not in answered],
            "wait": GATHER_WAIT,
        }
        if not files.request_path(self._run_dir, nonce).exists():
            return  # the command stopped waiting: no answer file left behind
        try:
            replace_file(files.answer_path(self._run_dir, nonce), json.dumps(reply).encode())
        except OSError as exc:
            log.warning("status: cannot write the answer in %s: %s", self._run_dir, exc)

    def _write_node(self, rank: int, data: bytes) -> bool:
        decoded = decode_answer(data)
        if decoded is None:
            log.warning("status: node %d's answer is malformed; left out", rank)
            return False
        status, events, dropped = decoded
        status["events_dropped"] = dropped
        where = files.node_dir(self._run_dir, rank)
        try:
            where.mkdir(parents=True, exist_ok=True, mode=0o700)
            replace_file(where / EVENTS_FILE, events)
            replace_file(where / files.STATUS_FILE, json.dumps(status, indent=1).encode())
        except OSError as exc:
            log.warning("status: cannot write node %d's status in %s: %s", rank, where, exc)
            return False
        return True


class _Scanner:
    """Looks for request files in a thread of its own, once per ``poke``: a run directory
    that stops answering holds up this thread, never the agent's tick."""

    def __init__(self, run_dir: Path) -> None:
        self._run_dir = run_dir
        self._wake = threading.Event()
        self._closed = False
        self._found: queue.SimpleQueue[list[str]] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="phalanx-status-scan", daemon=True)
        self._thread.start()

    def poke(self) -> None:
        self._wake.set()

    def found(self) -> list[str]:
        nonces: list[str] = []
        while not self._found.empty():
            nonces += self._found.get()
        return nonces

    def close(self) -> None:
        self._closed = True
        self._wake.set()

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            if self._closed:
                return
            self._found.put(files.pending_requests(self._run_dir))
