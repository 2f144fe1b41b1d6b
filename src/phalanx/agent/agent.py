"""The node agent: rendezvous -> plan -> supervise -> restart within budget or report."""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import BinaryIO

from phalanx.agent.between import Between
from phalanx.agent.checking import CheckedNodes, probe_ahead
from phalanx.agent.endings import Endings
from phalanx.agent.filewriter import END_WRITES, REPORT_FILE, RunFiles
from phalanx.agent.loop import Rounds
from phalanx.agent.runend import Reporter
from phalanx.agent.runfiles import write_launcher_file
from phalanx.agent.stopped import not_needed_report
from phalanx.config import LaunchConfig
from phalanx.errors import CutOff, Interrupted, NotNeeded, PhalanxError, Preempted, UsageError
from phalanx.events.figures import RecoveryTracker
from phalanx.events.log import EventLog
from phalanx.events.metrics import MetricsServer
from phalanx.exclusion import refuse_if_excluded, this_node
from phalanx.rendezvous.api import Peers, RendezvousHandler
from phalanx.resources.limits import raise_descriptor_limit
from phalanx.resources.rundir import make_run_dir
from phalanx.status import StatusService
from phalanx.status.files import stop_marker
from phalanx.supervisor.cgroup import JobCgroup
from phalanx.supervisor.clock import WallClock
from phalanx.supervisor.console import configure_logging as configure_logging
from phalanx.supervisor.group import Supervisor
from phalanx.supervisor.guardian import Guardian, GuardianLost
from phalanx.supervisor.signals import SignalWatcher
from phalanx.supervisor.warm import Template
from phalanx.supervisor.warmservice import open_warm
from phalanx.worker.master import WAIT_ENV, master_wait

log = logging.getLogger("phalanx")


def _job_end(events: EventLog, files: RunFiles, exc: PhalanxError) -> None:
    """The ``job_end`` event of a run that ended by ``exc`` (and the report of a spare
    the job finished without: ``NotNeeded`` ends no round, so no ``RunEnd`` wrote one)."""
    if isinstance(exc, Preempted):
        outcome = "preempted"
    elif isinstance(exc, Interrupted):
        outcome = "interrupted"
    elif isinstance(exc, CutOff):  # out of the job, which may go on (``agent.between``)
        outcome = "cut_off"
    elif isinstance(exc, NotNeeded):
        report = json.dumps(not_needed_report(str(exc)), indent=2)
        files.offer(REPORT_FILE, report.encode())
        outcome = "not_needed"
    else:
        outcome = "failed"
    events.emit("job_end", outcome=outcome, exit_code=exc.exit_code)


