"""The checks of a round before its workers start, as the agent runs them: the same code on
every node (``phalanx.consistency``), and the node check (``phalanx.nodecheck``): its verdict
said in the log and the event log; under ``--node-check exclude`` a named node leaves.

The node check runs when a round has an agent that no check has seen (the first round, a
node that joined, or one that came back as a new agent); a round whose every agent was
checked in an earlier round does not repeat it (``CheckedNodes``: each agent knows whether
it was, and says so in its ready record; one agent that was not makes every node check). On
CPU it is about 0.2 s of a restart that otherwise takes about 0.1 s, and on GPUs seconds (the
child's torch import and CUDA start); the nodes were checked before, and what goes wrong on
them while they train is the straggler watch's, the failure report's and
``--exclude-after``'s to find. Before, only a round with the very agents of the last round
skipped it, and only if nobody was named: in the soak every worker fault's restart took the
spare in (a member out) and every run directory was named (32 MiB log disks), so nearly
every restart ran the whole check (issue 41). A node named under ``warn`` counts as checked:
the job started with it, and checked again it could only be named again and start anyway;
under ``exclude`` a named node leaves."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from phalanx import exclusion
from phalanx.config import LaunchConfig
from phalanx.errors import MismatchError, NodeExcluded, RendezvousError
from phalanx.events.log import EventLog
from phalanx.nodecheck.settings import Action
from phalanx.rendezvous.api import CheckExchange, RendezvousHandler, RendezvousResult, Round

if TYPE_CHECKING:
    from phalanx.consistency.perargs import ArgsDifference
    from phalanx.nodecheck import Verdict
    from phalanx.nodecheck.probes import LocalFacts
    from phalanx.nodecheck.round import Skipped

# The comparison and the check themselves (``consistency``, ``nodecheck``: 30 ms of imports)
# are imported where a round has more than one node to compare or check: never on one node.

log = logging.getLogger("phalanx")


class CheckedNodes:
    """Whether this agent was checked: the first round whose check reached a verdict with
    it in (it passed, or was named under ``warn``); None: never (it says ``READY``). And
    this node's compute figure (``probe``), measured once per agent."""

    def __init__(self) -> None:
        self.round: int | None = None
        self._probed: LocalFacts | None = None
        self.ahead = False  # probed ahead of a round (kept or not): not again ahead

    def remember(self, joined: RendezvousResult) -> None:
        if self.round is None:
            self.round = joined.round

    def probe(
        self,
        nproc_per_node: int,
        events: EventLog,
        asked_by: int | None,
        needed: Callable[[], bool] = lambda: False,
    ) -> LocalFacts | None:
        """This node's compute figure for a check: the one measured before (ahead of its
        join, ``probe_ahead``, or at an earlier check), else measured now (``asked_by``: the
        round whose check asks; None: ahead). Why once: a round that takes in a node never
        checked (a spare, an agent started again) checks every node, and the probe was most
        of that check (0.15 s of a core on CPU, seconds on GPUs), after the round formed,
        with every rank waiting for it; the others' figures of their first check stand, as a
        restart among checked nodes trusts them (the module's docstring). A probe that found
        a problem (a GPU that did not answer) is run again at the next check. ``needed``
        (ahead only): True gives the probe up (None, no event): a round waits for this node."""
        if self._probed is None:
            from phalanx.nodecheck.probes import compute_probe

            began = time.monotonic()
            facts = compute_probe(nproc_per_node, needed)
            if facts is None:
                return None
            events.emit(
                "node_probe", round=asked_by, compute=facts.compute, device=facts.device,
                problems=facts.problems, seconds=round(time.monotonic() - began, 3),
            )  # fmt: skip
            self.ahead |= asked_by is None
            if facts.problems or facts.compute is None:
                return facts
            self._probed = facts
        known = self._probed
        return replace(known, problems=list(known.problems))  # the check appends its own


def probe_ahead(
    config: LaunchConfig,
    checked: CheckedNodes,
    events: EventLog,
    needed: Callable[[], bool] = lambda: False,
) -> None:
    """This node's compute probe, now, once: it comes to a running job that does not need it
    yet (``agent.join_when_ready``), or it waits as a spare beside a job that runs at MAX
    (``Peers.while_spare``: there from the job's start), so the probe costs no round
    anything; the round that takes it in checks with that figure instead of probing after it
    formed (issue 41: the first agent SIGKILL of a soak was back in 0.64 s against 0.16-0.38
    s, 0.35 s of it this check; a spare from the start still probed in the first restart that
    took it in, 0.06-0.26 s). ``needed``: asked between the probe's steps; once a round waits
    for this node the probe is given up, and that round's check probes. Nothing when the
    node check is off."""
    if config.checks.node_check.action is not Action.OFF and not checked.ahead:
        checked.probe(config.workers.nproc_per_node, events, None, needed)


def node_check(
    config: LaunchConfig,
    at: Round,
    run_dir: Path,
    events: EventLog,
    checked: CheckedNodes,
    stop: Callable[[], None],
) -> Verdict | None:
    """Check the round's nodes (None: off, a single node, not repeated, or stopped). Every
    node gets the same verdict and says the same lines; a node named under ``exclude``
    raises ``NodeExcluded``. ``checked``: whether this agent was checked; updated here.
    ``stop``: raises to end the check now (``check_round``'s: a preemption signal to
    this node)."""
    joined, exchanges = at.result, at.exchanges()
    if exchanges is None or joined.num_nodes < 2:
        return None
    from phalanx.nodecheck.round import Skipped

    began = time.monotonic()
    verdict = _check(config, exchanges.check, joined, run_dir, checked, stop, events)
    if verdict is None:
        return None
    if isinstance(verdict, Skipped):
        if verdict.same:
            log.info(
                "round %d: node check not repeated: each of its %d nodes was checked in an "
                "earlier round", joined.round, joined.num_nodes,
            )  # fmt: skip
        else:
            log.warning("round %d: node check skipped: %s", joined.round, verdict.reason)
        return None
    checked.remember(joined)  # (a node named under exclude leaves: see _say)
    _say(config, joined, run_dir, events, verdict, round(time.monotonic() - began, 3))
    return verdict


