"""The node agent: rendezvous -> plan -> supervise -> restart within budget or report."""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import BinaryIO, NoReturn

from phalanx.config import LaunchConfig
from phalanx.errors import Interrupted, JobFailed, RendezvousError
from phalanx.plan import build_plan
from phalanx.rendezvous.api import EventKind, JobEvent, RendezvousHandler, RendezvousResult
from phalanx.report import WorkerExit, format_report, root_cause
from phalanx.supervisor.group import Launch, Outcome, Supervisor
from phalanx.supervisor.guardian import Guardian
from phalanx.supervisor.process import exec_worker
from phalanx.supervisor.signals import SignalWatcher
from phalanx.supervisor.warm import Template, open_template

log = logging.getLogger("phalanx")


def configure_logging() -> None:
    """Launcher messages go to stderr as ``phalanx: ...`` (once, whoever calls first)."""
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("phalanx: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False


def make_run_dir(config: LaunchConfig, run_id: str) -> Path:
    base = config.log_dir or Path(tempfile.gettempdir()) / "phalanx"
    base.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f"{run_id}_", dir=base))


def _failure_signature(cause: WorkerExit) -> tuple[int, int, str]:
    last = next((line for line in reversed(cause.stderr_tail) if line.strip()), "")
    return (cause.rank, cause.returncode, last)


def _count_lines(path: Path) -> int:
    try:
        with open(path, "rb") as handle:
            return sum(1 for _ in handle)
    except OSError:
        return 0


class Agent:
    """Runs one node's share of the job.

    ``open_rendezvous`` is called once, after the warm-start template has forked: a c10d or
    static store server started earlier would leak its thread and sockets into the template
    and every worker (a dead host then looks silent instead of reset to its peers).
    """

    def __init__(
        self,
        config: LaunchConfig,
        open_rendezvous: Callable[[], RendezvousHandler],
        run_id: str,
        base_env: Mapping[str, str] | None = None,
        *,
        launch: Launch = exec_worker,
        console: tuple[BinaryIO, BinaryIO] | None = None,
    ) -> None:
        self._config = config
        self._open_rendezvous = open_rendezvous
        self._run_id = run_id
        self._base_env = dict(os.environ if base_env is None else base_env)
        self._launch = launch
        self._console = console or (sys.stdout.buffer, sys.stderr.buffer)

    def run(self) -> int:
        """Run the job to the end; return 0 or raise ``JobFailed``/``Interrupted``/``RendezvousError``."""
        config = self._config
        run_dir = make_run_dir(config, self._run_id)
        log.info("run directory: %s", run_dir)
        filters = (
            tuple(word.encode() for word in config.duplicate_stdout_filters),
            tuple(word.encode() for word in config.duplicate_stderr_filters),
        )
        with SignalWatcher(config.signals_to_handle) as signals:
            guardian = Guardian()
            template: Template | None = None
            rendezvous: RendezvousHandler | None = None
            try:
                # Warm start: one template per agent run, imported while the rendezvous runs;
                # every attempt forks from it. A custom ``launch`` (tests) is used as given.
                if self._launch is exec_worker:
                    template = open_template(config, self._base_env, run_dir)
                rendezvous = self._open_rendezvous()
                supervisor = Supervisor(
                    guardian,
                    shutdown_timeout=config.shutdown_timeout,
                    monitor_interval=config.monitor_interval,
                    launch=template.launch if template is not None else self._launch,
                    console=self._console,
                    duplicate_filters=filters,
                )
                return _Rounds(
                    config, rendezvous, supervisor, signals, run_dir, self._base_env
                ).run()
            finally:
                if template is not None:
                    template.close()
                guardian.close()
                if rendezvous is not None:
                    rendezvous.shutdown()


