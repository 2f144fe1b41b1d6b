"""The hang corpus (issue 39): 8 kinds of hang and 8 healthy but irregular runs, each a
2-rank phalanx job of ``tests/workers/hang_case.py``, all run at once under the hang watch.

``run_corpus`` starts every case, watches each run's ``events.jsonl``, stops a hang case once
it is named (one case, ``fail_case``, is left to run into the second bound, where the round
fails), lets a healthy case run to its end, and returns what happened to each. Used by
``benchmarks/hang_corpus.py`` (real scale, phalanx's defaults: the published table) and by
``tests/supervisor/test_hang_corpus.py`` (time scaled down, the floor and grace with it).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HANGS = ("asleep_collective", "python_loop", "mismatched_collectives", "sigstop", "io_fuse",
         "deadlock", "dataloader_dead", "c_call")  # fmt: skip
HEALTHY = ("checkpoint_save", "eval", "first_step_40s", "jitter", "decay", "gc_pauses",
           "loader_stalls", "straggler")  # fmt: skip
# A rank silent for a while that then moves again: named, "moves again", the job goes on.
# Not part of the corpus's figures (it is neither a hang nor a healthy run).
RESUMES = "stall_then_resume"
# A rank in a phalanx.pause() for twice the floor (under the grace): not named. Not part of
# the figures either.
PAUSES = "long_pause"
EXTRA = (RESUMES, PAUSES)
TORCH = {"asleep_collective", "mismatched_collectives", "checkpoint_save", "dataloader_dead"}
WORKER = Path(__file__).parents[1] / "workers" / "hang_case.py"


@dataclass
class Case:
    name: str
    directory: Path
    watch: str  # --hang-watch ("" for none: phalanx's default)
    stop_when_named: bool
    started: float = 0.0
    stopping: bool = False
    launcher: subprocess.Popen[bytes] | None = None
    events: list[dict[str, Any]] = field(default_factory=list)

    @property
    def hang(self) -> bool:
        return self.name in HANGS

    def run_dir(self) -> Path | None:
        found = sorted((self.directory / "logs").glob("*/events.jsonl"))
        return found[0].parent if found else None

    def read_events(self) -> None:
        run_dir = self.run_dir()
        if run_dir is not None:
            lines = (run_dir / "events.jsonl").read_text().splitlines()
            self.events = [json.loads(line) for line in lines if line.endswith("}")]

    def of(self, kind: str, **fields: Any) -> list[dict[str, Any]]:
        return [
            e for e in self.events
            if e["kind"] == kind and all(e.get(k) == v for k, v in fields.items())
        ]  # fmt: skip


@dataclass(frozen=True)
class Outcome:
    case: str
    hang: bool  # a hang case (else healthy)
    named: bool  # the hang watch named a rank
    ranks: list[int]  # the ranks it named first
    suspects: list[int]
    bound: float | None  # the bound they were named at
    to_verdict: float | None  # seconds from the fault (the worker's mark) to the naming
    failed: bool  # the round failed as a hang (the second bound)
    resumed: bool  # a "hang_over": a named rank moved again
    longest: float | None  # a healthy run's longest silence between two steps (any rank)
    hung: list[int]  # the ranks status.json last called hung
    returncode: int | None
    stderr: str

    @property
    def correct(self) -> bool:
        return self.named == self.hang


def run_corpus(
    tmp: Path,
    *,
    scale: float,
    watch: str,
    deadline: float,
    cases: Sequence[str] = (*HANGS, *HEALTHY),
    fail_case: str | None = None,
    fail_watch: str = "",
) -> list[Outcome]:
    """Every case at once; stopped at ``deadline`` seconds whatever happened."""
    from support.tools import hang_filesystem

    with contextlib.ExitStack() as stack:
        fs, switch = (None, None)
        if "io_fuse" in cases:
            (tmp / "fuse").mkdir()
            fs, switch = stack.enter_context(hang_filesystem(tmp / "fuse"))
            switch.touch()  # frozen from the start; only the hung rank ever writes there
        stops = {name: name in HANGS and name != fail_case for name in cases}
        watches = {name: fail_watch if name == fail_case else watch for name in cases}
        jobs = [Case(name, tmp / name, watches[name], stops[name]) for name in cases]
        with _running(jobs, scale, fs):
            _watch(jobs, deadline)
        return [_outcome(job) for job in jobs]


@contextlib.contextmanager
def _running(jobs: list[Case], scale: float, fs: Path | None) -> Iterator[None]:
    try:
        for job in jobs:
            _start(job, scale, fs)
        yield
    finally:
        for job in jobs:
            if job.launcher is not None and job.launcher.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(job.launcher.pid, signal.SIGKILL)
                job.launcher.wait(30)


def _start(job: Case, scale: float, fs: Path | None) -> None:
    job.directory.mkdir(parents=True)
    env = {
        **os.environ,
        "HANG_SCALE": str(scale),
        "HANG_MARK": str(job.directory / "mark"),
        "HANG_CKPT": str(job.directory / "ckpt"),
        "HANG_GAPS": str(job.directory / "gaps"),
        "HANG_FS": str(fs or ""),
    }
    argv = [sys.executable, "-m", "phalanx", "--nproc-per-node", "2", "--max-restarts", "0",
            "--log-dir", str(job.directory / "logs"),
            *([] if job.name in TORCH else ["--cold-start"]),  # no torch: no template
            *(["--hang-watch", job.watch] if job.watch else []),
            str(WORKER), job.name]  # fmt: skip
    with open(job.directory / "stdout", "wb") as out, open(job.directory / "stderr", "wb") as err:
        job.launcher = subprocess.Popen(argv, stdout=out, stderr=err, env=env, start_new_session=True)  # fmt: skip
    job.started = time.monotonic()


def _watch(jobs: list[Case], deadline: float) -> None:
    """Until every job ended (a named hang is stopped with SIGTERM, as a person would)."""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        live = [job for job in jobs if job.launcher is not None and job.launcher.poll() is None]
        if not live:
            return
        for job in live:
            job.read_events()
            if job.stop_when_named and not job.stopping and job.of("hang", action="named"):
                job.stopping = True  # once: a second SIGTERM would cut phalanx's stop short
                with contextlib.suppress(ProcessLookupError):
                    os.kill(live_pid(job), signal.SIGTERM)
        time.sleep(0.25)
    for job in jobs:
        job.read_events()


def live_pid(job: Case) -> int:
    assert job.launcher is not None
    return job.launcher.pid


def _outcome(job: Case) -> Outcome:
    job.read_events()
    named = job.of("hang", action="named")
    first = named[0] if named else {}
    mark = job.directory / "mark"
    fault = float(mark.read_text()) if mark.exists() and mark.read_text() else None
    to_verdict = round(first["t"] - fault, 1) if first and fault is not None else None
    launcher = job.launcher
    return Outcome(
        case=job.name,
        hang=job.hang,
        named=bool(named),
        ranks=list(first.get("ranks") or []),
        suspects=list(first.get("suspects") or []),
        bound=first.get("bound"),
        to_verdict=to_verdict,
        failed=bool(job.of("hang", action="failed")),
        resumed=bool(job.of("hang_over")),
        longest=max((float(g.read_text()) for g in job.directory.glob("gaps.*")), default=None),
        hung=_hung(job),
        returncode=launcher.returncode if launcher is not None else None,
        stderr=(job.directory / "stderr").read_text(errors="replace")[-3000:],
    )


def _hung(job: Case) -> list[int]:
    run_dir = job.run_dir()
    if run_dir is None or not (run_dir / "status.json").exists():
        return []
    status = json.loads((run_dir / "status.json").read_text())
    return [r["rank"] for r in status["ranks"] if r.get("hung")]


def figures(outcomes: Sequence[Outcome]) -> tuple[float, float]:
    """(precision, recall) of the verdicts: named hangs over all named, and over all hangs."""
    judged = [o for o in outcomes if o.case not in EXTRA]
    named = [o for o in judged if o.named]
    hangs = [o for o in judged if o.hang]
    true = [o for o in named if o.hang]
    precision = len(true) / len(named) if named else 1.0
    recall = len(true) / len(hangs) if hangs else 1.0
    return precision, recall


def table(outcomes: Sequence[Outcome]) -> list[str]:
    """The corpus's table, in Markdown."""
    rows = ["| case | kind | verdict | time to verdict (s) | bound (s) | fails at (s) | suspects "
            "| longest silence (s) |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for o in outcomes:
        if o.case in EXTRA:
            continue
        verdict = ("named" if o.named else "not named") + ("" if o.correct else " (WRONG)")
        bound = f"{o.bound:g}" if o.bound else "-"
        fails = f"{10 * o.bound:g}" if o.bound and o.hang else "-"
        suspects = ", ".join(f"rank {r}" for r in o.suspects) or "-"
        to_verdict = f"{o.to_verdict:g}" if o.to_verdict is not None else "-"
        kind = "hang" if o.hang else "healthy"
        longest = f"{o.longest:g}" if o.longest is not None else "-"
        rows.append(f"| {o.case} | {kind} | {verdict} | {to_verdict} | {bound} | {fails} | {suspects} | {longest} |")  # fmt: skip
    precision, recall = figures(outcomes)
    judged = sum(o.case not in EXTRA for o in outcomes)
    rows.append(f"\nprecision {precision:.2f}, recall {recall:.2f} ({judged} cases)")
    return rows
