"""The store's successor leaves word at the lost store's place (design.md, "When the store's
host is lost").

Users run the same command on every node, torchrun's way, with one ``--rdzv-endpoint``: the
first store's host. Once that host was lost and the job's store moved to a member's address,
a node started with that command line knows only the endpoint, the lost store's place, and
nothing tells it the members. Started on that machine (it came back), its agent serves a
fresh store there, under the job's token and run id, that the job never joins; before, it
waited alone there until ``join_timeout`` ended it. So the node that serves the job's store
after a failover looks at that place every ``EVERY`` seconds, once its store is confirmed (a
quorum of the last round's members reached it): a store there with the job's token (proved
both ways) and run id that is not this one gets the word ``Keys.moved`` -- where the job's
store is and its failover number. A node waiting there in no round yet follows the word
(``follow.signposted``), to a confirmed store only, and joins the job as a newcomer; a
client that joined the fresh store follows it too. A round that formed there anyway (two
newcomers at MIN before the word came) is a second job under the run id: it is stopped.

Only the job's first endpoint is looked at: a node given one endpoint serves a fresh store
nowhere else, and one given the list finds the job itself (``successor.newest``). One try of
at most ``failover.TRY`` each time, on a thread of its own, for as long as this node serves
the store (its handle closes when it moves on or leaves).
"""

from __future__ import annotations

import json
import logging
import threading
import time

from phalanx.rendezvous.backends.claim import RUN_KEY, STORE_KEY
from phalanx.rendezvous.dynamic.board import Board
from phalanx.rendezvous.dynamic.failover import TRY, Candidate, epoch_of
from phalanx.rendezvous.dynamic.keys import Keys
from phalanx.rendezvous.dynamic.majority import confirmed
from phalanx.rendezvous.stores.agentstore import AgentKVStore, Token
from phalanx.rendezvous.stores.base import KVStore, StoreUnavailable

log = logging.getLogger("phalanx")

EVERY = 2.0  # seconds between two looks at the lost store's place


def keep(
    place: Candidate,
    served: KVStore,
    at: Candidate,
    token: Token,
    run_id: str,
    first: bytes | None,
) -> None:
    """While ``served`` (this node's store, at ``at``) is open: leave word at ``place`` (the
    job's first endpoint) whenever a store of the run that is neither this one nor the job's
    first store (``first``: its id, None when this node never used it) answers there."""
    keys = Keys(run_id)

    def run() -> None:
        told: set[bytes] = set()  # the stores told (said once each)
        while True:
            time.sleep(EVERY)
            try:
                epoch = epoch_of(served, keys)
                sure, mine = confirmed(served, keys, epoch), served.get(STORE_KEY)
            except (StoreUnavailable, ValueError):
                return  # closed: this node serves the job's store no more
            if sure and epoch > 0:
                _tell(place, at, epoch, (mine, first), token, keys, told)

    threading.Thread(target=run, name="phalanx-signpost", daemon=True).start()


def _tell(
    place: Candidate,
    at: Candidate,
    epoch: int,
    known: tuple[bytes | None, bytes | None],
    token: Token,
    keys: Keys,
    told: set[bytes],
) -> None:
    """One look at ``place``; word left in a store of the run there that is a fresh one --
    neither this node's nor the job's first store (``known``: their ids) -- and has no word
    of failover ``epoch`` or newer yet."""
    probe = AgentKVStore(place.host, place.port, token, read_timeout=TRY)
    try:
        if probe.get(RUN_KEY) != keys.run_id.encode():
            return  # nothing there, or another job's store
        which = probe.get(STORE_KEY)
        if which is None or which in known:
            return  # the job's own store (its first, back after a pause)
        if _epoch_said(probe.get(keys.moved)) < epoch:
            word = {"host": at.host, "port": at.port, "epoch": epoch}
            probe.set(keys.moved, json.dumps(word).encode())
        if which not in told:
            told.add(which)
            log.warning(
                "rendezvous: %s serves a fresh store under this job's run id (an agent started "
                "there after the job's store moved, given one endpoint): told it the job's "
                "store is at %s (failover %d)", place, at, epoch,
            )  # fmt: skip
        if known[1] is not None:  # (sure it is no store the job ran on)
            _stop_a_second_job(Board(probe, keys, "signpost"), place, at)
    except (StoreUnavailable, ValueError):
        pass  # nobody there (the usual case), or gone meanwhile: looked at again later
    finally:
        probe.close()


def _epoch_said(word: bytes | None) -> int:
    try:
        return int(json.loads(word)["epoch"]) if word is not None else 0
    except (ValueError, KeyError, TypeError):
        return 0  # junk: told again


def _stop_a_second_job(board: Board, place: Candidate, at: Candidate) -> None:
    """A round that formed on the fresh store (newcomers met there at MIN before the word came)
    runs beside the job under its run id: stop it."""
    decision = board.decision(board.latest_round())
    if decision is None or decision.failed:
        return  # nobody runs there: those waiting follow the word
    board.stop(
        f"the job's store at {place} was lost and the job moved on to {at}; this round "
        "formed on a fresh store at the lost one's place, beside the job: start these nodes "
        "again, and they join the job there",
        None,
    )
