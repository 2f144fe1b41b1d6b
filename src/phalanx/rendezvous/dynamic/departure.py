"""How a node leaves the run's store when its agent shuts down (``DynamicRendezvous.shutdown``).

After success: the exit barrier, then depart (the store's host waits for everyone to say
so); the last to depart from a store that outlives the job (etcd, a ``DurableStore``) clears
the run but its tombstone. After giving up: linger until every member's fate is settled,
and the last survivor clears the run. Without a report (a scale-down): say this node left.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from phalanx.rendezvous.api import EventKind, JobEvent
from phalanx.rendezvous.dynamic.board import LEFT, Board
from phalanx.rendezvous.dynamic.liveness import Liveness
from phalanx.rendezvous.dynamic.members import Membership
from phalanx.rendezvous.settings import RendezvousSettings
from phalanx.rendezvous.stores.base import DurableStore, KVStore

log = logging.getLogger("phalanx")


class Departure:
    def __init__(
        self,
        board: Board,
        store: KVStore,
        liveness: Liveness,
        settings: RendezvousSettings,
        hostname: str,
        node_id: str,
        run_id: str,
    ) -> None:
        self._board = board
        self._store = store
        self._liveness = liveness
        self._settings = settings
        self._hostname = hostname
        self._node_id = node_id
        self._run_id = run_id

    def _depart(self, membership: Membership) -> None:
        """After the exit barrier: the node serving the store (c10d) keeps it until every
        member has seen ``all_ok`` and said it is leaving (at most ``heartbeat_timeout``), so
        no peer's last read meets a closed store (a C++ warning and a false "not every node
        finished"). The others stop their heartbeat thread first: after saying so, nothing of
        theirs touches the store."""
        r = membership.round
        if not self._store.hosting:
            self._liveness.stop()
        if self._board.depart(r, membership.count):
            self._clear(finished=True)
        if self._store.hosting:
            everyone = self._board.keys.round(r, "all_departed")
            if not self._board.store.wait([everyone], self._settings.heartbeat_timeout):
                log.info("rendezvous: a node did not confirm it left; closing the store anyway")

    def _leave_failed(self, membership: Membership) -> None:
        """After a final failure, once every member's fate is known: on a store that outlives
        the job, the last survivor to leave clears the run (the lost ones never will)."""
        if not isinstance(self._store, DurableStore):
            return
        r = membership.round
        survivors = membership.count - self._board.counter(self._board.keys.round(r, "lost"))
        if self._board.depart(r, survivors):
            self._clear(finished=False)

    def _clear(self, *, finished: bool) -> None:
        """The last node out of a finished or failed job (see ``_depart``, ``_leave_failed``):
        on a store that outlives the job, delete all of the run but its tombstone. The
        others have stopped using the store by now (they said so before this node did)."""
        if not isinstance(self._store, DurableStore):
            return  # c10d, static: the store ends with the job
        if finished:  # (a failed job's tombstone is the reason it stopped, written then)
            self._board.finish()
        self._store.clear(self._board.keys.stopped)
        outcome = "finished" if finished else "failed"
        log.info("rendezvous %r %s: removed its keys but the tombstone", self._run_id, outcome)

    def leave(
        self,
        membership: Membership,
        rank: int,
        done: bool | None,
        exit_barrier: Callable[[], tuple[bool, JobEvent | None]],
    ) -> None:
        """The exit barrier after success (``done`` True); a short linger after giving up
        (False: so the store host stays until the peers read JOB_STOPPED); a graceful
        scale-down otherwise (None: nothing was reported)."""
        if done is True:
            all_done, event = exit_barrier()  # (at once if the agent waited already)
            if all_done:
                self._depart(membership)
            elif event is None and isinstance(self._store, DurableStore):
                # The barrier timed out, a peer still running: count this node out anyway,
                # so that the peer, finishing last, still clears the run from a store that
                # outlives the job.
                self._liveness.stop()
                if self._board.depart(membership.round, membership.count):
                    self._clear(finished=True)
        elif done is False:
            settled = self._board.keys.round(membership.round, "all_settled")
            if self._board.store.wait([settled], self._settings.heartbeat_timeout):
                self._leave_failed(membership)
        else:
            self._liveness.stop_beating()
            self._board.store.set(self._board.keys.heartbeat(self._node_id), LEFT)
            if self._board.settle(membership.round, rank, membership.count, "left"):
                detail = f"node {rank} ({self._hostname}) left the job"
                event = JobEvent(EventKind.NODE_LOST, rank, detail)
                self._board.post_event(membership.round, event, about=self._node_id)
