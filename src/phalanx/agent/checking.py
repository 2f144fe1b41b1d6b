"""The checks of a round before its workers start, as the agent runs them: the same code on
every node (``phalanx.consistency``), and the node check (``phalanx.nodecheck``): its verdict
said in the log and the event log; under ``--node-check exclude`` a named node leaves."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from phalanx.agent import exclusion
from phalanx.config import LaunchConfig
from phalanx.consistency.compare import mismatch_table
from phalanx.errors import MismatchError, NodeExcluded, RendezvousError
from phalanx.events.log import EventLog
from phalanx.nodecheck import Action, Verdict, check_round
from phalanx.nodecheck.round import OFF
from phalanx.rendezvous.api import RendezvousHandler, RendezvousResult

log = logging.getLogger("phalanx")


def node_check(
    config: LaunchConfig,
    rdzv: RendezvousHandler,
    joined: RendezvousResult,
    run_dir: Path,
    events: EventLog,
) -> Verdict | None:
    """Check the round's nodes (None: off, or a single node). Every node gets the same
    verdict and says the same lines; a node named under ``exclude`` raises ``NodeExcluded``."""
    settings = config.node_check
    peers = rdzv.peers()
    if peers is None or joined.num_nodes < 2:
        return None
    exchange = peers.node_check()
    began = time.monotonic()
    try:
        if settings.action is Action.OFF:
            exchange.post_check("ready", OFF)  # so nodes that check do not wait for this one
            return None
        verdict = check_round(exchange, joined, settings, run_dir, config.nproc_per_node)
    except OSError as exc:  # no port to listen on, say: the job must not end for the check
        log.warning("node check: could not run on this node: %s", exc)
        return None
    except RendezvousError as exc:  # the round's watch hears it too, and acts on it at once
        log.warning("round %d: node check stopped: %s", joined.round, exc)
        return None
    seconds = round(time.monotonic() - began, 3)
    if verdict is None:
        log.warning("round %d: node check skipped: a node runs with --node-check off", joined.round)  # fmt: skip
        return None
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
    if settings.action is Action.EXCLUDE and joined.node_rank in verdict.named_ranks():
        # Remembered as --exclude-after's are: the run directory's file and --exclude-file.
        reason = next(n.line for n in verdict.named if n.node_rank == joined.node_rank)
        node = exclusion.this_node(config.local_addr)
        exclusion.record(config.exclude_file, run_dir, node, f"node check: {reason}")
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
    return verdict


def excludes_others(config: LaunchConfig, verdict: Verdict) -> bool:
    """Whether other nodes leave by this verdict (then the round re-forms without them)."""
    return config.node_check.action is Action.EXCLUDE and bool(verdict.named)


def check_same_code(
    config: LaunchConfig, rdzv: RendezvousHandler, joined: RendezvousResult
) -> None:
    """Stop the job before any worker starts when the members' code or versions differ
    (every node computes the same table from the same records, so every node stops; the
    others also see ``JOB_STOPPED``), or warn with the table under ``allow_mismatch``."""
    hint = (
        "starting anyway (--allow-mismatch)"
        if config.allow_mismatch
        else "run the same code, files and versions on every node, or pass "
        "--allow-mismatch (phalanx.spawn: allow_mismatch=True) to start anyway (script "
        "arguments that differ on purpose: --allow-per-node-args on every node)"
    )
    table = mismatch_table(joined.nodes, joined.fingerprints, hint)
    if table is None:
        return
    if config.allow_mismatch:
        log.warning("round %d: %s", joined.round, table)
        return
    rdzv.report_done(False)
    raise MismatchError(f"round {joined.round}: {table}")
