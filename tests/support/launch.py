"""Helpers for tests that run the real ``phalanx`` CLI in a subprocess."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import psutil

from phalanx.resources.ports import free_port

WORKERS = Path(__file__).parents[1] / "workers"
PHALANX = [sys.executable, "-m", "phalanx"]


def worker(name: str) -> str:
    return str(WORKERS / name)


@contextlib.contextmanager
def launched(
    args: Sequence[str],
    *,
    cwd: str | os.PathLike[str] | None = None,
    env: dict[str, str] | None = None,
    command: Sequence[str] = PHALANX,
    preexec_fn: Callable[[], None] | None = None,
) -> Iterator[subprocess.Popen[str]]:
    """phalanx (``command``) running in the background (its output piped, as text) for the
    ``with`` block; its whole session is killed afterwards if it is still running.
    ``preexec_fn``: run in the child before phalanx starts (a resource limit, a cgroup to
    join)."""
    launcher = subprocess.Popen(
        [*command, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
        env=env,
        start_new_session=True,
        preexec_fn=preexec_fn,
    )
    try:
        yield launcher
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.communicate()


def run_phalanx(
    args: Sequence[str],
    *,
    timeout: float = 120,
    cwd: str | os.PathLike[str] | None = None,
    env: dict[str, str] | None = None,
    command: Sequence[str] = PHALANX,
    preexec_fn: Callable[[], None] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run phalanx to completion; on timeout kill its whole session so nothing leaks."""
    with launched(args, cwd=cwd, env=env, command=command, preexec_fn=preexec_fn) as proc:
        out, err = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def remove_job_cgroups(log_dir: Path) -> None:
    """Remove the job cgroups of the runs under ``log_dir`` that nobody was left to remove
    (a test that SIGKILLed the guardian as well as the launcher), once they are empty."""
    from phalanx.supervisor.cgroup import hierarchies

    for run_dir in log_dir.iterdir() if log_dir.is_dir() else ():
        for root in hierarchies():
            with contextlib.suppress(OSError):
                (root / f"phalanx-{run_dir.name}").rmdir()


def wait_for(predicate: object, timeout: float, what: str, *, every: float = 0.05) -> None:
    """Poll ``predicate`` every ``every`` seconds until it is true; fail after ``timeout``
    (a bound that only catches a hang, never a timing assertion). The tests' one wait: a
    predicate that must give up early (its process exited) raises from inside."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def read_pids(directory: Path) -> list[int]:
    return [int(p.read_text()) for p in sorted(directory.glob("*.pid")) if p.read_text().strip()]


def start_tree(
    tmp_path: Path, flags: Sequence[str] = ()
) -> tuple[subprocess.Popen[bytes], list[int], Path]:
    """A 2-worker job of ``sleep_tree.py``: returns the launcher, the pids of both workers and
    their children (once all four are up), and the file the launcher's stderr goes to."""
    pids_dir, stderr_path = tmp_path / "pids", tmp_path / "launcher.err"
    pids_dir.mkdir()
    argv = [*PHALANX, *flags, "--nproc-per-node", "2", "--log-dir", str(tmp_path / "logs"),
            worker("sleep_tree.py"), str(pids_dir)]  # fmt: skip
    with open(stderr_path, "wb") as stderr:
        launcher = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True
        )
    wait_for(lambda: len(read_pids(pids_dir)) == 4, 60, "2 workers and their 2 children")
    return launcher, read_pids(pids_dir), stderr_path


def end_all(launcher: subprocess.Popen[bytes], pids: Sequence[int]) -> None:
    """Cleanup after a test: the launcher's session, then any listed process still alive."""
    if launcher.poll() is None:
        os.killpg(launcher.pid, signal.SIGKILL)
        launcher.wait(10)
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def port_pair() -> int:
    """A port P with P and P + 1 free: phalanx.spawn's master_port and default rdzv_port."""
    for _ in range(50):
        port = free_port()
        with socket.socket() as probe:
            try:
                probe.bind(("", port + 1))
            except OSError:
                continue
        return port
    raise AssertionError("no two adjacent free ports")
