"""Deleting what no node can need any more, so the store does not grow with the rounds.

Round ``r``'s keys are read by its members, by the members' heartbeat threads while they
re-form (they watch ``r`` until round ``r+1`` forms) and by nodes queued for ``r+1``. Once
round ``r+2`` has formed, every member of ``r+1`` has followed it, so nobody reads round
``r`` again: node rank 0 of round ``r+2`` deletes it. That is O(keys of round ``r``) store
operations for that one node (about 3 per member, plus the events and stacks answers; one
range delete on etcd, a ``PrefixStore``) and none for the others; it never scans the history.

With the round go the heartbeat keys of its members that are in neither of the two rounds
after it (nobody watches them; see ``_forget_heartbeat`` for leased ones), and the failure
records of rounds up to ``r`` (the report reads the failing round's records only).

A sweep can be missed: node rank 0 of a round may die between forming it and sweeping. So
``sweep_from`` records the oldest round not yet swept, and the next sweeper also deletes
every round from there to its own (O(missed rounds) once, one ``get`` and one ``set`` otherwise).

The sweep runs in a thread of its own (``Sweeper``), after node rank 0 returned the round: on
etcd it is about ten requests (reads, a range delete, the failure log's oldest entries),
which delayed node 0's ``rdzv_done``, and so every restart, by 40-50 ms. Nothing waits for
it but this node's next round and its leaving (``Sweeper.wait``): the last node to leave
deletes the whole run, and a sweep's late ``set`` must not land after that.

A straggler can write to a swept round again (a member pushed out of a full round whose
heartbeat thread still watches it may record a peer as lost there): a few keys, removed on
etcd with the rest of the run at the end.
"""

from __future__ import annotations

import logging
import threading

from phalanx.rendezvous.dynamic.board import DIED, LEFT, Board
from phalanx.rendezvous.dynamic.members import Membership
from phalanx.rendezvous.dynamic.records import count_in, decode, parsed
from phalanx.rendezvous.stores.base import LeasedStore, PrefixStore, StoreUnavailable

log = logging.getLogger("phalanx")


class Sweeper:
    """Runs ``sweep`` in a thread of its own, one at a time (see the module's docstring)."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None

    def start(self, board: Board, current: Membership) -> None:
        """Sweep for node rank 0 of ``current`` in the background (after the last sweep ended)."""
        self.wait()
        self._thread = threading.Thread(
            target=self._run, args=(board, current), name="phalanx-sweep", daemon=True
        )
        self._thread.start()

    def wait(self) -> None:
        """Until the sweep under way, if any, ended: bounded, as each of its store calls is."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    @staticmethod
    def _run(board: Board, current: Membership) -> None:
        try:
            sweep(board, current)
        except StoreUnavailable as exc:  # the next sweeper starts where this one stopped
            log.info("rendezvous: sweeping round %d's old keys stopped: %s", current.round, exc)


def sweep(board: Board, current: Membership) -> None:
    """Node rank 0 of ``current`` deletes round ``current.round - 2``, and any round before it
    that a sweeper which died did not. Deleting an absent key is harmless, so a sweep that
    dies half-way, or runs twice, does no damage."""
    newest = current.round - 2
    if newest < 0:
        return
    # (Reads that go together are one request on etcd (``get_many``): each etcd request is
    # 2-5 ms on a loaded machine, and node rank 0's next round waits for this sweep to end.)
    sweep_from, before = board.get_many([board.keys.sweep_from, _key(board, current.round - 1)])
    first = count_in(board.keys.sweep_from, sweep_from)
    previous = _membership(board, current.round - 1, before)
    watching = set(current.node_ids) | set(previous.node_ids if previous is not None else ())
    for r in range(first, newest + 1):
        _sweep_round(board, r, watching)
    if first <= newest:
        board.store.set(board.keys.sweep_from, str(newest + 1).encode())


def _sweep_round(board: Board, r: int, watching: set[str]) -> None:
    """Delete round ``r``, and the heartbeat keys of its members that are in neither the
    round after it nor the two newest (``watching``)."""
    keys = board.keys
    old_data, later_data = board.get_many([_key(board, r), _key(board, r + 1)])
    old, later = _membership(board, r, old_data), _membership(board, r + 1, later_data)
    kept = watching | set(later.node_ids if later is not None else ())
    gone = [n for n in (old.node_ids if old is not None else ()) if n not in kept]
    if isinstance(board.store, PrefixStore):
        # One request, where one per key cost node rank 0 about 45 etcd writes before its
        # round was done (0.1 s of every restart on etcd; the agents' store answers in
        # a fraction of a millisecond a key). Stragglers' keys in the round go with it.
        board.store.delete_prefix(keys.round(r, ""))
    else:
        count = old.count if old is not None else board.counter(keys.round(r, "joined"))
        doomed = keys.round_keys(
            r,
            slots=board.counter(keys.round(r, "joined")),
            members=count,
            events=board.counter(keys.round(r, "events")),
            requests=board.counter(keys.round(r, "stack_requests")),
            status_requests=board.counter(keys.round(r, "status_requests")),
            queued=board.counter(keys.round(r, "waiting")),
        )
        for key in doomed:
            board.store.delete(key)
    for node_id in gone:
        _forget_heartbeat(board, node_id)
    _sweep_failures(board, r)


def _forget_heartbeat(board: Board, node_id: str) -> None:
    """Delete the liveness key of a node no current round has. A counter, ``LEFT`` or
    ``DIED`` can go (a node still alive writes its counter again; ``LEFT`` and ``DIED`` are
    plain writes, bound to no lease, which nothing else would remove). A leased key cannot:
    a node pushed out of two full rounds may still wait as a spare, and would read its
    key's absence as a lapsed lease; its lease removes the key when the node ends."""
    key = board.keys.heartbeat(node_id)
    if isinstance(board.store, LeasedStore) and board.store.get(key) not in (LEFT, DIED):
        return
    board.store.delete(key)


def _sweep_failures(board: Board, r: int) -> None:
    """Delete the failure log's oldest entries while they are of round ``r`` or earlier.

    Entries come in round order but for stragglers (a report that lost a race with the next
    round); one behind a later round's entry waits for the next sweep. ``fail_from`` moves
    past what was deleted, so readers and later sweeps start there.
    """
    keys = board.keys
    first, last, entries = board.failure_log()  # (read at once: few)
    index = first
    while index <= last:
        key = keys.failure(index)
        data = entries[index - first]
        body = None if data is None else decode(data, key)
        if body is None and index == last:
            break  # the newest slot: its writer may be about to write it
        if body is not None:
            if parsed(key, body, lambda b: int(b.get("round", -1))) > r:
                break
            board.store.delete(key)
        index += 1  # (an absent older entry is a hole left by a writer that died)
    if index > first:
        board.store.set(keys.failures_from, str(index).encode())


def _key(board: Board, r: int) -> str:
    return board.keys.round(r, "members")


def _membership(board: Board, r: int, data: bytes | None) -> Membership | None:
    """Round ``r``'s membership from ``data``, its key's value as read."""
    key = _key(board, r)
    body = None if data is None else decode(data, key)
    if body is None or "fail" in body:
        return None
    return parsed(key, body, Membership.from_json)
