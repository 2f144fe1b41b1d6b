"""Typed reads and writes of a run's rendezvous keys (layout in ``keys``), shared by the join
algorithm (``formation``), the heartbeat thread (``liveness``) and the handler (``dynamic``).

Every value this module compare-sets embeds the writer's node id, so the one ambiguity the
``KVStore`` contract allows (TCPStore reporting a swap when the key already held the
desired value) cannot make two nodes both believe they won.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from phalanx.rendezvous.api import EventKind, JobEvent, RoundVerdict
from phalanx.rendezvous.dynamic.answers import AnswerBoard
from phalanx.rendezvous.dynamic.keys import Keys
from phalanx.rendezvous.dynamic.records import count_in, decode, encode, integer, parsed
from phalanx.rendezvous.stores.base import (
    BatchedStore,
    CountingStore,
    KVStore,
    StoreUnavailable,
)

T = TypeVar("T")

LEFT = b"left"  # heartbeat value of a node that left on purpose: watchers skip it
# Heartbeat value written by the guardian of an agent that died (``phalanx.rendezvous.
# lastword``): watchers count the node lost at once instead of after its liveness runs out.
DIED = b"died"


@dataclass(frozen=True)
class Decision:
    """How a round closed: ``count`` arrivals (slots 1..count) are in, or it failed."""

    count: int = 0
    failure: str = ""

    @property
    def failed(self) -> bool:
        return bool(self.failure)


def claim_of(body: dict[str, Any]) -> tuple[bool, str]:
    """A ``claim`` record's body as ``claimed_restart`` answers it."""
    return bool(body["restart"]), str(body.get("abandoned", ""))


