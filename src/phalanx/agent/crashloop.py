"""This node's evidence for the job-wide crash-loop verdict (``RendezvousHandler.judge_round``).

Progress during a round, on this node, is either of:

- a checkpoint completed by ``phalanx.checkpoint`` (a line added to the run directory's
  checkpoint log, ``CHECKPOINT_LOG_FILE``), by any local rank;
- a progress counter that moved (``phalanx.worker.progress``: an optimizer step,
  ``phalanx.step()``, ``phalanx.heartbeat()``), of any local rank.

A job with neither (no checkpoints, no optimizer, a ``--no-python`` binary) shows no
progress, so the same failure twice in a row is a crash loop there, as it always was. But
where the run directory cannot take a write (full, read-only, deleted) the evidence may
never have been written: progress is then unknown, and unknown counts as progress, never
as "none" (``unrecordable``). A job
that trains between failures is restarted within its budget even without checkpoints: a
crash that recurs after some training may be a flaky host, and restarting errs on the side
of the job (``--max-restarts`` bounds it).

The failure itself is judged job-wide: the signature of the round's root cause among every
node's failure records (``failure_signature``).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from phalanx.plan import RoundPlan
from phalanx.report.exits import root_cause
from phalanx.supervisor.exits import WorkerExit
from phalanx.worker import progress
from phalanx.worker.contract import CHECKPOINT_LOG_FILE
from phalanx.worker.nofollow import open_file
from phalanx.worker.slowio import Answers

log = logging.getLogger("phalanx")

EVIDENCE_WAIT = 1.0  # seconds a restart waits for the run directory's progress evidence
_EVIDENCE: Answers[_Evidence | str] = Answers("phalanx-evidence")

# A rank's counter file, as (inode, beats): a worker makes a new file when it starts, so a
# changed inode means the whole count is this round's.
_Counter = tuple[int, int]


def _count_lines(path: Path) -> int:
    try:
        with open(path, "rb") as handle:
            return sum(1 for _ in handle)
    except OSError:
        return 0


def _read_counter(path: Path) -> _Counter | None:
    try:
        inode = os.stat(path).st_ino
    except OSError:
        return None
    reading = progress.read_now(str(path))
    return None if reading is None else (inode, reading[0])


def _counter_paths(plan: RoundPlan) -> list[Path]:
    return [worker.log_dir / progress.FILE_NAME for worker in plan.workers]


@dataclass(frozen=True)
class _Evidence:
    checkpoints: int
    counters: Mapping[Path, _Counter | None]

    @classmethod
    def read(cls, plan: RoundPlan) -> _Evidence:
        checkpoints = _count_lines(plan.run_dir / CHECKPOINT_LOG_FILE)
        return cls(checkpoints, {path: _read_counter(path) for path in _counter_paths(plan)})


def _asked(question: Callable[[], _Evidence | str | None]) -> _Evidence | str | None:
    """``question()`` if the run directory answers it within ``EVIDENCE_WAIT``; else None
    (unknown): a failure's restart never waits for a slow filesystem (``worker.slowio``)."""
    return _EVIDENCE.ask(object(), question, EVIDENCE_WAIT, stale=False)


@dataclass(frozen=True)
class ProgressMark:
    """This node's progress evidence when a round starts (None: the run directory did not
    answer in time); ``progressed`` compares it with the same evidence when the round has
    ended."""

    evidence: _Evidence | None

    @classmethod
    def take(cls, plan: RoundPlan) -> ProgressMark:
        """Before the round's workers start. Counter files may be there already: an attempt
        directory is reused after a round re-formed for a scale-up."""
        found = _asked(lambda: _Evidence.read(plan))
        return cls(found if isinstance(found, _Evidence) else None)

    def progressed(self, plan: RoundPlan) -> bool:
        """Whether a local rank completed a checkpoint or moved its counter since ``take``;
        also True when that cannot be known (``unrecordable``, or the run directory did not
        answer within ``EVIDENCE_WAIT``): unknown is not "none"."""
        late = f"it did not answer within {EVIDENCE_WAIT:g} s"
        before = self.evidence
        now = _asked(lambda: _Evidence.read(plan)) if before is not None else None
        if not isinstance(now, _Evidence) or before is None:
            why: str | _Evidence | None = late
        elif _moved(before, now):
            return True
        else:  # "": a small write works, so an absent file means no progress
            why = _asked(lambda: unrecordable(plan.run_dir) or "")
            if why == "":
                return False
        why = why if isinstance(why, str) else late
        log.warning(
            "the progress of this node's ranks is unknown: %s cannot be written (%s), "
            "so their counters and checkpoint log may be missing; not taken for no "
            "progress (no crash-loop verdict on that basis)",
            plan.run_dir,
            why,
        )
        return True


def _moved(before: _Evidence, now: _Evidence) -> bool:
    if now.checkpoints > before.checkpoints:
        return True
    for path, counter in now.counters.items():
        last = before.counters.get(path)
        if counter is None:
            continue
        if last is None or last[0] != counter[0]:
            if counter[1] > 0:
                return True
        elif counter[1] > last[1]:
            return True
    return False


def unrecordable(run_dir: Path) -> str | None:
    """Why progress evidence cannot be written in ``run_dir`` now (a worker's counters, a
    checkpoint's log line), as ``strerror``; None when a small write there works. The
    workers' writes are best effort (a full, read-only or deleted run directory costs them
    a line, never the job), so an absent file there proves nothing. Probed with a write of
    a counter file's size, as the worker makes its own."""
    probe = run_dir / f".progress-probe.{os.getpid()}"
    try:
        fd = open_file(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, bytes(progress.LAYOUT.size))
        finally:
            os.close(fd)
    except OSError as exc:
        return exc.strerror or str(exc)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(probe)
    return None


def failure_signature(records: Sequence[Mapping[str, object]]) -> str:
    """The round's root cause among every node's failure records, as one line: rank, how
    it exited, the last line of its stderr when it wrote one ("" when no worker failed on its
    own)."""
    exits = [WorkerExit.from_json(r) for r in records if "returncode" in r and "rank" in r]
    cause = root_cause(exits)
    if cause is None:
        return ""
    last = next((line for line in reversed(cause.stderr_tail) if line.strip()), "").strip()
    head = f"rank {cause.rank}, {cause.describe_exit()}"
    return f"{head}: {last}" if last else head  # no stderr: no empty detail
