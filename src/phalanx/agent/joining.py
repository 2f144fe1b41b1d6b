"""How an agent run joins its next round: the rendezvous (a signal meanwhile, or no round,
ends the run: a ``RunEnd``), the checks of a formed round (the same code everywhere, the
node check), and what is said once it formed."""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from functools import partial
from pathlib import Path

from phalanx.agent.beside import CheckBeside
from phalanx.agent.between import Between
from phalanx.agent.checking import (
    CheckedNodes,
    SaidArgs,
    check_same_code,
    excludes_others,
    node_check,
)
from phalanx.agent.runend import RunEnd
from phalanx.agent.sofar import RunState
from phalanx.config import LaunchConfig
from phalanx.errors import Interrupted, RendezvousError, signal_name
from phalanx.events.log import EventLog
from phalanx.nodecheck.settings import Action
from phalanx.rendezvous.api import RendezvousHandler, RendezvousResult, Round
from phalanx.supervisor.signals import SignalWatcher

log = logging.getLogger("phalanx")


class Joining:
    """Joins the rounds of one agent run (``agent.loop.Rounds``'s first step of each)."""

    def __init__(
        self,
        config: LaunchConfig,
        rendezvous: RendezvousHandler,
        signals: SignalWatcher,
        run_dir: Path,
        events: EventLog,
        between: Between,
        checked: CheckedNodes,
    ) -> None:
        self.config = config
        self.rdzv = rendezvous
        self.signals = signals
        self.run_dir = run_dir
        self.events = events
        self.between = between
        self.checked = checked  # whether this agent was checked: a restart skips it again
        self.said_args = SaidArgs()  # per-node script arguments: said once while they hold
        self.beside = CheckBeside()  # a restart round's check under warn (``agent.beside``)

    def next_round(self, state: RunState) -> tuple[Round, RunState] | RunEnd:
        """Join the next round; a signal meanwhile ends the wait at once, and the other nodes
        are told this node left (the job stops: it cannot form without it)."""
        self.events.emit("rdzv_start", attempt=state.attempts + 1)
        began = time.monotonic()
        try:
            with self.signals.raising():
                at = self.rdzv.next_round(self.config.workers.nproc_per_node)
        except Interrupted as exc:  # a signal here, or (``where``) the job stopped by one elsewhere
            return self.between.stopped_waiting(state, exc, "this node, in the rendezvous")
        except RendezvousError as exc:  # a node or the store lost, a timeout: no round
            return self.between.cut_short(state, exc, no_round(state, exc))
        joined = at.result
        self.events.node = joined.node_rank
        # Every member of the round before was gone: a node waiting to join opened this one.
        if joined.abandoned:
            self.events.emit(
                "round_abandoned",
                round=joined.round - 1,
                reason=joined.abandoned,
                restart_count=joined.restart_count,
            )
        self.events.emit(
            "rdzv_done",
            round=joined.round,
            attempt=state.attempts + 1,
            num_nodes=joined.num_nodes,
            world_size=joined.world_size,
            members=[n.hostname for n in sorted(joined.nodes, key=lambda n: n.node_rank)],
            restart_count=joined.restart_count,
            seconds=round(time.monotonic() - began, 3),
        )
        check_same_code(self.config, self.rdzv, joined, self.events, self.said_args)
        check = partial(node_check, self.config, at, self.run_dir, self.events, self.checked)
        beside = joined.round > 0 and self.config.checks.node_check.action is Action.WARN
        if beside and joined.num_nodes > 1:  # its workers need not wait for it: it only names
            self.beside.start(check, joined.round)
        verdict = None if beside else check(self._stop_check)
        if verdict is not None:  # the report's, the newest round's
            state = replace(state, checked=tuple(n.line for n in verdict.named))
            if excludes_others(self.config, verdict):  # they leave: form a round without them
                self.events.emit("reform", round=joined.round, reason="the node check excluded a node")  # fmt: skip
                return self.next_round(state)
        if joined.num_nodes > 1 or state.attempts == 0:
            self._say_round(joined)
        return at, self.say_restart(state, joined)

    def _stop_check(self) -> None:
        """End the node check now (raises) once a signal came to this node since the round
        formed, to stop or a preemption: the loop then ends the run as stopped or as
        preempted, with no worker started."""
        signum = self.signals.pending()
        if signum is not None:
            raise RendezvousError(f"this node got {signal_name(signum)} (a stop)")
        signum = self.signals.preempt_pending()
        if signum is not None:
            raise RendezvousError(f"this node got {signal_name(signum)} (a preemption)")

    def _say_round(self, joined: RendezvousResult) -> None:
        # A spawn owner is one process per node that starts the node's ranks itself.
        owner = (
            " (ranks; one spawn-owner process per node starts them)"
            if self.config.workers.spawn_owner
            else ""
        )
        log.info(
            "round %d: node %d of %d, world size %d%s, master %s:%d",
            joined.round, joined.node_rank, joined.num_nodes, joined.world_size, owner,
            joined.master_addr, joined.master_port,
        )  # fmt: skip

    def say_restart(self, state: RunState, joined: RendezvousResult) -> RunState:
        """Say the restart claimed after the last round, now that its round has formed: the
        job's count of restarts (the rendezvous's), and the re-forms for joining nodes apart."""
        if not state.restarting:
            return state
        reforms = f"; {state.reforms} re-form(s) for joining nodes" if state.reforms else ""
        log.warning(
            "restarting the worker group (restart %d of %d%s)",
            joined.restart_count, self.config.recovery.max_restarts, reforms,
        )  # fmt: skip
        return replace(state, restarting=False)


def no_round(state: RunState, exc: RendezvousError) -> str:
    """Why the job ended when the next round could not form."""
    if state.failure is None:
        return str(exc)
    return f"the restart round could not form: {exc}"
