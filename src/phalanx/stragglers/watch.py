"""The straggler watch of one round (``--straggler-action``; arithmetic in
``phalanx.stragglers.rates``).

Every ``SAMPLE_EVERY`` seconds, as a watcher of the round's tick (``phalanx.tick``), this
node turns the tick's reading of its ranks' progress counters into rates over the window, on
its own clock. Only rates travel: a multi-node round posts this node's under the node
check's records (``CheckExchange``, phase ``"rates"``, one key per node, overwritten) and
reads the others', from a helper thread, so the tick never waits on the store. Every node
judges the same rates, so every node names the same straggler: one line on stderr, a
``straggler`` event (status, metrics and the timeline read it). Under ``exclude`` the
straggler's own node records its exclusion (``Exclude``, as ``--exclude-after`` does), stops
its workers and leaves the job (``NodeExcluded``, exit 69); the others see it leave and
re-form without it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable

from phalanx.errors import NodeExcluded, RendezvousError
from phalanx.events.log import EventLog
from phalanx.rendezvous.api import CheckExchange, RendezvousResult
from phalanx.stragglers.rates import RateWindow, judge
from phalanx.stragglers.settings import StragglerAction, StragglerSettings
from phalanx.tick import Reading

log = logging.getLogger("phalanx")

SAMPLE_EVERY = 1.0  # seconds between counter reads (and posts of this node's rates)
PHASE = "rates"

# Records this node's exclusion for the reason given (the exclusion file, the run's record);
# returns the node's name as the line and the event say it.
Exclude = Callable[[str], str]


class StragglerWatch:
    """One round's watch; ``see`` is a watcher of the round's tick (True: this node was
    named under ``exclude`` and stops its round), ``leave`` raises after it."""

    def __init__(
        self,
        settings: StragglerSettings,
        joined: RendezvousResult,
        exchange: CheckExchange | None,
        events: EventLog,
        exclude: Exclude,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._joined, self._events, self._exclude = joined, events, exclude
        self._action, self._fraction = settings.action, settings.fraction
        self._window = RateWindow(settings.window_s)
        self._clock = clock
        self._next = clock()
        self._exchange = exchange if joined.num_nodes > 1 else None
        self._peers: dict[str, tuple[float, int, str]] = {}  # rank -> (rate, node, host)
        self._lock = threading.Lock()
        self._busy = False  # a post-and-read thread runs
        self._named: set[str] = set()
        self._mine: dict[str, float] = {}  # this node's ranks' rates, as last measured
        self.leaving: str | None = None  # why this node leaves (exclude)

    def see(self, reading: Reading) -> bool:
        if self._action is StragglerAction.OFF or self._clock() < self._next:
            return False
        self._next = self._clock() + SAMPLE_EVERY
        beats = {}
        for worker, _ in reading.running:
            counters = reading.counters.get(worker.global_rank)
            if counters is not None:
                beats[str(worker.global_rank)] = counters[0]
        self._mine = mine = self._window.observe(self._clock(), beats)
        if self._exchange is not None and not self._busy:
            self._busy = True
            threading.Thread(
                target=self._share, args=(self._exchange, mine), name="phalanx-rates", daemon=True
            ).start()
        self._judge()
        return self.leaving is not None

    def leave(self) -> None:
        """After the round: this node leaves when it was named under ``exclude``. Otherwise
        the others' last rates are read once more and judged: a straggler that named itself
        and left under ``exclude`` (its rates posted before it went) is named here too,
        though this round ended before the helper thread read them."""
        if self.leaving is not None:
            raise NodeExcluded(self.leaving)
        exchange = self._exchange
        if exchange is None or self._action is StragglerAction.OFF or not self._mine:
            return
        try:
            self._read(exchange)
        except RendezvousError:
            return
        self._judge()

    def _judge(self) -> None:
        node, host = self._joined.node_rank, self._joined.this_node.hostname
        with self._lock:
            mine = {rank: (rate, node, host) for rank, rate in self._mine.items()}
            rates = {**self._peers, **mine}
        named = judge({rank: rate for rank, (rate, _, _) in rates.items()}, self._fraction)
        for rank in sorted(set(named) - self._named, key=int):
            self._named.add(rank)
            rate, median = named[rank]
            _, at, where = rates[rank]
            self._name(int(rank), at, where, rate, median)

    def _name(self, rank: int, node: int, host: str, rate: float, median: float) -> None:
        action = self._action.value
        self._events.emit(
            "straggler",
            round=self._joined.round,
            rank=rank,
            straggler_node=node,
            straggler_host=host,
            rate=round(rate, 3),
            median=round(median, 3),
            window=self._window.window_s,
            action=action,
        )
        log.warning(
            "straggler: rank %d on node %d (%s) makes %.3g steps/s, below %g of the other "
            "ranks' median %.3g steps/s over %g s (--straggler-action %s)",
            rank, node, host, rate, self._fraction, median, self._window.window_s, action,
        )  # fmt: skip
        if self._action is not StragglerAction.EXCLUDE or node != self._joined.node_rank:
            return
        if self._exchange is not None:  # so the others name it even once it is gone
            with contextlib.suppress(RendezvousError):
                self._exchange.post_check(PHASE, self._record(self._mine))
        reason = f"straggler: rank {rank} at {rate:.3g} steps/s, the others' median {median:.3g}"
        here = self._exclude(reason)
        self._events.emit("excluded", name=here, reason=reason)
        self.leaving = (
            f"this node ({here}, node {node}) is excluded (--straggler-action exclude): rank "
            f"{rank} stayed below {self._fraction:g} of the others' median step rate; it leaves "
            f"the job, which goes on without it where --nnodes MIN:MAX allows (exit "
            f"{NodeExcluded.exit_code})"
        )

    def _share(self, exchange: CheckExchange, mine: dict[str, float]) -> None:
        """Post this node's rates, read the others' (a helper thread: the store may be slow)."""
        try:
            exchange.post_check(PHASE, self._record(mine))
            self._read(exchange)
        except RendezvousError:
            return  # the round's watch hears the store's loss and acts on it
        finally:
            self._busy = False

    def _record(self, mine: dict[str, float]) -> bytes:
        joined = self._joined
        body = {"node": joined.node_rank, "host": joined.this_node.hostname, "rates": mine}
        return json.dumps(body).encode()

    def _read(self, exchange: CheckExchange) -> None:
        """The other nodes' last posted rates (no wait: what is there now)."""
        joined = self._joined
        others = [n.node_rank for n in joined.nodes if n.node_rank != joined.node_rank]
        found = exchange.gather_check(PHASE, others, 0.0)
        peers: dict[str, tuple[float, int, str]] = {}
        for data in found.values():
            try:
                record = json.loads(data)
                for rank, rate in record["rates"].items():
                    peers[str(rank)] = (float(rate), int(record["node"]), str(record["host"]))
            except (ValueError, KeyError, TypeError, AttributeError):
                continue  # junk in the store names nobody
        with self._lock:
            self._peers = peers