def guardian_lost(events: EventLog, lost: GuardianLost) -> None:
    """Say once that this node's guardian died before its agent, and what guards it now."""
    if lost.replacement is not None:
        log.warning(
            "the guardian (pid %d) ended (%s); a new one (pid %d) guards this node's workers",
            lost.pid,
            lost.ended,
            lost.replacement,
        )
    else:
        log.warning(
            "the guardian (pid %d) ended (%s) and was not replaced (%s): if this agent is "
            "killed now, its workers' own children may outlive it",
            lost.pid,
            lost.ended,
            lost.why,
        )
    events.emit("guardian_lost", pid=lost.pid, ended=lost.ended, replacement=lost.replacement)


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
        console: tuple[BinaryIO, BinaryIO] | None = None,
        contain: bool = False,
    ) -> None:
        """``contain``: run the job in a cgroup of its own where one can be made (the CLI; not
        ``phalanx.spawn``, whose agent is the user's own process)."""
        self._config = config
        self._open_rendezvous = open_rendezvous
        self._run_id = run_id
        self._base_env = dict(os.environ if base_env is None else base_env)
        self._console = console or (sys.stdout.buffer, sys.stderr.buffer)
        self._contain = contain
        self._checked = CheckedNodes()  # this agent's node check: whether, and its figure

    def _probe_ahead(self, events: EventLog) -> Callable[[Callable[[], bool]], None]:
        """The node check's compute probe, for ``join_when_ready`` to run before this agent
        joins a running job, and for its wait as a spare (``agent.checking.probe_ahead``)."""
        return lambda needed: probe_ahead(self._config, self._checked, events, needed)

    def _join(self, template: Template | None, peers: Peers | None, events: EventLog) -> None:
        """``join_when_ready``, which probes ahead where this agent comes to a running job; a
        spare there from the job's start probes while it waits (``Peers.while_spare``)."""
        probe = self._probe_ahead(events)
        if peers is not None:
            peers.while_spare(probe)
        join_when_ready(template, peers, lambda: probe(lambda: False))

    def run(self) -> int:
        """Run the job to the end; return 0 or raise ``JobFailed``/``Interrupted``/``RendezvousError``."""
        config = self._config
        raise_descriptor_limit()  # each worker takes several (pipes, a pidfd): soft limits are low
        # Bound first: a port in use stops the launch before anything is made or started.
        metrics = None
        if config.metrics.metrics_port is not None:
            metrics = MetricsServer(config.metrics.metrics_addr, config.metrics.metrics_port)
        try:
            return self._run_logged(metrics)
        finally:
            if metrics is not None:
                metrics.close()

    def _run_logged(self, metrics: MetricsServer | None) -> int:
        config = self._config
        wall_clock = WallClock.from_env(self._base_env)
        _check_master_wait(self._base_env)
        run_dir = make_run_dir(config.logs.log_dir, self._run_id)
        log.info("run directory: %s", run_dir)
        for note in config.not_applied:
            log.warning("%s", note)
        filters = (
            tuple(word.encode() for word in config.logs.duplicate_stdout_filters),
            tuple(word.encode() for word in config.logs.duplicate_stderr_filters),
        )
        events = EventLog(run_dir, wall_clock.now)
        files = RunFiles(run_dir)  # launcher.json, report.json: off the agent's thread
        if metrics is not None:
            events.listen(metrics.record)
            log.info("metrics: http://%s:%d/metrics", config.metrics.metrics_addr, metrics.port)
        recovery = RecoveryTracker()
        events.listen(recovery.add)
        status = StatusService(run_dir, events)
        self._say_start(events)
        try:
            code = self._run(run_dir, files, events, status, recovery, wall_clock, filters)
        except PhalanxError as exc:
            _job_end(events, files, exc)
            raise
        else:
            events.emit("job_end", outcome="succeeded", exit_code=code)
            return code
        finally:
            # The run directory may answer slowly (a struggling NFS): its last writes get a
            # bounded time, the report (written last) whatever of it remains.
            end = time.monotonic() + END_WRITES
            status.close()
            events.close()
            files.close(end)

    def _say_start(self, events: EventLog) -> None:
        config = self._config
        events.emit(
            "run_start",
            run_id=self._run_id,
            pid=os.getpid(),
            min_nodes=config.rendezvous.min_nodes,
            max_nodes=config.rendezvous.max_nodes,
            nproc_per_node=config.workers.nproc_per_node,
            max_restarts=config.recovery.max_restarts,
        )

    def _run(
        self,
        run_dir: Path,
        files: RunFiles,
        events: EventLog,
        status: StatusService,
        recovery: RecoveryTracker,
        wall_clock: WallClock,
        filters: tuple[tuple[bytes, ...], tuple[bytes, ...]],
    ) -> int:
        config = self._config
        with SignalWatcher(
            config.workers.signals_to_handle, stacks=True, preempt=config.recovery.preempt_signals,
            stop_marker=stop_marker(run_dir),
        ) as signals:  # fmt: skip
            write_launcher_file(files, signals)
            refuse_if_excluded(
                config.recovery.exclude_file, run_dir, this_node(config.rendezvous.local_addr)
            )
            # Entered before anything is started, so every process of the job is born in it.
            cgroup = JobCgroup.enter(f"phalanx-{run_dir.name}") if self._contain else None
            guardian = Guardian(cgroup, on_lost=lambda lost: guardian_lost(events, lost))
            template: Template | None = None
            rendezvous: RendezvousHandler | None = None
            supervisor: Supervisor | None = None
            try:
                template = open_warm(config.workers, self._base_env, run_dir)  # imports from now
                with signals.raising():  # connecting may wait up to join_timeout
                    rendezvous = self._open_rendezvous()
                    self._join(template, rendezvous.peers(), events)
                supervisor = self._supervisor(
                    guardian, template, rendezvous.peers(), events, filters, wall_clock
                )
                ends = Endings(config, rendezvous, signals, events, recovery)
                return self._play(Between(ends), supervisor, run_dir, status, files)
            finally:
                if template is not None:
                    template.close()
                if supervisor is not None:
                    supervisor.close()
                guardian.close()
                if cgroup is not None:
                    cgroup.leave()
                if rendezvous is not None:
                    rendezvous.shutdown()

    def _play(
        self,
        between: Between,
        supervisor: Supervisor,
        run_dir: Path,
        status: StatusService,
        files: RunFiles,
    ) -> int:
        """Run the rounds to their end, and report it (``agent.runend``)."""
        config, ends = self._config, between.ends
        rounds = Rounds(
            config, ends.rdzv, supervisor, ends.signals, run_dir, self._base_env, status,
            between, self._checked,
        )  # fmt: skip
        end = rounds.run()
        return Reporter(files, self._base_env, config.recovery.exclude_file).finish(end)

    def _supervisor(
        self,
        guardian: Guardian,
        template: Template | None,
        peers: Peers | None,
        events: EventLog,
        filters: tuple[tuple[bytes, ...], tuple[bytes, ...]],
        wall_clock: WallClock,
    ) -> Supervisor:
        """The run's supervisor, its workers guarded by this node's fence; and if this agent
        dies, its guardian tells the other nodes at once (``peers``' last word)."""
        config = self._config
        if peers is not None:
            peers.on_last_word(guardian.say)
        return Supervisor(
            guardian, shutdown_timeout=config.workers.shutdown_timeout,
            monitor_interval=config.workers.monitor_interval, console=self._console,
            launch_all=template.launch_all if template is not None else None,
            on_console_lost=lambda names, why: events.emit(
                "console_lost", streams=names, reason=why),
            duplicate_filters=filters, wall_clock=wall_clock.now,
            fence=peers.fence() if peers is not None else None,
        )  # fmt: skip


