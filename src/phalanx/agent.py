"""The node agent: rendezvous -> plan -> supervise -> restart within budget or report."""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import BinaryIO

from phalanx.config import LaunchConfig
from phalanx.errors import Interrupted, JobFailed, RendezvousError
from phalanx.plan import build_plan
from phalanx.rendezvous.api import RendezvousHandler
from phalanx.report import WorkerExit, format_report, root_cause
from phalanx.supervisor.group import Launch, Outcome, Supervisor
from phalanx.supervisor.guardian import Guardian
from phalanx.supervisor.process import exec_worker
from phalanx.supervisor.signals import SignalWatcher

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
    def __init__(
        self,
        config: LaunchConfig,
        rendezvous: RendezvousHandler,
        base_env: Mapping[str, str] | None = None,
        *,
        launch: Launch = exec_worker,
        console: tuple[BinaryIO, BinaryIO] | None = None,
    ) -> None:
        self._config = config
        self._rdzv = rendezvous
        self._base_env = dict(os.environ if base_env is None else base_env)
        self._launch = launch
        self._console = console or (sys.stdout.buffer, sys.stderr.buffer)

    def run(self) -> int:
        """Run the job to the end; return 0 or raise ``JobFailed``/``Interrupted``/``RendezvousError``."""
        config = self._config
        run_dir = make_run_dir(config, self._rdzv.run_id)
        checkpoint_log = run_dir / "checkpoints.jsonl"
        log.info("run directory: %s", run_dir)
        filters = (
            tuple(word.encode() for word in config.duplicate_stdout_filters),
            tuple(word.encode() for word in config.duplicate_stderr_filters),
        )
        all_exits: list[WorkerExit] = []
        previous: tuple[int, int, str] | None = None
        attempts = 0
        with SignalWatcher(config.signals_to_handle) as signals:
            guardian = Guardian()
            try:
                supervisor = Supervisor(
                    guardian,
                    shutdown_timeout=config.shutdown_timeout,
                    monitor_interval=config.monitor_interval,
                    launch=self._launch,
                    console=self._console,
                    duplicate_filters=filters,
                )
                while True:
                    rdzv = self._rdzv.next_round(config.nproc_per_node)
                    plan = build_plan(config, rdzv, run_dir, self._base_env)
                    checkpoints_before = _count_lines(checkpoint_log)
                    attempts += 1
                    result = supervisor.run(plan, signals, self._rdzv.poll)
                    all_exits = list(result.exits)
                    if result.outcome is Outcome.SUCCEEDED:
                        self._rdzv.report_done(True)
                        log.info("all %d workers finished", len(result.exits))
                        return 0
                    if result.outcome is Outcome.INTERRUPTED:
                        assert result.signum is not None
                        self._rdzv.report_done(False)
                        raise Interrupted(result.signum)
                    cause = root_cause(all_exits)
                    if cause is not None:
                        self._rdzv.report_failure(cause.to_json())
                        log.warning(
                            "rank %d %s (attempt %d)", cause.rank, cause.describe_exit(), attempts
                        )
                        signature = _failure_signature(cause)
                        no_progress = _count_lines(checkpoint_log) == checkpoints_before
                        if signature == previous and no_progress:
                            self._fail(run_dir, all_exits, attempts, crash_loop=True)
                        previous = signature
                    elif result.event is not None:
                        log.warning(
                            "stopping local workers: %s %s",
                            result.event.kind.value,
                            result.event.detail,
                        )
                    if not self._rdzv.claim_restart(config.max_restarts):
                        self._fail(run_dir, all_exits, attempts, crash_loop=False)
                    log.warning(
                        "restarting the worker group (restart %d of %d)",
                        attempts,
                        config.max_restarts,
                    )
            finally:
                guardian.close()
                self._rdzv.shutdown()

    def _fail(
        self, run_dir: Path, exits: list[WorkerExit], attempts: int, *, crash_loop: bool
    ) -> None:
        self._rdzv.report_done(False)
        report = format_report(exits, attempts)
        if crash_loop:
            report += (
                "\nphalanx: crash loop: the same failure happened twice in a row with no new "
                "checkpoint in between; not spending the remaining restarts."
            )
        print(report, file=sys.stderr, flush=True)
        (run_dir / "report.json").write_text(
            json.dumps(
                {
                    "attempts": attempts,
                    "crash_loop": crash_loop,
                    "exits": [e.to_json() for e in exits],
                },
                indent=2,
            )
        )
        cause = root_cause(exits)
        if cause is None:
            raise RendezvousError("the job stopped because another node failed or left")
        raise JobFailed(f"rank {cause.rank} {cause.describe_exit()}", cause.exit_code)
