"""One worker's place in a round (``supervisor.group``): the slot, its output wired to log
files and the console, its exit with the logs' tail, and the process-group kill."""

from __future__ import annotations

import contextlib
import os
import selectors
from dataclasses import dataclass, field, replace
from pathlib import Path

from phalanx.plan import RoundPlan, WorkerPlan
from phalanx.supervisor.console import Console
from phalanx.supervisor.exits import WorkerExit, read_error_file
from phalanx.supervisor.logs import LogFile, LogStream
from phalanx.supervisor.pipes import PipeSelector
from phalanx.supervisor.process import RunningWorker
from phalanx.worker.nofollow import make_dirs
from phalanx.worker.slowio import Answers

MKDIR_WAIT = 1.0  # seconds a worker's start waits for its log directory to be made
_DIRS: Answers[str] = Answers("phalanx-mkdir")
ERROR_FILE_WAIT = 2.0  # seconds an exit's handling waits to read the worker's error file
_ERRORS: Answers[str] = Answers("phalanx-error-files")


@dataclass
class Slot:
    """One worker's place in a round: its plan, its process, its log files and streams, and
    its exit once noticed."""

    plan: WorkerPlan
    proc: RunningWorker
    files: list[LogFile]
    exit: WorkerExit | None = None
    streams: list[LogStream] = field(default_factory=list)  # stdout, stderr


def wire_logs(
    slot: Slot,
    plan: RoundPlan,
    selector: PipeSelector,
    streams: dict[int, LogStream],
    console_: Console | None,
    duplicate_filters: tuple[tuple[bytes, ...], tuple[bytes, ...]],
) -> None:
    """Read ``slot``'s stdout and stderr from ``selector`` into its log files, the console
    where the plan shows the stream, and the filtered copies."""
    worker = slot.plan
    prefix = worker.console_prefix.encode()
    for index, (name, fd, path) in enumerate(
        (
            ("stdout", slot.proc.stdout_fd, worker.stdout_path),
            ("stderr", slot.proc.stderr_fd, worker.stderr_path),
        )
    ):
        handle = LogFile(path, selector.wake)
        slot.files.append(handle)
        console = (
            (console_, index) if console_ is not None and name in worker.console_streams else None
        )
        duplicate = None
        if duplicate_filters[index]:
            dup = LogFile(plan.attempt_dir / f"filtered_{name}.log", selector.wake)
            slot.files.append(dup)
            duplicate = (dup, duplicate_filters[index])
        os.set_blocking(fd, False)
        streams[fd] = LogStream(fd, handle, prefix, console, duplicate)
        selector.register(fd, selectors.EVENT_READ, streams[fd])
        slot.streams.append(streams[fd])


def with_logs(exit_: WorkerExit, slot: Slot) -> WorkerExit:
    if exit_.returncode == 0:
        return exit_
    return replace(
        exit_,
        stderr_tail=tuple(slot.streams[1].tail_lines()) if len(slot.streams) > 1 else (),
        error_message=_error_message(slot.plan.error_file),
    )


def _error_message(path: Path) -> str:
    """``read_error_file``, waiting at most ``ERROR_FILE_WAIT`` for the run directory: a slow
    one (a struggling NFS) costs the report the message (its stderr's tail is kept in memory),
    never the reaction to the exit its time."""
    return _ERRORS.ask(object(), lambda: read_error_file(path), ERROR_FILE_WAIT, stale=False) or ""


def running_workers(slots: list[Slot]) -> list[tuple[WorkerPlan, int]]:
    return [(s.plan, s.proc.pid) for s in slots if s.exit is None]


def process_state(pid: int) -> str:
    """``D (disk sleep)`` and the like, from ``/proc``; ``gone`` once it is."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("State:"):
                    return "in state " + line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "gone"


def killpg(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def make_log_dir(path: str) -> None:
    """Make a worker's log directory, waiting at most ``MKDIR_WAIT``: on a run directory that
    answers slowly (a struggling NFS) the worker starts anyway, and its log files' writer
    threads make the directory too before they open their file (``logs.LogFile``). A full
    disk: its ``LogFile`` says so, the job goes on. A symlink planted on the way is refused,
    not followed."""

    def make() -> str:
        with contextlib.suppress(OSError):
            make_dirs(path)
        return ""

    _DIRS.ask(object(), make, MKDIR_WAIT, stale=False)
