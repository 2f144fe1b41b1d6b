"""Where c10d's agent store may move when its host is lost (``dynamic.failover``), and how a
candidate serves or reaches one.

The candidates: the endpoints of ``--rdzv-endpoint a:p,b:p,c:p`` in order, or, with one
endpoint, the members of the last round in node-rank order, each at the address the others
reach it at (which it published when it joined) and the endpoint's port. A successor's store
is an agent store like the first: the same token both ways, the run id seeded (``claim``).

Each served store has an id of its own (``claim.STORE_KEY``); a node knows the id of the
store it uses. At the lost store's place an agent started again there (systemd, a requeue)
serves a fresh, empty store with the job's token and run id: its id differs, so ``reach``
says it does not serve the job's store, and the survivors walk on to the successor instead
of rejoining a store that holds none of the job's state. A node that serves a successor's
store leaves word at the first endpoint, for a node started there later (``signpost``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from phalanx.rendezvous import lastword
from phalanx.rendezvous.addr import is_this_machine, resolve
from phalanx.rendezvous.backends import signpost
from phalanx.rendezvous.backends.claim import RUN_KEY, STORE_KEY, seed
from phalanx.rendezvous.dynamic.board import Board, Decision
from phalanx.rendezvous.dynamic.failover import TRY, Candidate, epoch_of
from phalanx.rendezvous.dynamic.keys import Keys
from phalanx.rendezvous.dynamic.majority import choose, confirmed, forming
from phalanx.rendezvous.dynamic.members import Membership
from phalanx.rendezvous.lastword import Reach
from phalanx.rendezvous.settings import RendezvousSettings
from phalanx.rendezvous.stores.agentstore import AgentKVStore, Token
from phalanx.rendezvous.stores.base import KVStore, StoreUnavailable

log = logging.getLogger("phalanx")


class AgentStoreSuccessors:
    """c10d's ``failover.Successors``: the store is at ``current`` (the endpoint first, then
    each successor in turn)."""

    def __init__(
        self,
        endpoints: Sequence[tuple[str, int]],
        token: Token,
        run_id: str,
        settings: RendezvousSettings,
    ) -> None:
        self._listed = [Candidate(host, port) for host, port in endpoints]
        self.current = self._listed[0]
        self.epoch = 0  # of the store this node starts on (``newest``)
        self._token = token
        self._run_id = run_id
        self._read_timeout = settings.read_timeout
        self._id: bytes | None = None  # the id of the store at ``current`` (None: unknown)
        self._ids: dict[Candidate, bytes | None] = {}  # the ids found where it served or reached
        self._said: set[Candidate] = set()  # the places said to serve another store
        self._before: tuple[Candidate, bytes] | None = None  # the store left by the last move
        self._first: bytes | None = None  # the id of the job's first store, if this node used it

    def attach(self, store: AgentKVStore) -> None:
        """This node uses ``store``, at ``current``, from now on: its id is the job's store's,
        and ``store`` is pinned to it (no key of another store at that place is ever read
        as the job's). May raise ``StoreUnavailable``."""
        self._id = store.get(STORE_KEY)
        if self._id is not None:
            store.pin(STORE_KEY, self._id)
        if self.epoch == 0:  # the job's first store: never taken for a fresh one (``signpost``)
            self._first = self._id

    def candidates(self, membership: Membership) -> list[Candidate]:
        if len(self._listed) > 1:
            return list(self._listed)
        port = self._listed[0].port
        return [Candidate(node.addr, port, node.node_rank) for node in membership.nodes]

    def is_current(self, candidate: Candidate) -> bool:
        return _same(candidate, self.current)

    def is_me(self, candidate: Candidate, rank: int) -> bool:
        if candidate.node_rank is not None:
            return candidate.node_rank == rank
        return is_this_machine(candidate.host)

    def at_member(self, candidate: Candidate, membership: Membership) -> bool:
        """A member's place: drawn from the members, or a listed endpoint that names a
        member's published address (as written, or resolved) or its host name (as written:
        a member's name may not resolve where this node is, and a lookup may hang). One
        that names none is a spare's place, or nobody's: no member walks to serve there, so
        the walk gives it one try, not the members' patience (the c10d soak's survivors
        waited 2 x heartbeat_timeout there whenever the spare's place came first)."""
        if candidate.node_rank is not None:
            return True
        return any(
            candidate.host.lower() == node.hostname.lower()
            or _same(candidate, Candidate(node.addr, candidate.port))
            for node in membership.nodes
        )

    def store_host(self, membership: Membership) -> int | None:
        host = Candidate(self.current.host, 0)
        found = [n.node_rank for n in membership.nodes if _same(Candidate(n.addr, 0), host)]
        return found[0] if len(found) == 1 else None  # one machine, several nodes: unknown

    def serve(self, candidate: Candidate, seed_keys: dict[str, bytes]) -> KVStore | None:
        held = {**seed(self._run_id), **seed_keys}
        self._ids[candidate] = held[STORE_KEY]
        try:
            store = AgentKVStore.host(
                candidate.host,
                candidate.port,
                token=self._token,
                read_timeout=self._read_timeout,
                seed=held,
            )
            store.pin(STORE_KEY, held[STORE_KEY])
        except OSError as exc:
            log.warning(
                "rendezvous: cannot serve the successor store on %s (%s); trying the next "
                "candidate", candidate, exc.strerror or exc,
            )  # fmt: skip
            return None
        first = self._listed[0]  # where a node given one endpoint serves a fresh store
        if not _same(candidate, first):
            signpost.keep(first, store, candidate, self._token, self._run_id, self._first)
        return store

    def reach(self, candidate: Candidate, timeout: float) -> AgentKVStore | None:
        probe = AgentKVStore(candidate.host, candidate.port, self._token, read_timeout=timeout)
        try:
            found = probe.get(RUN_KEY)  # the handshake first: the token, proved both ways
            which = probe.get(STORE_KEY)
        except StoreUnavailable:
            return None
        finally:
            probe.close()
        if found is not None and found.decode("utf-8", "replace") != self._run_id:
            return None  # another job's store on that port
        if self._id is not None and which != self._id and self.is_current(candidate):
            self._not_the_jobs(candidate)
            return None
        self._ids[candidate] = which
        return self._client(candidate, which)

    def newest(self, patience: float) -> AgentKVStore | None:
        """A node that starts while the job runs on a successor's store (listed endpoints
        only: members are known only to members): the confirmed store with the highest
        failover number the listed candidates serve (``majority.choose``), as a client
        (``current`` and ``epoch`` set to it); None when none serves a confirmed one past the
        first store (a job starting: the first endpoint, as ever). A newer store that is not
        confirmed (a successor its survivors are still reaching, or a node cut off from the
        others serving its own) is never joined: all are looked at again, once a second, while one
        is there, for at most ``patience`` seconds."""
        keys, until, said = Keys(self._run_id), time.monotonic() + patience, False
        while len(self._listed) > 1:
            found = self._look(keys)
            best, again = choose([(epoch, sure, now) for _, _, epoch, sure, now in found])
            if again and time.monotonic() < until:
                for candidate, store, epoch, sure, _ in found:
                    store.close()
                    if not (sure or said):
                        said = True
                        log.warning(
                            "rendezvous: the store at %s (failover %d) is not confirmed (a "
                            "quorum of the job's last members has not reached it): waiting "
                            "for one that is, at most %gs", candidate, epoch, patience,
                        )  # fmt: skip
                time.sleep(1.0)
                continue
            chosen = None if best is None or found[best][2] == 0 else found[best]
            for _, store, _, _, _ in found:
                if chosen is None or store is not chosen[1]:
                    store.close()
            if chosen is None:
                return None
            self.current, store, self.epoch, _, _ = chosen
            self._id = self._ids.get(self.current)
            log.warning(
                "rendezvous: the job's store moved (failover %d): joining it at %s",
                self.epoch, self.current,
            )  # fmt: skip
            return store
        return None

    def _look(self, keys: Keys) -> list[tuple[Candidate, AgentKVStore, int, bool, bool]]:
        """Every listed candidate that serves the job's store, one try each: where, a
        client of it, its failover number, whether it is confirmed and whether the job
        forms a round on it now."""
        found = []
        for candidate in self._listed:
            store = self.reach(candidate, TRY)
            if store is None:
                continue
            try:
                epoch = epoch_of(store, keys)
                sure = confirmed(store, keys, epoch)
                found.append((candidate, store, epoch, sure, sure and forming(store, keys)))
            except (StoreUnavailable, ValueError):
                store.close()
        return found

    def _not_the_jobs(self, candidate: Candidate) -> None:
        """The lost store's place answers with another store than the one this node used:
        its agent was started again there and serves a fresh, empty one. Said once, and told
        to that store: the round its agent waits in fails, so it ends now (started again,
        it joins the job's newest confirmed store) instead of waiting out ``join_timeout``
        -- or running a round with a newcomer that joined it, beside the job."""
        if candidate in self._said:
            return
        self._said.add(candidate)
        log.warning(
            "rendezvous: %s serves a store that is not the job's (a fresh one: the agent "
            "there was started again after the job's store was lost); looking for the "
            "store that succeeds it", candidate,
        )  # fmt: skip
        why = (
            f"the job's store at {candidate} was lost before this agent started again there, "
            "and the job's other nodes moved on to a successor: this fresh store is not the "
            "job's (started again, it joins the job where it went: at once with every "
            "candidate in --rdzv-endpoint; with one endpoint, once the job leaves word here)"
        )
        store = AgentKVStore(candidate.host, candidate.port, self._token, read_timeout=TRY)
        try:
            board = Board(store, Keys(self._run_id), "failover")
            board.close(board.latest_round(), Decision(failure=why))
            board.stop(why, None)
        except StoreUnavailable:
            pass  # (it ends at its join_timeout instead)
        finally:
            store.close()

    def back(self, timeout: float) -> tuple[Candidate, KVStore] | None:
        """The store this node used before its last move, as a client, when it answers at
        its place again within ``timeout`` -- the same store (its id), not one an agent
        started again there serves; None when not."""
        if self._before is None:
            return None
        place, which = self._before
        store = AgentKVStore(place.host, place.port, self._token, read_timeout=timeout)
        try:
            if store.get(STORE_KEY) == which:
                store.close()  # (a client with the usual timeout instead of the probe's)
                self._ids[place] = which
                return place, self._client(place, which)
        except StoreUnavailable:
            pass
        store.close()
        return None

    def _client(self, candidate: Candidate, which: bytes | None) -> AgentKVStore:
        """A client of the store at ``candidate`` whose id is ``which``, pinned to it (None:
        a store with no id, an older phalanx's, is not pinned)."""
        at = candidate.host, candidate.port
        store = AgentKVStore(*at, self._token, read_timeout=self._read_timeout)
        if which is not None:
            store.pin(STORE_KEY, which)
        return store

    def moved(self, candidate: Candidate) -> Reach:
        if self._id is not None:
            self._before = (self.current, self._id)
        self.current, self._id = candidate, self._ids.get(candidate)
        return lastword.agent_store(candidate.host, candidate.port, self._token)


def _same(a: Candidate, b: Candidate) -> bool:
    """The same place: the same port, and the same host (as written, or resolved)."""
    if a.port != b.port:
        return False
    return a.host == b.host or bool(resolve(a.host) & resolve(b.host))
