"""A stop signal that comes while phalanx writes one of its own lines, where it waits on
others, still stops it. There the signal raises ``Interrupted`` from whatever runs, and a
line's write is where a launcher with a slow stderr (a full pipe, a stalled terminal) spends
its time; ``logging`` catches every ``Exception`` in a write, and used to print
"--- Logging error ---" and go on waiting as if no signal had come.

A real process, a real pipe kept full, a real SIGTERM sent once the process is seen blocked
in its write to stderr (``/proc/PID/syscall``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from support.launch import wait_for

PROGRAM = """
import logging, sys
from phalanx.errors import Interrupted
from phalanx.supervisor.console import configure_logging
from phalanx.supervisor.signals import SignalWatcher

configure_logging()
with SignalWatcher(("SIGTERM",)) as watcher:
    try:
        with watcher.raising():
            # Past a pipe's 64 KiB: the write blocks until the test reads, or a signal.
            logging.getLogger("phalanx").warning("x" * 300_000)
            print("the stop was lost", flush=True)
            sys.exit(3)
    except Interrupted as stop:
        print("stopped", stop.code, flush=True)
        sys.exit(stop.code)
"""
WRITE = 1  # the syscall number of write(2) on x86-64 and the first field of /proc/PID/syscall


def _blocked_writing_stderr(pid: int) -> bool:
    fields = Path(f"/proc/{pid}/syscall").read_text().split()
    return len(fields) > 1 and fields[0] == str(WRITE) and int(fields[1], 16) == 2


def test_a_stop_during_a_line_written_to_a_full_stderr_stops_the_wait(tmp_path: Path) -> None:
    read_end, write_end = os.pipe()
    process = subprocess.Popen(
        [sys.executable, "-c", PROGRAM], stdout=subprocess.PIPE, stderr=write_end, text=True
    )
    os.close(write_end)
    drained: list[bytes] = []
    try:
        wait_for(lambda: _blocked_writing_stderr(process.pid), 30, "the line's write blocked")
        process.send_signal(signal.SIGTERM)
        # Now let the write go on (whatever is left of the line, and any message after it).
        reader = threading.Thread(target=lambda: drained.append(_read_all(read_end)))
        reader.start()
        out, _ = process.communicate(timeout=30)
        reader.join(30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
        os.close(read_end)
    err = b"".join(drained).decode(errors="replace")
    assert process.returncode == 128 + signal.SIGTERM, (out, err[-2000:])
    assert out.strip() == f"stopped {128 + signal.SIGTERM}", out
    assert "Logging error" not in err, err[-2000:]


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 16):
        chunks.append(chunk)
    return b"".join(chunks)
