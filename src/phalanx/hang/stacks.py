"""Python stacks of running workers: ask for them, wait for them, parse them.

A worker's stack is dumped by its own ``faulthandler`` (installed by
``phalanx.worker.boot``) when it receives ``STACK_SIGNAL``: into ``<rank dir>/stacks.txt``,
from inside the signal handler, so it works while the main thread is blocked in C++ (a
collective, a sleep). The signal is sent only to a process that catches it (``SigCgt`` in
``/proc/PID/status``), never to one that would die of it (a ``--no-python`` program, a
worker that has not reached the worker-side code yet). Where ``py-spy`` is on PATH its
``dump --native`` output (native frames too) goes to ``<rank dir>/py-spy.txt`` as well; for a
process without phalanx's worker-side code (``--spawn-owner``, ``--no-python``) it is the only
dump, taken with ``--subprocesses`` so that the ranks such a program spawns are covered.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

from phalanx.worker.contract import STACK_SIGNAL, STACKS_FILE
from phalanx.worker.nofollow import append_to

log = logging.getLogger("phalanx")

SETTLE = 0.1  # a dump is complete once its file stopped growing for this long
PY_SPY_TIMEOUT = 10.0
DUMP_TIMEOUT = 5.0  # for the faulthandler dumps of one node's ranks
# The longest one node's dump can take: faulthandler and py-spy are asked together, for every
# rank at once, and each kind has one deadline for all; a node waiting for its peers' dumps
# waits this plus a margin for noticing the request.
LONGEST_DUMP = max(DUMP_TIMEOUT, PY_SPY_TIMEOUT)
PEER_DUMP_WAIT = LONGEST_DUMP + 5.0


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    func: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line} in {self.func}"


@dataclass(frozen=True)
class ThreadStack:
    header: str  # faulthandler's: "Thread 0x7f..." or "Current thread 0x7f..."
    frames: tuple[Frame, ...]  # innermost first, as faulthandler writes them


@dataclass(frozen=True)
class DumpTarget:
    rank: int
    pid: int
    rank_dir: Path

    @property
    def stacks_file(self) -> Path:
        return self.rank_dir / STACKS_FILE


# Frames that are not the user's code: the standard library, installed packages, phalanx's
# worker bootstrap.
_LIBRARY = tuple(
    {
        os.path.dirname(os.__file__),
        sys.prefix,
        sys.base_prefix,
        "site-packages",
        "dist-packages",
        "/phalanx/worker/",
    }
)
_THREAD = re.compile(r"^(?:Current thread|Thread) 0x[0-9a-fA-F]+|^Stack \(most recent call first\)")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')
_OWN = ("/phalanx/worker/boot.py", "/phalanx/worker/become.py", "/phalanx/worker/template.py")


def parse_dump(text: str) -> list[ThreadStack]:
    """faulthandler's output -> one ``ThreadStack`` per thread (other lines are skipped)."""
    threads: list[ThreadStack] = []
    header, frames = "", list[Frame]()
    for line in text.splitlines():
        if _THREAD.match(line):
            if header:
                threads.append(ThreadStack(header, tuple(frames)))
            header, frames = line.split(" (most recent")[0], []
        elif header and (match := _FRAME.match(line)):
            frames.append(Frame(match.group(1), int(match.group(2)), match.group(3)))
    if header:
        threads.append(ThreadStack(header, tuple(frames)))
    return threads


def where(frames: Sequence[Frame]) -> str:
    """The innermost frame, and the innermost frame of the user's code when that is another:
    ``".../distributed_c10d.py:3252 in all_reduce <- /job/train.py:15 in <module>"``."""
    if not frames:
        return ""
    user = next((f for f in frames if not _is_library(f)), None)
    inner = str(frames[0])
    return inner if user is None or user == frames[0] else f"{inner} <- {user}"


def _is_library(frame: Frame) -> bool:
    return frame.file.startswith("<") or any(part in frame.file for part in _LIBRARY)


def main_thread(threads: Sequence[ThreadStack]) -> ThreadStack | None:
    """The thread running the user's script: the one under phalanx's bootstrap frames, else
    the first one not started by ``threading`` (faulthandler does not label threads)."""
    for thread in threads:
        if any(frame.file.endswith(_OWN) for frame in thread.frames):
            return thread
    for thread in threads:
        if not (thread.frames and thread.frames[-1].file.endswith("threading.py")):
            return thread
    return threads[0] if threads else None


def fatal_frame(stacks_file: Path) -> str:
    """Where Python was when a fatal signal hit (the last ``Fatal Python error`` section)."""
    try:
        text = stacks_file.read_text(errors="replace")
    except OSError:
        return ""
    start = text.rfind("Fatal Python error:")
    if start < 0:
        return ""
    threads = parse_dump(text[start:])
    crashed = next((t for t in threads if t.header.startswith("Current thread")), None)
    thread = crashed or main_thread(threads)
    return where(thread.frames) if thread is not None else ""


def catches(pid: int, signum: int) -> bool:
    """Whether ``pid`` has a handler for ``signum`` (so the signal will not kill it)."""
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) & (1 << (signum - 1)))
    except (OSError, ValueError):
        pass
    return False


def _ended(pid: int, proc: str = "/proc") -> bool:
    """Whether ``pid`` has exited (gone, or a zombie its parent has not reaped yet)."""
    try:
        with open(f"{proc}/{pid}/stat") as handle:
            state = handle.read().rpartition(")")[2].split()[:1]
    except OSError:
        return True
    return state in (["Z"], ["X"])