class Board:
    def __init__(self, store: KVStore, keys: Keys, node_id: str) -> None:
        self.store = store
        self.keys = keys
        self.node_id = node_id
        # Asked once: a runtime-checked protocol's isinstance inspects every method each time
        # (tens of microseconds: a round's reads asked it thousands of times in a driver).
        self._batch = store if isinstance(store, BatchedStore) else None
        self._counting = store if isinstance(store, CountingStore) else None
        self.answers = AnswerBoard(store, keys)  # stacks, status, node-check records

    # -- generic -------------------------------------------------------------------------
    def get_json(self, key: str) -> dict[str, Any] | None:
        data = self.store.get(key)
        return None if data is None else decode(data, key)

    def get_many(self, keys: list[str]) -> list[bytes | None]:
        """The values of ``keys`` (None: absent): one round trip on a ``BatchedStore``."""
        if self._batch is not None:
            return self._batch.get_many(keys)
        return [self.store.get(key) for key in keys]

    def wait_get(
        self, keys: list[str], timeout: float, reads: list[str]
    ) -> tuple[bool, list[bytes | None]]:
        """``store.wait(keys, timeout)``, then the values of ``reads`` (read once the wait is
        over, found or not): one round trip on a ``BatchedStore``."""
        if self._batch is not None:
            return self._batch.wait_get(keys, timeout, reads)
        found = self.store.wait(keys, timeout)
        return found, [self.store.get(key) for key in reads]

    def counters(self, keys: list[str]) -> list[int]:
        """The integers at ``keys`` (absent: 0) by plain reads, as ``counter``: one round
        trip on a ``BatchedStore``."""
        return [count_in(k, data) for k, data in zip(keys, self.get_many(keys), strict=True)]

    def read_int(self, key: str) -> int:
        return self.store.add(key, 0)

    def counter(self, key: str) -> int:
        """The integer at ``key`` (absent: 0) by a plain read (``add(key, 0)`` writes on etcd)."""
        return count_in(key, self.store.get(key))

    def put_first(self, key: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Write ``obj`` unless the key exists; return what the key holds (first writer wins)."""
        _, current = self.store.compare_set(key, None, encode({**obj, "by": self.node_id}))
        if current is None:  # a backend breaking the contract; say so rather than crash later
            raise StoreUnavailable(f"compare_set on {key!r} returned no value")
        return decode(current, key)

    # -- rounds ----------------------------------------------------------------------------
    def latest_round(self) -> int:
        data = self.store.get(self.keys.latest_round)
        return 0 if data is None else integer(self.keys.latest_round, data)

    def open_round(self, r: int, current: bytes | None = None, *, read: bool = False) -> None:
        """Mark round ``r`` open and move the run's newest-round pointer up to it (never down).
        ``read``: ``current`` is the pointer as the caller just read it (a stale one only
        costs a compare-and-set that fails and reads it anew). A pointer at ``r`` or past it
        says round ``r`` is open (it moves only after ``open`` is written): nothing to write,
        so of a thousand members that rejoin, the first few write."""
        if not read:
            current = self.store.get(self.keys.latest_round)
        if current is not None and integer(self.keys.latest_round, current) >= r:
            return
        self.store.set(self.keys.round(r, "open"), b"1")
        while current is None or integer(self.keys.latest_round, current) < r:
            swapped, current = self.store.compare_set(
                self.keys.latest_round, current, str(r).encode()
            )
            if swapped:
                return

    def running(self) -> bool:
        """Whether a node that comes to the run now finds it running without it: the newest
        round formed, or a restart round still waits for the last one's members to settle.
        False: no round formed yet (the job's start), a settled restart round waits for nodes
        (it may need this one: below MIN it fails at its last call), this node hosts the
        store, or the store cannot be read. One or two round trips on a ``BatchedStore``."""
        keys = self.keys
        if self.store.hosting:
            return False
        try:
            latest, first = self.get_many([keys.latest_round, keys.round(0, "closed")])
            if latest in (None, b"0"):
                return first is not None
            t = integer(keys.latest_round, latest)
            closed, settled = self.get_many(
                [keys.round(t, "closed"), keys.round(t - 1, "all_settled")]
            )
        except StoreUnavailable:
            return False
        return closed is not None or settled is None

    def is_open(self, r: int) -> bool:
        return r == 0 or self.store.get(self.keys.round(r, "open")) is not None

    def decision(self, r: int) -> Decision | None:
        return self.decision_in(r, self.store.get(self.keys.round(r, "closed")))

    def decision_in(self, r: int, data: bytes | None) -> Decision | None:
        """Round ``r``'s decision from ``data``, its ``closed`` key's value as read."""
        if data is None:
            return None
        key = self.keys.round(r, "closed")
        return parsed(
            key, decode(data, key), lambda b: Decision(int(b.get("n", 0)), str(b.get("fail", "")))
        )

    def close(self, r: int, decision: Decision) -> Decision:
        """Propose how round ``r`` closes; return the decision that won (maybe another's)."""
        body: dict[str, Any] = (
            {"fail": decision.failure} if decision.failed else {"n": decision.count}
        )
        won = self.put_first(self.keys.round(r, "closed"), body)
        result = Decision(int(won.get("n", 0)), str(won.get("fail", "")))
        if result.failed:
            self.stop(f"round {r} failed: {result.failure}", None)
        return result

    # -- the job ---------------------------------------------------------------------------
    def stopped(self) -> tuple[str, bool] | None:
        """Why the job stopped and whether it finished (the tombstone of a successful run),
        or None while it runs."""
        return self.stopped_in(self.store.get(self.keys.stopped))

    def stopped_in(self, data: bytes | None) -> tuple[str, bool] | None:
        """``stopped`` from ``data``, the ``stopped`` key's value as read."""
        if data is None:
            return None
        found = decode(data, self.keys.stopped)
        return str(found.get("reason", "stopped")), found.get("finished") is True

    def finish(self) -> None:
        """Mark the job finished for good (kept by ``clear``: a reused run id is refused)."""
        self.put_first(self.keys.stopped, {"reason": "the job finished", "finished": True})

    def stop(
        self,
        reason: str,
        node_rank: int | None,
        *,
        signum: int | None = None,
        preempted: bool = False,
    ) -> bool:
        """Stop the job for good (the first reason is kept); return whether this call did.
        ``signum``: the signal that stopped it (``phalanx stop``, Ctrl-C, a preemption), so
        a node still joining ends as the signalled one does (143, 75), not as a failure."""
        record: dict[str, Any] = {"reason": reason, "node_rank": node_rank}
        if signum is not None:
            record.update(signal=signum, preempted=preempted)
        won = self.put_first(self.keys.stopped, record)
        return bool(won["by"] == self.node_id)

    def stop_signal(self) -> tuple[int, bool, str] | None:
        """The signal that stopped the job, whether it was a preemption, and where; None
        when no signal did (or the job runs)."""
        found = self.get_json(self.keys.stopped)
        if found is None or not isinstance(found.get("signal"), int):
            return None
        node = found.get("node_rank")
        where = f"node {node}" if isinstance(node, int) else "a node that was joining"
        return int(found["signal"]), found.get("preempted") is True, where

    def settle(self, r: int, rank: int, count: int, fate: str) -> bool:
        """Record how member ``rank`` of round ``r`` (of ``count``) left it: ``rejoined``,
        ``lost`` or ``left``. Only the first fate counts; returns whether this one did.
        ``gone`` (and ``lost``: who is left, for the last node to leave a failed job) are
        counted before ``settled`` so whoever sees ``all_settled`` reads final counts; on a
        ``CountingStore`` all of it is one request."""
        counted = {"rejoined": (), "left": ("gone",), "lost": ("gone", "lost")}[fate]
        counters = [self.keys.round(r, c) for c in (*counted, "settled")]
        claim, full = self.keys.fate(r, rank), self.keys.round(r, "all_settled")
        value = f"{fate}:{self.node_id}".encode()
        if self._counting is not None:
            return self._counting.claim_counted(claim, value, counters, count, full)
        swapped, _ = self.store.compare_set(claim, None, value)
        if swapped:
            for counter in counters[:-1]:
                self.store.add(counter, 1)
            if self.store.add(counters[-1], 1) >= count:
                self.store.set(full, b"1")
        return swapped

    def claim(self, r: int, restart: bool) -> bool:
        """The job-wide restart decision after round ``r``: the first claim decides for all."""
        key = self.keys.round(r, "claim")
        return parsed(key, self.put_first(key, {"restart": restart}), lambda b: bool(b["restart"]))

    def abandon(self, r: int, restart: bool, reason: str) -> tuple[bool, str]:
        """The restart decision after round ``r``, claimed by a node waiting for the next one
        because every member is gone (``abandoned``, ``reason``): the first claim decides for
        all, as ``claim``. Returns it, and why the round was abandoned ("": a member claimed
        first)."""
        key = self.keys.round(r, "claim")
        return parsed(key, self.put_first(key, {"restart": restart, "abandoned": reason}), claim_of)

    def claimed_restart(self, r: int) -> tuple[bool, str]:
        """Whether a restart was claimed after round ``r``, and why the round was abandoned
        ("": it was not, or nothing was claimed)."""
        key = self.keys.round(r, "claim")
        found = self.get_json(key)
        return (False, "") if found is None else parsed(key, found, claim_of)

    def post_progress(self, r: int, progressed: bool) -> int:
        """This member of round ``r`` judged it: counted in ``judged``, and in ``progressed``
        if it saw progress (first, so whoever counts every member judged reads a final
        ``progressed``). Returns how many members have judged so far."""
        if progressed:
            self.store.add(self.keys.round(r, "progressed"), 1)
        return self.store.add(self.keys.round(r, "judged"), 1)

    def verdict(self, r: int) -> RoundVerdict | None:
        """The job's verdict on round ``r`` (None: not judged yet)."""
        key = self.keys.round(r, "verdict")
        found = self.get_json(key)
        return None if found is None else parsed(key, found, RoundVerdict.from_json)

    def propose_verdict(self, r: int, verdict: RoundVerdict) -> RoundVerdict:
        """Propose the verdict on round ``r``; return the one that won (maybe another's)."""
        key = self.keys.round(r, "verdict")
        return parsed(key, self.put_first(key, verdict.to_json()), RoundVerdict.from_json)

    def mark_ok(self, r: int, count: int) -> None:
        if self.store.add(self.keys.round(r, "ok"), 1) >= count:
            self.store.set(self.keys.round(r, "all_ok"), b"1")

    def any_ok(self, r: int) -> bool:
        """Whether a member of round ``r`` finished its workers (a plain read)."""
        return self.store.get(self.keys.round(r, "ok")) is not None

    def all_ok(self, r: int) -> bool:
        return self.store.get(self.keys.round(r, "all_ok")) is not None

    def depart(self, r: int, count: int) -> bool:
        """This member of round ``r`` is leaving: it touches the store no more. Returns
        whether it is the last of ``count`` to say so."""
        if self.store.add(self.keys.round(r, "departed"), 1) >= count:
            self.store.set(self.keys.round(r, "all_departed"), b"1")
            return True
        return False

    # -- logs ------------------------------------------------------------------------------
    def append(
        self,
        counter: str,
        key_of: Callable[[int], str],
        obj: dict[str, Any],
        index_field: str | None = None,
    ) -> int:
        """Append to a log ``key_of(1), key_of(2), ...``: O(1) however many write at once.

        The slot comes from an atomic counter, then the entry is written (with its index as
        ``index_field``, when given); a writer that dies in between leaves a hole, which
        readers skip once ``counter`` shows later entries. Returns the index written.
        """
        index = self.store.add(counter, 1)
        entry = {**obj, index_field: index} if index_field else obj
        self.store.set(key_of(index), encode({**entry, "nonce": uuid.uuid4().hex}))
        return index

    def post_event(self, r: int, event: JobEvent, about: str) -> None:
        """Add ``event`` to round ``r``'s log; ``about`` is the node it concerns (not shown
        that event itself)."""
        body = {
            "kind": event.kind.value,
            "node_rank": event.node_rank,
            "detail": event.detail,
            "failure": event.failure,
            "about": about,
        }
        self.append(self.keys.round(r, "events"), lambda i: self.keys.event(r, i), body)

    def event(self, r: int, index: int) -> tuple[str, JobEvent] | None:
        """Entry ``index`` of round ``r``'s event log as ``(about, event)``, or None."""
        return self.event_in(r, index, self.store.get(self.keys.event(r, index)))

    def event_in(self, r: int, index: int, data: bytes | None) -> tuple[str, JobEvent] | None:
        """``event`` from ``data``, the entry's value as read."""
        key = self.keys.event(r, index)
        if data is None:
            return None
        body = decode(data, key)

        def event(b: dict[str, Any]) -> tuple[str, JobEvent]:
            rank = b["node_rank"]
            if rank is not None and not isinstance(rank, int):
                raise TypeError(f"node_rank {rank!r}")
            kind = EventKind(b["kind"])
            return str(b["about"]), JobEvent(kind, rank, str(b["detail"]), dict(b["failure"]))

        return parsed(key, body, event)

    def event_count(self, r: int) -> int:
        return self.read_int(self.keys.round(r, "events"))

    def add_failure(self, record: dict[str, Any]) -> int:
        """Post ``record``; returns its sequence number (its index in the failure log, also
        written into it as ``seq``): the store's order of failures, which no host's clock
        can change."""
        return self.append(self.keys.failure_count, self.keys.failure, record, "seq")

    def failure_log(self) -> tuple[int, int, list[bytes | None]]:
        """The log's first entry not yet swept (``sweep``), its last, each between as read
        (None: a hole): two round trips on a BatchedStore, plain reads (``add`` writes on etcd)."""
        start, last = self.counters([self.keys.failures_from, self.keys.failure_count])
        first = max(1, start)
        keys = [self.keys.failure(i) for i in range(first, last + 1)]
        return first, last, self.get_many(keys) if keys else []

    def failures(self) -> list[dict[str, Any]]:
        """The job's failure records of the last rounds (older ones are swept), oldest
        first (holes skipped)."""
        first, _, entries = self.failure_log()
        found = [(self.keys.failure(i), d) for i, d in enumerate(entries, first) if d is not None]
        return [{k: v for k, v in decode(d, key).items() if k != "nonce"} for key, d in found]
