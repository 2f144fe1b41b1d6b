"""How an agent run ended, as a value (``RunEnd``), and the one place that turns it into
what the user sees: its last lines, ``report.json``, a requeue, and the exit code.

The loop (``agent.loop``) and its ends (``agent.endings``, ``agent.between``) decide and
tell the other nodes; they return a ``RunEnd`` instead of raising on the way, so each way a
run ends is a value a test can compare. ``Reporter.finish`` says and writes it, in the order
of ``said``, and returns the exit code or raises the run's error (the CLI's and
``phalanx.spawn``'s contract: ``Agent.run`` returns 0 or raises)."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from phalanx.agent.filewriter import REPORT_FILE, RunFiles
from phalanx.environments import slurm
from phalanx.errors import PhalanxError
from phalanx.exclusion import requeue_exclusions

log = logging.getLogger("phalanx")


@dataclass(frozen=True)
class Said:
    """One thing said at the end: a launcher log line at ``level``, or (``level`` None) a
    text printed to stderr as it is (the framed report)."""

    text: str
    level: int | None = logging.INFO


@dataclass(frozen=True)
class RunEnd:
    """How a run ended. ``outcome``: succeeded, failed, interrupted or preempted;
    ``error``: what ``Agent.run`` raises (None: it returns 0); ``said``: the last lines, in
    order; ``report``: ``report.json`` (None: none is written, e.g. a signal during the exit
    barrier); ``requeue``: this node asks the scheduler to run the job again (``--requeue``
    on node rank 0 of a preempted job), after the report is written."""

    outcome: str
    error: PhalanxError | None = None
    said: tuple[Said, ...] = ()
    report: Mapping[str, object] | None = None
    requeue: bool = False

    @property
    def exit_code(self) -> int:
        return self.error.exit_code if self.error is not None else 0


def with_checked(data: Mapping[str, object], checked: tuple[str, ...]) -> dict[str, object]:
    """``report.json`` with the lines of the nodes the last node check named, if any."""
    return {**data, "node_check": list(checked)} if checked else dict(data)


class Reporter:
    """Turns a run's ``RunEnd`` into its lines, ``report.json``, requeue and exit code."""

    def __init__(
        self, files: RunFiles, base_env: Mapping[str, str], exclude_file: Path | None
    ) -> None:
        """``files``: the run directory's writer; ``base_env`` and ``exclude_file``: what a
        requeue needs (the scheduler's job, the nodes to keep out of the next run)."""
        self._files = files
        self._base_env = base_env
        self._exclude_file = exclude_file

    def finish(self, end: RunEnd) -> int:
        for said in end.said:
            if said.level is None:
                print(said.text, file=sys.stderr, flush=True)
            else:
                log.log(said.level, "%s", said.text)
        if end.report is not None:
            self._files.offer(REPORT_FILE, json.dumps(end.report, indent=2).encode())
        if end.requeue:
            slurm.requeue(self._base_env, requeue_exclusions(self._exclude_file))
        if end.error is not None:
            raise end.error
        return end.exit_code
