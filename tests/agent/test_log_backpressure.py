"""Output faster than its log file reaches the file whole (docs/explanation/faults.md): a
worker that writes faster than its log file is written waits on its pipe, as on a slow
terminal; the launcher's memory stays bounded; only a file that makes no progress
for ``STALL`` seconds is given up on, and the job goes on without it; one whose writes go
slowly but go on is never given up, however long it takes."""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path

import pytest

from phalanx.supervisor.logs import STALL, LogFile, finish_all
from support.flood import long_line, numbered_lines
from support.launch import PHALANX, wait_for, worker
from support.tools import hang_filesystem

MIB = 100  # per stream: stdout in lines, stderr in one line
HANG = 600.0  # a bound that only catches a hang (the machine is shared and slow)
# Runs its arguments (after the first) and writes to the first the peak memory (KiB) of
# the largest process it waited for.
PEAK = (
    "import pathlib, resource, subprocess, sys; code = subprocess.call(sys.argv[2:]); "
    "peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss; "
    "pathlib.Path(sys.argv[1]).write_text(str(peak)); sys.exit(code)"
)


def _digest(chunks: Iterable[bytes]) -> tuple[int, str]:
    size, sha = 0, hashlib.sha256()
    for chunk in chunks:
        size += len(chunk)
        sha.update(chunk)
    return size, sha.hexdigest()


def _file_digest(path: Path) -> tuple[int, str]:
    with open(path, "rb") as handle:
        return _digest(iter(lambda: handle.read(1 << 20), b""))


def _flood(logs: Path, console: list[str], mib: int) -> tuple[int, str, float]:
    """Run flood.py MIB under phalanx (its console to /dev/null, its stderr to a file):
    (exit code, phalanx's own lines on stderr, the launcher's peak memory in MiB)."""
    argv = [*PHALANX, "--cold-start", "--log-dir", str(logs), *console, worker("flood.py")]
    peak, err_path = logs.parent / f"{logs.name}.peak", logs.parent / f"{logs.name}.err"
    with open(err_path, "wb") as err:
        code = subprocess.call(
            [sys.executable, "-c", PEAK, str(peak), *argv, str(mib)],
            stdout=subprocess.DEVNULL, stderr=err, timeout=HANG, start_new_session=True,
        )  # fmt: skip
    with open(err_path, "rb") as err:  # with --tee, the 100 MiB line is there too
        said = [line.decode() for line in err if line.startswith(b"phalanx: ")]
    return code, "".join(said), int(peak.read_text()) / 1024


@pytest.mark.parametrize("console", [["--redirects", "3"], ["--tee", "3"]], ids=["files", "tee"])
def test_every_byte_of_fast_output_reaches_a_slower_log_filesystem(
    tmp_path: Path, console: list[str]
) -> None:
    """100 MiB of lines on stdout and a 100 MiB line without a newline on stderr, written as
    fast as the worker can into a --log-dir on a filesystem slower than the pipes (FUSE,
    answering every write), with the log files only and with the console too: both files
    hold every byte (size and checksum), nothing is said about them, and the launcher's
    peak memory stays within a few MiB of a quiet job's (its pipes were read no faster
    than the files were written)."""
    with hang_filesystem(tmp_path) as (mount, _):
        code, said, quiet = _flood(tmp_path / "quiet", console, 1)
        assert code == 0, said
        code, said, peak = _flood(mount / "logs", console, MIB)
        assert code == 0, said
        (rank_dir,) = (mount / "logs").glob("*/attempt_0/rank_0")
        assert _file_digest(rank_dir / "stdout.log") == _digest(numbered_lines(MIB))
        assert _file_digest(rank_dir / "stderr.log") == _digest(long_line(MIB))
    assert "cannot write" not in said and "did not finish" not in said, said
    assert peak < quiet + 16, f"{peak:.0f} MiB copying {2 * MIB} MiB, {quiet:.0f} MiB quiet"


