"""The four measurements, each for one launcher command (see ``bench.py``).

Times are wall-clock seconds between events that the workers and this process stamp with
``time.time()`` on the same machine. Every job runs in its own session and is killed by
process group if it outlives its timeout; its output goes to a log file kept for reading.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from phalanx.service.client import SERVICE_SHIM

WORKER = str(Path(__file__).with_name("bench_worker.py"))
JOB_TIMEOUT = 60.0  # a healthy job here takes seconds; a hung one is counted as failed
EXIT_POLL = 0.01  # how often the launcher's exit is looked for (and its tree listed)

# launcher name -> (nproc, max_restarts, log dir) -> command up to the script
Command = Callable[[int, int, str], list[str]]


class BenchError(RuntimeError):
    pass


def _start(command: list[str], log_path: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with open(log_path, "wb") as log:
        return subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, env=env,
        )  # fmt: skip


def _tree(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _finish(proc: subprocess.Popen[bytes], timeout: float = JOB_TIMEOUT) -> tuple[int, float]:
    """Wait for the launcher (its exit code, and the ``time.time()`` it was seen gone, within
    ``EXIT_POLL``); then end whatever of its tree is left but a warm service (said on
    stderr, each). torchrun gives every worker a session of its own, so killing the
    launcher's group misses them: a hung or orphaned torchrun worker would otherwise outlive
    the benchmark."""
    seen = {p.pid: p for p in _tree(proc.pid)}
    try:
        deadline = time.monotonic() + timeout
        while proc.poll() is None and time.monotonic() < deadline:
            seen.update((p.pid, p) for p in _tree(proc.pid))
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(EXIT_POLL)
        code = proc.wait(max(0.0, deadline - time.monotonic()))
        return code, time.time()
    finally:
        if proc.poll() is None:
            seen.update((p.pid, p) for p in _tree(proc.pid))
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for leftover in seen.values():
            if _outlives_by_design(leftover):
                print(f"bench: left the warm service, pid {leftover.pid}, alone: seen under "
                      f"launcher {proc.pid} while it detached", file=sys.stderr, flush=True)  # fmt: skip
                continue
            with contextlib.suppress(psutil.NoSuchProcess):
                named = _named(leftover)
                leftover.kill()  # psutil checks the create time: never a reused pid
                print(f"bench: SIGKILLed pid {leftover.pid}, seen under launcher "
                      f"{proc.pid}: {named}", file=sys.stderr, flush=True)  # fmt: skip


def _outlives_by_design(proc: psutil.Process) -> bool:
    """Whether ``proc`` is phalanx's warm service (``--keep-warm``), which outlives its
    launcher on purpose (the benchmark stops it itself). It detaches by forking once from the
    process its first launcher starts, so it is in that launcher's tree for a moment (a child
    of that process, until it exits): a sweep that caught it there SIGKILLed the service the
    next launch was to fork from (ci58: "the first launch's ranks are not the service's []")."""
    try:
        return SERVICE_SHIM in proc.cmdline()
    except psutil.Error:
        return False


def _named(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline())[:200]
    except psutil.Error:
        return "(gone)"


def _stamps(out_dir: Path, event: str, restart: int) -> dict[int, tuple[float, int]]:
    """rank -> (time, pid) for ``event`` in attempt ``restart``."""
    stamps = {}
    for path in out_dir.glob(f"{event}.{restart}.*"):
        if path.suffix != ".tmp":
            when, pid, *_ = path.read_text().split()
            stamps[int(path.name.rsplit(".", 1)[1])] = (float(when), int(pid))
    return stamps


class Job:
    """One launcher run of ``bench_worker.py SCENARIO`` in a scratch directory."""

    def __init__(
        self,
        command: Command,
        nproc: int,
        restarts: int,
        scenario: str,
        *args: str,
        env: dict[str, str] | None = None,
    ):
        self.dir = Path(tempfile.mkdtemp(prefix=f"bench-{scenario}-"))
        self.out = self.dir / "stamps"
        self.out.mkdir()
        self.log = self.dir / "launcher.log"
        self.nproc = nproc
        argv = command(nproc, restarts, str(self.dir / "logs"))
        self.started = time.time()
        command_env = {**os.environ, **(env or {})}
        self.proc = _start([*argv, WORKER, scenario, str(self.out), *args], self.log, command_env)

    def finish(self, expect_ok: bool = True) -> int:
        """Wait for the launcher to exit (``exited`` is then when it was seen gone)."""
        try:
            code, self.exited = _finish(self.proc)
        except subprocess.TimeoutExpired:
            raise BenchError(f"hung for {JOB_TIMEOUT:.0f} s (killed); see {self.log}") from None
        if expect_ok and code != 0:
            raise BenchError(f"launcher exited {code}; see {self.log}")
        return code

    def done(self, value: float) -> float:
        """The measurement succeeded: remove the scratch directory (failures keep theirs)."""
        shutil.rmtree(self.dir, ignore_errors=True)
        return value

    def stamps(self, event: str, restart: int) -> dict[int, tuple[float, int]]:
        return _stamps(self.out, event, restart)

    def all_ranks(self, event: str, restart: int) -> float:
        """The time the last rank stamped ``event``; fails unless every rank did."""
        stamps = self.stamps(event, restart)
        if len(stamps) != self.nproc:
            raise BenchError(f"{len(stamps)} of {self.nproc} ranks stamped {event}; see {self.log}")
        return max(when for when, _ in stamps.values())

    def wait_for_ranks(self, event: str, restart: int, timeout: float = JOB_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while len(self.stamps(event, restart)) < self.nproc:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise BenchError(f"ranks never all stamped {event}; see {self.log}")
            time.sleep(0.05)


def launch(command: Command, nproc: int) -> tuple[float, float]:
    """Seconds from starting the launcher to every rank past its first barrier, and to the
    launcher's exit (every rank returned from ``destroy_process_group`` and ended)."""
    job = Job(command, nproc, 0, "launch")
    job.finish()
    barrier = job.all_ranks("barrier", 0) - job.started
    return job.done(barrier), job.exited - job.started


