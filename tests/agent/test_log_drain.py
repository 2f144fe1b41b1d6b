"""The last of the workers' output is read after they end: the pipes are drained, bounded.

Real workers through the real CLI: a last line without a newline, from a worker whose asleep
child keeps the pipe open until phalanx kills it at the end, reaches the console and
``stdout.log``; and a worker's child (in the worker's process group, ignoring SIGTERM) that
filled its 1 MiB stdout pipe while the agent was held (SIGSTOP) and is still holding it when
the job stops: every line it wrote is in ``stdout.log`` and on the console, although the
agent's event loop reads at most 64 KiB of it before the stop -- the rest only the final
drain reads.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from support.launch import alive, launched, run_phalanx, wait_for, worker

HANG = 120.0


def _run_dir(logs: Path) -> Path:
    (run_dir,) = logs.iterdir()
    return run_dir


def test_a_last_line_without_a_newline_reaches_the_console_and_the_log(tmp_path: Path) -> None:
    done = run_phalanx(
        ["--nproc-per-node", "1", "--log-dir", str(tmp_path / "logs"),
         worker("drain_tail.py"), "partial"],
        timeout=HANG,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "[rank0]: a whole line",
        "[rank0]: last words without a newline",
    ], done.stdout
    log = _run_dir(tmp_path / "logs") / "attempt_0" / "rank_0" / "stdout.log"
    assert log.read_text() == "a whole line\nlast words without a newline"


def test_what_a_workers_child_left_in_the_pipe_at_the_stop_is_all_logged(tmp_path: Path) -> None:
    shared, logs = tmp_path / "shared", tmp_path / "logs"
    shared.mkdir()
    args = ["--nproc-per-node", "1", "--shutdown-timeout", "1", "--log-dir", str(logs),
            worker("drain_tail.py"), "child", str(shared)]  # fmt: skip
    with launched(args) as agent:
        wait_for(lambda: (shared / "ready").exists() or agent.poll() is not None, HANG, "ready")
        assert agent.poll() is None, agent.communicate()
        os.kill(agent.pid, signal.SIGSTOP)  # the agent reads nothing until SIGCONT
        try:
            (shared / "go").touch()
            wait_for(lambda: (shared / "written").exists(), HANG, "the child to fill the pipe")
            pid = int((shared / "worker.pid").read_text())
            wait_for(lambda: not alive(pid), HANG, "the worker to exit 3")
        finally:
            os.kill(agent.pid, signal.SIGCONT)
        out, err = agent.communicate(timeout=HANG)
    assert agent.returncode == 3, err
    count = int((shared / "written").read_text())
    assert count * 12 > 1 << 19, count  # the pipe held far more than one read takes
    expected = [f"line {n:06d}" for n in range(count)]
    logged = (_run_dir(logs) / "attempt_0" / "rank_0" / "stdout.log").read_text().splitlines()
    assert logged == expected, f"{len(logged)} of {count} lines in stdout.log"
    shown = [line.removeprefix("[rank0]: ") for line in out.splitlines()]
    assert shown == expected, f"{len(shown)} of {count} lines on the console"