POLL = 0.25  # seconds between looks at the job while the warm start imports


def join_when_ready(
    template: Template | None, peers: Peers | None, probe_ahead: Callable[[], None] = lambda: None
) -> None:
    """An agent that comes to a running job -- started again after a crash, a spare, a node
    that scales the job up -- joins only once its warm start has imported (or was given up):
    joined before, the job's next round could take it and then wait for that import (issue
    41: 1.7-2.3 s more for an agent SIGKILL whose restarted agent was chosen). It joins at
    once when the job is not running without it (``Peers.job_running``): at the job's start,
    where waiting made the node with the slowest import (the store's host, in CI) arrive last
    and be left out as the spare; and as soon as a restart round waits for nodes, which
    below MIN fails at its last call without this one (the c10d soak's store_host_lost).
    Then, the job still running without it, ``probe_ahead``: the node check's compute probe,
    which the round that takes this node in would otherwise run after it formed."""
    if peers is None or not peers.job_running():
        return
    if template is not None:
        log.info("rendezvous: the job is running; joining once the warm start has imported")
        template.wait_ready(lambda: not peers.job_running(), POLL)
    if peers.job_running():
        probe_ahead()


def _check_master_wait(environ: Mapping[str, str]) -> None:
    """``PHALANX_MASTER_WAIT`` is read by each worker's boot (``worker.master``), which cannot
    stop the launch: a bad value is refused here, at start, as a usage error."""
    if master_wait(environ) is None:
        text = environ.get(WAIT_ENV, "").strip()
        raise UsageError(f"{WAIT_ENV}={text!r}: expected a number of seconds >= 0, like 1 or 0")