def test_a_log_file_stuck_under_fast_output_is_given_up_and_the_job_goes_on(
    tmp_path: Path,
) -> None:
    """The log filesystem stops answering while a worker floods it: the worker waits on its
    pipe until the file has made no progress for STALL seconds, then the file is given up
    on, said once per file with the time, and the job runs to its end (exit 0) while still frozen."""
    err_path = tmp_path / "console.err"
    with hang_filesystem(tmp_path) as (mount, switch):
        with open(err_path, "wb") as err:
            launcher = subprocess.Popen(
                [*PHALANX, "--cold-start", "--log-dir", str(mount), "--redirects", "3",
                 worker("flood.py"), str(MIB)],
                stdout=subprocess.DEVNULL, stderr=err, start_new_session=True,
            )  # fmt: skip
        try:
            wait_for(
                lambda: any(p.stat().st_size for p in mount.glob("*/attempt_0/rank_0/stdout.log")),
                HANG, "the first bytes in the log file",
            )  # fmt: skip
            switch.touch()  # every write to the mount hangs from now on
            wait_for(
                lambda: "all 1 workers finished" in err_path.read_text(), HANG,
                "the job's end, still frozen",
            )  # fmt: skip
        finally:
            switch.unlink(missing_ok=True)
            try:
                launcher.wait(HANG)  # its stuck writes end once the mount answers
            finally:
                if launcher.poll() is None:
                    os.killpg(launcher.pid, signal.SIGKILL)
                    launcher.wait(10)
    said = err_path.read_text()
    assert launcher.returncode == 0, said
    stuck = [line for line in said.splitlines() if f"(no progress for {STALL:g} s" in line]
    named = sorted(line.split(" (no progress")[0].rsplit("/", 1)[1] for line in stuck)
    assert named == ["stderr.log", "stdout.log"], said  # once each: its stderr floods next
    assert "Traceback" not in said


def _drain_slowly(fd: int, into: bytearray, every: float, done: threading.Event) -> None:
    """Read a page from the FIFO ``fd`` (non-blocking) every ``every`` seconds until its
    writer closes it (or ``HANG``): the slow file server the writer waits on."""
    deadline = time.monotonic() + HANG
    while time.monotonic() < deadline:
        time.sleep(every)  # the slow reader itself, not a test's synchronisation
        try:
            page = os.read(fd, 4096)
        except BlockingIOError:
            continue
        if not page:
            break
        into += page
    done.set()


def test_a_log_file_still_being_written_after_the_stall_limit_is_not_given_up(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The real ``LogFile`` writing to a file whose every write waits in the kernel (a FIFO
    of one page that the test reads a page from every 0.5 s, as a slow file server takes
    it): its writes take well over ``STALL`` seconds in all but each makes progress, so the
    file is never taken for stalled (what the pipes' reader asks while it waits on the
    file), ``finish_all`` waits for the last byte, and nothing is said."""
    path = tmp_path / "stdout.log"
    os.mkfifo(path)
    reader = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    fcntl.fcntl(reader, fcntl.F_SETPIPE_SZ, 4096)
    every = 0.5
    pages = int(STALL / every) + 8  # about STALL + 4 s of writing
    data = b"".join(f"{i:4095d}\n".encode() for i in range(pages))
    received, drained = bytearray(), threading.Event()
    drainer = threading.Thread(target=_drain_slowly, args=(reader, received, every, drained))
    stalled: list[float] = []
    began = time.monotonic()
    try:
        drainer.start()
        with caplog.at_level(logging.WARNING, logger="phalanx"):
            handle = LogFile(path)
            for i in range(pages):
                assert handle.write(data[i * 4096 : (i + 1) * 4096])

            def watch() -> None:
                while not drained.wait(every / 2):
                    if handle.stalled():
                        stalled.append(time.monotonic() - began)
                        return

            watcher = threading.Thread(target=watch)
            watcher.start()
            finish_all([handle])  # the launcher's end: closing, with most bytes still to go
            drainer.join(HANG)
            watcher.join(HANG)
    finally:
        os.close(reader)
    assert time.monotonic() - began > STALL  # the writes did go on past the limit
    assert stalled == [] and not handle.given_up, stalled
    assert bytes(received) == data
    assert [r.getMessage() for r in caplog.records] == []
