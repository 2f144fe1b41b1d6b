"""Nodes kept out of a job (``--exclude-after``, ``--exclude-file``), remembered in a file.

The file is JSON lines, one exclusion a line: ``{"node": hostname, "addr": address or
null, "reason": ..., "time": ...}``, and ``"slurm": name`` under Slurm (``SLURMD_NODENAME``,
the name ``--requeue`` keeps out of the requeued job: ``slurm_names``). An entry written by
a node that was given its address (``--local-addr``) matches that address: several agents
on one machine (network namespaces, containers) share a hostname but not an address. An
entry without one matches the hostname, the name a scheduler knows a node by. Under Slurm,
an entry with a Slurm name matches the Slurm node of that name and no other.

Writers append one line with ``O_APPEND`` (one ``write`` of a short line: nodes sharing the
file on one filesystem do not interleave), so an exclusion is never lost to another's.
A line that cannot be read (a torn write, a hand edit) is skipped, never fatal.

The API the node check (issue 28 item 1) calls: ``exclude(path, node, reason)`` and
``excluded(path)``; ``Streak`` counts a node's root causes in a row (a pure fold).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from phalanx.config import LaunchConfig
from phalanx.errors import NodeExcluded
from phalanx.events.log import EventLog
from phalanx.rendezvous.api import RendezvousResult
from phalanx.report.exits import root_cause
from phalanx.report.job import record_exits

log = logging.getLogger("phalanx")

# sysexits' EX_UNAVAILABLE: this node is not available to the job (it was excluded).
EXCLUDED_EXIT_CODE = NodeExcluded.exit_code
FILE_NAME = "excluded.jsonl"


@dataclass(frozen=True)
class NodeName:
    """How an exclusion names a node: its hostname, and its address when it was given one."""

    host: str
    addr: str | None = None
    slurm: str | None = None  # the Slurm node's name (SLURMD_NODENAME), under Slurm

    def __str__(self) -> str:
        return self.host if self.addr is None else f"{self.host} ({self.addr})"


@dataclass(frozen=True)
class Exclusion:
    node: NodeName
    reason: str
    time: float

    def matches(self, node: NodeName) -> bool:
        if self.node.slurm is not None and node.slurm is not None:
            return node.slurm == self.node.slurm  # under Slurm its node name is the node
        if self.node.addr is not None:
            return node.addr == self.node.addr
        return node.host == self.node.host


def exclude(path: Path, node: NodeName, reason: str) -> None:
    """Append ``node``'s exclusion to ``path`` (its folder made if missing). OSError
    propagates: a caller that must not fail on it says so."""
    entry = {"node": node.host, "addr": node.addr, "reason": reason, "time": time.time()}
    if node.slurm is not None:
        entry["slurm"] = node.slurm
    line = json.dumps(entry)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def exclusions(path: Path) -> list[Exclusion]:
    """Every readable exclusion in ``path`` (none when it does not exist)."""
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return []
    found = []
    for line in text.splitlines():
        with contextlib.suppress(ValueError, TypeError, KeyError, AttributeError):
            data = json.loads(line)
            addr, slurm = data.get("addr"), data.get("slurm")
            node = NodeName(
                str(data["node"]),
                None if addr is None else str(addr),
                None if slurm is None else str(slurm),
            )
            found.append(Exclusion(node, str(data.get("reason", "")), float(data.get("time", 0))))
    return found


def excluded(path: Path) -> set[str]:
    """The names excluded in ``path``: each entry's address where it has one, else its
    hostname (what ``Exclusion.matches`` compares)."""
    return {e.node.addr or e.node.host for e in exclusions(path)}


def slurm_names(paths: list[Path]) -> list[str]:
    """The Slurm node names of the exclusions in ``paths``, in order, once each: an entry's
    ``slurm`` name, or the host name of an entry without an address (one written by hand,
    or by a node whose host name is its Slurm name)."""
    names: dict[str, None] = {}
    for path in paths:
        for entry in exclusions(path):
            name = entry.node.slurm or (entry.node.host if entry.node.addr is None else None)
            if name:
                names[name] = None
    return list(names)


def requeue_exclusions(exclude_file: Path | None) -> list[str]:
    """The Slurm nodes ``--requeue`` keeps out of the requeued job: those of
    ``exclude_file`` (shared by the nodes). Not the run directory's own file: it is new
    for each agent (``rundir.make_run_dir``) and only its agent writes it, about its own
    node, as it leaves the job (the node check and a straggler under ``exclude``,
    ``--exclude-after``) or as the job ends; node rank 0, the one that requeues, is then
    gone or past its preemption, so that file never names a node here."""
    return slurm_names([exclude_file]) if exclude_file is not None else []


def exclusion_of(paths: list[Path], node: NodeName) -> Exclusion | None:
    """The first exclusion of ``node`` in ``paths``, or None."""
    for path in paths:
        for entry in exclusions(path):
            if entry.matches(node):
                return entry
    return None


@dataclass(frozen=True)
class Streak:
    """How many failed rounds in a row this node's worker was the job's root cause. A round
    whose root cause was elsewhere (or that did not fail) starts it again."""

    count: int = 0

    def after(self, cause_here: bool) -> Streak:
        return Streak(self.count + 1 if cause_here else 0)


class ExcludeAfter:
    """``--exclude-after K``: this node's root causes in a row, counted after each failed round
    is judged (so every node's record is in); at K the node's exclusion is recorded and, when
    the job would restart, the node leaves (``NodeExcluded``: the others re-form without it)."""

    def __init__(self, config: LaunchConfig, run_dir: Path, events: EventLog) -> None:
        self._config, self._run_dir, self._events = config, run_dir, events
        self._streak = Streak()

    def after_round(
        self,
        failures: Callable[[], list[dict[str, object]]],
        joined: RendezvousResult,
        failed_here: bool,
        *,
        leave: bool,
    ) -> None:
        k = self._config.recovery.exclude_after
        if k <= 0:
            return
        here = failed_here and cause_is_here(failures(), joined.round, joined.node_rank)
        self._streak = self._streak.after(here)
        if self._streak.count < k:
            return
        node = this_node(self._config.rendezvous.local_addr)
        reason = f"its worker was the job's root cause in {k} failed rounds in a row"
        record(self._config.recovery.exclude_file, self._run_dir, node, reason)
        self._events.emit("excluded", name=str(node), reason=reason)
        if leave:
            raise NodeExcluded(f"this node ({node}) is excluded: {reason}; leaving the job")


def cause_is_here(records: list[dict[str, object]], round_: int, node_rank: int) -> bool:
    """Whether the job-wide root cause of round ``round_`` (``report.exits.root_cause`` of
    every node's failure records, in the store's order) is a worker of node ``node_rank``."""
    # The records come oldest first, in the store's order: that is their sequence number.
    # ``record_exits`` reads them as the report does: a node found lost in the round (its
    # ``node_lost`` record) is the cause ahead of this node's ranks that failed only
    # because it went (``peer_error``), so a survivor's streak does not grow for it.
    ordered = [
        {**r, "seq": r.get("seq") or index}
        for index, r in enumerate(records, 1)
        if r.get("round") == round_
    ]
    cause = root_cause(record_exits(ordered))
    return cause is not None and cause.node_rank == node_rank


def this_node(local_addr: str | None) -> NodeName:
    return NodeName(
        socket.gethostname(), local_addr or None, os.environ.get("SLURMD_NODENAME") or None
    )


def refuse_if_excluded(exclude_file: Path | None, run_dir: Path, node: NodeName) -> None:
    """At start, before this node joins: raise ``NodeExcluded`` when ``exclude_file`` (or
    this run directory's own file, for a run started again in it) lists this node."""
    paths = [p for p in (exclude_file, run_dir / FILE_NAME) if p is not None]
    entry = exclusion_of(paths, node)
    if entry is not None:
        raise NodeExcluded(
            f"this node ({node}) is excluded from the job ({entry.reason}); leaving before "
            f"it joins. Remove its line from {exclude_file or run_dir / FILE_NAME} to let it in"
        )


def record(exclude_file: Path | None, run_dir: Path, node: NodeName, reason: str) -> None:
    """Write ``node``'s exclusion to the run directory's file and to ``exclude_file``; a
    file that cannot take it costs a warning, never the ending (the node leaves anyway)."""
    for path in (run_dir / FILE_NAME, exclude_file):
        if path is None:
            continue
        try:
            exclude(path, node, reason)
        except OSError as exc:
            log.warning("could not record this node's exclusion in %s: %s", path, exc)
