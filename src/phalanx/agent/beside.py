"""A restart round's node check beside its workers, under ``--node-check warn``.

Under ``warn`` the check's verdict only names nodes: the round starts with them whatever it
says. So after the job's first round (which checks before its workers: its figures are taken
on quiet nodes, and a first start is when a user reads them) the agent forks the round's
workers at once and runs the check in a thread beside them: its exchanges through the store,
its link test, its line and ``node_check`` event, a little later than before. Each agent's
compute figure was measured before (once per agent: ``agent.checking.CheckedNodes``), so
what runs beside the workers is a few store exchanges, one link test and a small write.

Why: with the check before the workers, every restart round waited for it: for the ``ready``
exchange alone when every node was checked before, and for the whole check (0.1-0.2 s on
the soak's etcd, every node waiting for the slowest) whenever a round took in an agent never
checked (a spare, an agent started again) -- about half of the soak's restarts (issue 41).
Under ``exclude`` the verdict decides who stays, so the check still comes first.

The check stops (a ``RendezvousError`` from its ``stop``, said in one line) when its round
ends before it did: a verdict on a round that is over is no use, and a record it waits for
may never come. Its named lines reach the run's report at the round's end (``fold``)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from phalanx.agent.sofar import RunState
from phalanx.errors import RendezvousError

if TYPE_CHECKING:
    from phalanx.nodecheck import Verdict

log = logging.getLogger("phalanx")

CLOSE_WAIT = 1.5  # s: at the run's end, for a check told to stop (it asks once a second)

Check = Callable[[Callable[[], None]], "Verdict | None"]  # the check, given its ``stop``


class CheckBeside:
    """The node check of the round under way, in a thread of its own (one at a time)."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._over = threading.Event()
        self._named: tuple[str, ...] | None = None  # a finished check's lines, not yet folded

    def start(self, check: Check, round_: int) -> None:
        """Run ``check`` beside round ``round_``'s workers (the last round's check, if any is
        still running, told to stop first)."""
        self.over()
        over = self._over = threading.Event()

        def stop() -> None:
            if over.is_set():
                raise RendezvousError("its round ended before the check did")

        def run() -> None:
            try:
                verdict = check(stop)
            except Exception:  # a bug in the check must not end the job it only names nodes of
                log.exception("round %d: the node check beside the workers failed", round_)
                return
            if verdict is not None:
                self._named = tuple(n.line for n in verdict.named)

        self._thread = threading.Thread(target=run, name="phalanx-node-check", daemon=True)
        self._thread.start()

    def over(self) -> None:
        """The round ended: its check, if still running, stops at its next look."""
        self._over.set()

    def fold(self, state: RunState) -> RunState:
        """``state`` with the named lines of a check finished since the last fold (the
        report's ``node_check``: the newest round's)."""
        named, self._named = self._named, None
        return state if named is None else replace(state, checked=named)

    def close(self) -> None:
        """At the run's end: stop the check and give it ``CLOSE_WAIT`` to say so."""
        self.over()
        if self._thread is not None:
            self._thread.join(CLOSE_WAIT)
