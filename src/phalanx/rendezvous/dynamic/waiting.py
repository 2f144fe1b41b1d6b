"""The waiting line: while a node waits for a round to form, say who is there.

``phalanx: waiting for nodes: 1 of 2..4 present (hostA); 1 more needed; join timeout in 583 s;
rendezvous: the c10d store at 10.0.0.1:29400`` (one line: the last part names where this node
waits, so a node waiting at the wrong place shows it; after the c10d store's host was lost,
the store that serves now, ``the store that took over, at 10.0.0.2:29400 (failover 1)``:
``failover.Failover.waiting_at``)

On a terminal (stderr is a tty) it is one line redrawn in place (``\\r`` and clear to the end
of the line), every ``TTY_EVERY`` seconds and at once on every change, ended with a newline
when the wait ends. In a log (not a tty) it is plain lines, only on a change and at most
every ``LOG_EVERY`` seconds otherwise, so a long wait does not fill the log. A wait shorter
than ``QUIET`` says nothing: a round that forms at once needs no line.

The cost stays O(1) store reads per node per check, whatever the job's size: the arrival
counter (a plain read, never a write: ``add(key, 0)`` writes on etcd), and the host names of
the first ``HOSTS_SHOWN`` arrivals, each read once (an arrival never changes).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

from phalanx.rendezvous.dynamic.board import Board
from phalanx.rendezvous.stores.base import MalformedValue

QUIET = 1.0  # seconds of waiting before the first line
TTY_EVERY = 5.0  # seconds between redraws on a terminal (the countdown moves)
LOG_EVERY = 30.0  # seconds between repeated lines in a log when nothing changed
HOSTS_SHOWN = 8  # the host names named; past these, "+N more"
_CLEAR = "\r\x1b[K"  # to the line's start, clear to its end


@dataclass(frozen=True)
class Waiting:
    """What the line says: ``present`` nodes joined round ``round`` (``hosts``: the first of
    them), or (``queued``) this node waits for a new round while ``round - 1`` runs."""

    round: int
    present: int
    hosts: tuple[str, ...]
    queued: bool = False
    # Waiting for the members of round ``round - 1`` to settle (rejoin, leave, or be found
    # lost): how many of how many have.
    settling: tuple[int, int] | None = None
    # Round ``round - 1`` runs with MAX members: this node is a spare, and waits as long as
    # the job runs (no join timeout while it does).
    spare: bool = False


def waiting_text(w: Waiting, min_nodes: int, max_nodes: int, left: float, where: str = "") -> str:
    """The line's text (pure: ``left`` is the seconds left of ``join_timeout``; ``where``:
    the store this node waits at, e.g. "the static store at 10.0.0.1:29500")."""
    timeout = f"join timeout in {max(0, math.ceil(left))} s"
    if where:
        timeout += f"; rendezvous: {where}"
    if w.queued and w.spare:
        where_ = f"; rendezvous: {where}" if where else ""
        return (
            f"phalanx: waiting to join: round {w.round - 1} is running without this node; "
            f"a spare: it waits for round {w.round} as long as the job runs{where_}"
        )
    if w.queued:
        return (
            f"phalanx: waiting to join: round {w.round - 1} is running without this node; "
            f"waiting for round {w.round} to open; {timeout}"
        )
    wanted = str(max_nodes) if min_nodes == max_nodes else f"{min_nodes}..{max_nodes}"
    names = ", ".join(w.hosts)
    if w.present > len(w.hosts):
        names += f", +{w.present - len(w.hosts)} more"
    needed = min_nodes - w.present
    if w.settling is not None:  # a restart round: what holds it is the last round's members
        settled, members = w.settling
        status = (
            f"waiting for round {w.round - 1}'s members to rejoin or be found lost "
            f"({settled} of {members} settled; a member that died is found lost once its "
            "heartbeats are heartbeat_timeout old)"
        )
    elif needed > 0:
        status = f"{needed} more needed"
    else:  # MIN present, fewer than MAX: the last call
        status = "enough to start; waiting for the others to join or the last call to end"
    hosts = f" ({names})" if names else ""
    return (
        f"phalanx: waiting for nodes: {w.present} of {wanted} present{hosts}; {status}; {timeout}"
    )


class WaitingLine:
    """Called from the join loops (``RoundFormer``): ``check`` on every wake, ``end`` once the
    wait ends (the round formed, or failed)."""

    def __init__(
        self,
        board: Board,
        min_nodes: int,
        max_nodes: int,
        *,
        out: Callable[[], TextIO] = lambda: sys.stderr,
        clock: Callable[[], float] = time.monotonic,
        where: str = "",
    ) -> None:
        self._b = board
        self._where = where
        self._min, self._max = min_nodes, max_nodes
        self._out = out
        self._clock = clock
        self._hosts: dict[tuple[int, int], str] = {}  # (round, slot) -> host name
        self._began: float | None = None
        self._said: Waiting | None = None
        self._said_at = 0.0
        self._drawn = False  # a tty line is on screen, not yet ended

    def check(
        self,
        round_: int,
        deadline: float,
        *,
        queued: bool = False,
        settling: bool = False,
        spare: bool = False,
        present: int | None = None,
    ) -> None:
        """Say where round ``round_`` stands if it changed, or if it is time to say it again
        (``settling``: the wait is for round ``round_ - 1``'s members to settle; ``present``:
        its ``joined`` counter as read already)."""
        now = self._clock()
        if self._began is None:
            self._began = now
        if now - self._began < QUIET:
            return
        if present is None:
            present = self._b.counter(self._b.keys.round(round_, "joined"))
        waiting = Waiting(
            round_, present, self._names(round_, present), queued,
            self._settling(round_ - 1) if settling else None, spare,
        )  # fmt: skip
        out = self._out()
        tty = _isatty(out)
        changed = waiting != self._said
        if not changed and now - self._said_at < (TTY_EVERY if tty else LOG_EVERY):
            return
        text = waiting_text(waiting, self._min, self._max, deadline - now, self._where)
        try:
            out.write(f"{_CLEAR}{text}" if tty else f"{text}\n")
            out.flush()
        except (OSError, ValueError):  # a closed or broken stderr costs the line, not the join
            return
        self._said, self._said_at, self._drawn = waiting, now, tty

    def end(self) -> None:
        """The wait is over: end a line drawn in place; the next wait starts quiet again."""
        if self._drawn:
            try:
                self._out().write("\n")
                self._out().flush()
            except (OSError, ValueError):
                pass
        self._began, self._said, self._drawn = None, None, False

    def _settling(self, previous: int) -> tuple[int, int] | None:
        """(settled, members) of round ``previous``: two plain reads."""
        decision = self._b.decision(previous)
        if decision is None or decision.failed:
            return None
        return self._b.read_int(self._b.keys.round(previous, "settled")), decision.count

    def _names(self, round_: int, present: int) -> tuple[str, ...]:
        names = []
        for slot in range(1, min(present, HOSTS_SHOWN) + 1):
            name = self._hosts.get((round_, slot))
            if name is None:
                name = self._arrival_host(round_, slot)
                if name is None:
                    break  # joined, not yet announced: named on a later check
                self._hosts[(round_, slot)] = name
            names.append(name)
        return tuple(names)

    def _arrival_host(self, round_: int, slot: int) -> str | None:
        try:
            body = self._b.get_json(self._b.keys.node(round_, slot))
        except MalformedValue:
            return "?"
        return None if body is None else str(body.get("hostname") or "?")


def _isatty(out: TextIO) -> bool:
    try:
        return out.isatty()
    except (OSError, ValueError):
        return False