class _Rounds:
    """The restart loop of one agent run, and the job-wide failure report at its end.

    Budget policy (see ``rendezvous.api``): a worker failure here or on a peer, and a lost
    node, spend a restart (``claim_restart``, job-wide); a node waiting to join (elastic
    scale-up) re-forms the round without spending one; a peer that gave up or a lost store
    ends the job.
    """

    def __init__(
        self,
        config: LaunchConfig,
        rendezvous: RendezvousHandler,
        supervisor: Supervisor,
        signals: SignalWatcher,
        run_dir: Path,
        base_env: Mapping[str, str],
    ) -> None:
        self.config = config
        self.rdzv = rendezvous
        self.supervisor = supervisor
        self.signals = signals
        self.run_dir = run_dir
        self.base_env = base_env
        self.attempts = 0

    def run(self) -> int:
        checkpoint_log = self.run_dir / "checkpoints.jsonl"
        previous: tuple[int, int, str] | None = None
        while True:
            joined = self.rdzv.next_round(self.config.nproc_per_node)
            if joined.num_nodes > 1 or self.attempts == 0:
                log.info(
                    "round %d: node %d of %d, world size %d, master %s:%d",
                    joined.round,
                    joined.node_rank,
                    joined.num_nodes,
                    joined.world_size,
                    joined.master_addr,
                    joined.master_port,
                )
            plan = build_plan(self.config, joined, self.run_dir, self.base_env)
            checkpoints_before = _count_lines(checkpoint_log)
            self.attempts += 1
            result = self.supervisor.run(plan, self.signals, self.rdzv.poll)
            exits = [replace(e, node_rank=joined.node_rank) for e in result.exits]
            if result.outcome is Outcome.SUCCEEDED:
                self.rdzv.report_done(True)
                log.info("all %d workers finished", len(exits))
                return 0
            if result.outcome is Outcome.INTERRUPTED:
                assert result.signum is not None
                self.rdzv.report_done(False)
                raise Interrupted(result.signum)
            cause = root_cause(exits)
            event = result.event
            if cause is not None:
                self.rdzv.report_failure(cause.to_json())
                log.warning(
                    "%s on %s: %s (attempt %d)",
                    cause.who,
                    cause.host,
                    cause.describe_exit(),
                    self.attempts,
                )
                signature = _failure_signature(cause)
                if signature == previous and _count_lines(checkpoint_log) == checkpoints_before:
                    self._fail(joined, exits, event, crash_loop=True)
                previous = signature
            elif event is not None:
                log.warning("stopped local workers: %s", _describe_event(event))
                if event.kind is EventKind.NODE_WAITING:
                    continue  # a scale-up: re-form the round, no restart spent
                if event.kind in (EventKind.JOB_STOPPED, EventKind.STORE_LOST):
                    self._fail(joined, exits, event, crash_loop=False)
            if not self.rdzv.claim_restart(self.config.max_restarts):
                self._fail(joined, exits, event, crash_loop=False)
            log.warning(
                "restarting the worker group (restart %d of %d)",
                self.attempts,
                self.config.max_restarts,
            )

    def _fail(
        self,
        joined: RendezvousResult,
        exits: list[WorkerExit],
        event: JobEvent | None,
        *,
        crash_loop: bool,
    ) -> NoReturn:
        """Print and save the job-wide report, then raise with the root cause's exit code."""
        self.rdzv.report_done(False)
        remote = [
            WorkerExit.from_json(record)
            for record in self.rdzv.failures()
            if record.get("round") == joined.round and record.get("node_rank") != joined.node_rank
        ]
        every = exits + remote
        reason = _describe_event(event) if event is not None and root_cause(every) is None else ""
        report = format_report(every, self.attempts, reason=reason)
        if crash_loop:
            report += (
                "\nphalanx: crash loop: the same failure happened twice in a row with no new "
                "checkpoint in between; not spending the remaining restarts."
            )
        print(report, file=sys.stderr, flush=True)
        (self.run_dir / "report.json").write_text(
            json.dumps(
                {
                    "attempts": self.attempts,
                    "crash_loop": crash_loop,
                    "reason": reason,
                    "root_cause": (cause.to_json() if (cause := root_cause(every)) else None),
                    "exits": [e.to_json() for e in every],
                },
                indent=2,
            )
        )
        if cause is None:
            raise RendezvousError(f"the job stopped: {reason or 'another node gave up'}")
        raise JobFailed(f"{cause.who} on {cause.host} {cause.describe_exit()}", cause.exit_code)


def _describe_event(event: JobEvent) -> str:
    who = f"node {event.node_rank}" if event.node_rank is not None else "a node"
    text = {
        EventKind.PEER_FAILED: f"workers failed on {who}",
        EventKind.NODE_LOST: f"{who} was lost (no heartbeat)",
        EventKind.NODE_WAITING: "a node is waiting to join; re-forming the round",
        EventKind.JOB_STOPPED: f"{who} stopped the job",
        EventKind.STORE_LOST: "the rendezvous store cannot be reached",
    }[event.kind]
    return f"{text}: {event.detail}" if event.detail else text