def _mark(path: Path, line: str) -> None:
    # O_APPEND, as the worker's faulthandler: the line and the dump never overlap.
    with contextlib.suppress(OSError), os.fdopen(append_to(path), "a") as handle:
        handle.write(line)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def request_dumps(
    targets: Sequence[DumpTarget],
    why: str,
    timeout: float = DUMP_TIMEOUT,
    py_spy_timeout: float = PY_SPY_TIMEOUT,
    native: Collection[int] | None = None,
) -> dict[int, str]:
    """Signal every target that catches ``STACK_SIGNAL``; return each rank's new dump text
    ("" when it has no handler or wrote nothing before ``timeout``). A line saying ``why``
    goes before each dump in the rank's ``stacks.txt``. Where py-spy is installed it dumps
    the ranks in ``native`` (None: all) and every rank that does not catch the signal (its
    only dump); the call waits for those dumps too.

    Every rank is asked at once and every wait shares one deadline: however many ranks are
    stuck (a py-spy attached to a process frozen in the kernel never returns), the call
    takes at most ``max(timeout, py_spy_timeout)``, not that times the number of ranks."""
    waiting: dict[int, DumpTarget] = {}
    catching = {t.rank for t in targets if catches(t.pid, STACK_SIGNAL)}
    for target in targets:
        if target.rank in catching:
            _mark(target.stacks_file, f"--- {why}, requested by phalanx at {time.ctime()} ---\n")
    before = {t.rank: _size(t.stacks_file) for t in targets}
    for target in targets:
        if target.rank in catching:
            with contextlib.suppress(ProcessLookupError):
                os.kill(target.pid, STACK_SIGNAL)
                waiting[target.rank] = target
    started = time.monotonic()
    spied = [t for t in targets if native is None or t.rank in native or t.rank not in catching]
    pyspy = _start_py_spy(spied, catching)
    last = dict(before)
    quiet_since: dict[int, float] = {}
    deadline = started + timeout
    while waiting and time.monotonic() < deadline:
        time.sleep(0.02)
        now = time.monotonic()
        for rank, target in list(waiting.items()):
            size = _size(target.stacks_file)
            if size != last[rank]:
                last[rank], quiet_since[rank] = size, now
            elif size > before[rank] and now - quiet_since.get(rank, now) >= SETTLE:
                del waiting[rank]
            elif size == before[rank] and (_ended(target.pid) or _stopped(target.pid)):
                # It died before it could dump (a peer's rank stopped: its collective failed
                # as the dump was asked for), or it is stopped (SIGSTOP: it dumps only once
                # continued): nothing will come in time, and the job waits on this.
                del waiting[rank]
    _finish_py_spy(pyspy, started + py_spy_timeout, py_spy_timeout)
    texts = {t.rank: _read_from(t.stacks_file, before[t.rank]) for t in targets}
    for rank, (_, out, offset) in pyspy.items():
        if rank not in catching:
            texts[rank] = _read_from(out, offset)
    return texts


def _stopped(pid: int) -> bool:
    """Whether ``pid`` is stopped (state T or t in ``/proc/PID/stat``)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            state = handle.read().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return state in ("T", "t")


def _read_from(path: Path, offset: int) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(offset)
            return handle.read().decode(errors="replace")
    except OSError:
        return ""


PySpyRuns = dict[int, tuple[subprocess.Popen[bytes], Path, int]]  # rank -> (proc, file, offset)


def _start_py_spy(targets: Sequence[DumpTarget], catching: set[int]) -> PySpyRuns:
    """``py-spy dump --native`` for every target, in parallel, when py-spy is installed; with
    ``--subprocesses`` for a target without phalanx's worker-side code (not in ``catching``):
    a spawn owner's ranks are its children."""
    exe = shutil.which("py-spy")
    started: PySpyRuns = {}
    for target in targets if exe else ():
        out = target.rank_dir / "py-spy.txt"
        command = [str(exe), "dump", "--native", "--pid", str(target.pid)]
        if target.rank not in catching:
            command.append("--subprocesses")
        try:
            offset = _size(out)
            with os.fdopen(append_to(out), "ab") as handle:
                handle.write(f"--- py-spy dump at {time.ctime()} ---\n".encode())
                handle.flush()
                proc = subprocess.Popen(
                    command, stdin=subprocess.DEVNULL, stdout=handle, stderr=subprocess.STDOUT
                )
        except OSError:
            continue
        started[target.rank] = (proc, out, offset)
        log.debug("stacks: py-spy started for rank %d (pid %d)", target.rank, target.pid)
    return started


def _finish_py_spy(started: PySpyRuns, deadline: float, timeout: float) -> None:
    """Wait for every py-spy run until the one ``deadline`` they share, then kill the ones
    still running together (each gets a line in its file saying it gave no dump)."""
    running = dict(started)
    while running:
        for rank, (proc, _, _) in list(running.items()):
            if proc.poll() is not None:
                del running[rank]
        if not running or time.monotonic() >= deadline:
            break
        time.sleep(0.02)
    if not running:
        return
    log.warning(
        "stacks: py-spy gave no dump within %g s for rank(s) %s (a process stuck in the "
        "kernel?); killed",
        timeout,
        ", ".join(str(rank) for rank in sorted(running)),
    )
    for proc, _, _ in running.values():
        proc.kill()
    for proc, out, _ in running.values():
        proc.wait()
        _mark(out, f"--- py-spy gave no dump within {timeout:g} s; killed ---\n")