def teardown(command: Command, nproc: int) -> float:
    """Seconds from a worker's SIGKILL (max restarts 0) to the launcher and every worker gone."""
    job = Job(command, nproc, 0, "kill")
    job.finish(expect_ok=False)
    gone = time.time()
    pids = [pid for _, pid in job.stamps("barrier", 0).values()]
    deadline = time.monotonic() + 30
    while any(_running(pid) for pid in pids):  # the launcher exited: are its workers gone too?
        if time.monotonic() > deadline:
            raise BenchError(f"workers {pids} outlived the launcher; see {job.log}")
        time.sleep(0.005)
        gone = time.time()
    (killed, _), = job.stamps("kill", 0).values()  # fmt: skip
    return job.done(gone - killed)


def restart(command: Command, nproc: int, env: dict[str, str] | None = None) -> float:
    """Seconds from a worker's SIGKILL (max restarts 1) to every rank past its first
    collective of the restarted attempt."""
    job = Job(command, nproc, 1, "kill", env=env)
    job.finish()
    (killed, _), = job.stamps("kill", 0).values()  # fmt: skip
    return job.done(job.all_ranks("barrier", 1) - killed)


def idle(
    commands: dict[str, Command], nproc: int, seconds: float
) -> dict[str, tuple[float, float, float]]:
    """Per launcher: its own CPU seconds, RSS and PSS (MiB) over ``seconds`` of idle workers.

    "Its own" is the launcher and every helper it started (phalanx: its guardian and its
    warm-start template), not the workers nor their children. The launchers run side by
    side, each with its own idle workers: this measures what each process spends, which
    does not depend on the other.
    """
    jobs = {name: Job(cmd, nproc, 0, "idle", str(seconds + 10)) for name, cmd in commands.items()}
    try:
        for job in jobs.values():
            job.wait_for_ranks("barrier", 0)
        time.sleep(1.0)  # past the start-up work of the launcher itself
        before = {name: _own(job) for name, job in jobs.items()}
        cpu0 = {name: _cpu(procs) for name, procs in before.items()}
        time.sleep(seconds)
        result = {}
        for name, job in jobs.items():
            procs = _own(job)
            rss = sum(p.memory_info().rss for p in procs) / 2**20
            pss = sum(p.memory_full_info().pss for p in procs) / 2**20
            result[name] = (_cpu(procs) - cpu0[name], rss, pss)
    finally:
        for job in jobs.values():
            job.finish()
    for job in jobs.values():
        job.done(0.0)
    return result


def _own(job: Job) -> list[psutil.Process]:
    workers = {pid for _, pid in job.stamps("barrier", 0).values()}
    launcher = psutil.Process(job.proc.pid)
    excluded = set(workers)
    for pid in workers:
        excluded |= {p.pid for p in psutil.Process(pid).children(recursive=True)}
    return [launcher, *(p for p in launcher.children(recursive=True) if p.pid not in excluded)]


def _cpu(procs: list[psutil.Process]) -> float:
    return sum(p.cpu_times().user + p.cpu_times().system for p in procs)


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