def _check(
    config: LaunchConfig,
    exchange: CheckExchange,
    joined: RendezvousResult,
    run_dir: Path,
    checked: CheckedNodes,
    stop: Callable[[], None],
    events: EventLog,
) -> Verdict | Skipped | None:
    """This node's part of the round's check (None: off, not repeated, or cut short: it says
    so in a line)."""
    from phalanx.nodecheck.probes import LocalFacts
    from phalanx.nodecheck.round import OFF, READY, SAME, check_round

    try:
        if config.checks.node_check.action is Action.OFF:
            exchange.post_check("ready", OFF)  # so nodes that check do not wait for this one
            return None
        ready = READY if checked.round is None else SAME  # SAME: skip, if every node says it
        nproc = config.workers.nproc_per_node
        return check_round(
            exchange, joined, config.checks.node_check, run_dir, nproc, ready, stop,
            lambda: checked.probe(nproc, events, joined.round) or LocalFacts(),
        )  # fmt: skip
    except OSError as exc:  # no port to listen on, say: the job must not end for the check
        log.warning("node check: could not run on this node: %s", exc)
    except RendezvousError as exc:  # the round's watch (or ``stop``) acts on it at once
        log.warning("round %d: node check stopped: %s", joined.round, exc)
    return None


def _say(
    config: LaunchConfig,
    joined: RendezvousResult,
    run_dir: Path,
    events: EventLog,
    verdict: Verdict,
    seconds: float,
) -> None:
    """The verdict in the event log and the log, the same lines on every node; under
    ``exclude`` a node it names leaves (``NodeExcluded``)."""
    events.emit(
        "node_check",
        round=joined.round,
        seconds=seconds,
        named=[n.to_json() for n in verdict.named],
        medians=verdict.medians,
        nodes=verdict.to_json()["nodes"],
    )
    for named in verdict.named:
        log.warning("%s", named.line)
    if not verdict.named:
        log.info("round %d: node check passed on %d nodes (%.2f s)", joined.round, joined.num_nodes, seconds)  # fmt: skip
    if (
        config.checks.node_check.action is Action.EXCLUDE
        and joined.node_rank in verdict.named_ranks()
    ):
        # Remembered as --exclude-after's are: the run directory's file and --exclude-file.
        reason = next(n.line for n in verdict.named if n.node_rank == joined.node_rank)
        node = exclusion.this_node(config.rendezvous.local_addr)
        exclusion.record(config.recovery.exclude_file, run_dir, node, f"node check: {reason}")
        raise NodeExcluded(
            f"node check: this node (node {joined.node_rank}, {joined.this_node.hostname}) "
            "is excluded (--node-check exclude): it leaves the job, which goes on without "
            f"it where --nnodes MIN:MAX allows (exit {NodeExcluded.exit_code})"
        )
    if excludes_others(config, verdict):
        log.warning(
            "node check: node(s) %s leave the job (--node-check exclude); forming the next "
            "round without them (no restart spent)",
            ", ".join(str(rank) for rank in sorted(verdict.named_ranks())),
        )


def excludes_others(config: LaunchConfig, verdict: Verdict) -> bool:
    """Whether other nodes leave by this verdict (then the round re-forms without them)."""
    return config.checks.node_check.action is Action.EXCLUDE and bool(verdict.named)


class SaidArgs:
    """The last line this agent said about per-node script arguments: a restart among the
    same nodes with the same arguments does not say it again."""

    def __init__(self) -> None:
        self.what = ""

    def news(self, differ: ArgsDifference | None) -> bool:
        """Whether ``differ`` is to be said: a difference not said since the arguments last
        agreed (one that goes away and comes back, with other members, is said again)."""
        said, self.what = self.what, "" if differ is None else differ.what
        return differ is not None and differ.what != said


def check_same_code(
    config: LaunchConfig,
    rdzv: RendezvousHandler,
    joined: RendezvousResult,
    events: EventLog,
    said: SaidArgs,
) -> None:
    """Stop the job before any worker starts when the members' code or versions differ
    (every node computes the same table from the same records, so every node stops; the
    others also see ``JOB_STOPPED``), or warn with the table under ``allow_mismatch``. Script
    arguments that differ are no reason to stop: one line and a ``script_args_differ``
    event name them (``consistency.perargs``), once for as long as they stay the same."""
    if not joined.fingerprints:  # one node: nothing to compare (what the comparison says)
        said.news(None)
        return
    from phalanx.consistency.compare import mismatch_table
    from phalanx.consistency.perargs import args_difference

    differ = args_difference(joined.nodes, joined.fingerprints, joined.round)
    if differ is not None and said.news(differ):
        log.info("%s", differ.line)
        events.emit("script_args_differ", round=joined.round, line=differ.line, nodes=differ.nodes)
    hint = (
        "starting anyway (--allow-mismatch)"
        if config.checks.allow_mismatch
        else "run the same code, files and versions on every node, or pass "
        "--allow-mismatch (phalanx.spawn: allow_mismatch=True) to start anyway"
    )
    table = mismatch_table(joined.nodes, joined.fingerprints, hint)
    if table is None:
        return
    if config.checks.allow_mismatch:
        log.warning("round %d: %s", joined.round, table)
        return
    rdzv.report_done(False)
    raise MismatchError(f"round {joined.round}: {table}")
