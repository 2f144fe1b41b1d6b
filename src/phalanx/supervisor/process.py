"""Starting one worker process: its own process group, death with the launcher, pipes."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from phalanx.plan import WorkerPlan

_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)  # loaded before any fork: no dlopen in the child


def die_with_parent(parent_pid: int) -> Callable[[], None]:
    """A ``preexec_fn`` that makes the child receive SIGKILL when the launcher dies.

    The getppid check closes the race at fork: if the launcher died between ``fork`` and
    ``prctl``, the child has already been reparented and would never get the signal.
    """

    def preexec() -> None:
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent_pid:
            os._exit(1)

    return preexec


class RunningWorker(Protocol):
    """A started worker as the supervisor sees it, however it was started (exec or fork)."""

    @property
    def pid(self) -> int: ...

    @property
    def exit_fd(self) -> int:
        """Becomes readable when the process has exited."""

    @property
    def stdout_fd(self) -> int: ...

    @property
    def stderr_fd(self) -> int: ...

    def reap(self) -> int:
        """The return code (negative signal number for a signal death); call once exit_fd is readable."""

    def close(self) -> None: ...


@dataclass
class ExecWorker:
    """A worker started by fork+exec (the cold path)."""

    popen: subprocess.Popen[bytes]
    exit_fd: int

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def stdout_fd(self) -> int:
        assert self.popen.stdout is not None
        return self.popen.stdout.fileno()

    @property
    def stderr_fd(self) -> int:
        assert self.popen.stderr is not None
        return self.popen.stderr.fileno()

    def reap(self) -> int:
        return self.popen.wait()

    def close(self) -> None:
        os.close(self.exit_fd)
        for stream in (self.popen.stdout, self.popen.stderr):
            if stream is not None:
                stream.close()


def exec_worker(worker: WorkerPlan, cwd: str | None = None) -> ExecWorker:
    popen = subprocess.Popen(
        list(worker.argv),
        env=dict(worker.env),
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        process_group=0,
        preexec_fn=die_with_parent(os.getpid()),
        close_fds=True,
    )
    try:
        exit_fd = os.pidfd_open(popen.pid)
    except OSError:  # no descriptor left: nothing could watch the worker, so it must not run
        popen.kill()
        popen.wait()
        for stream in (popen.stdout, popen.stderr):
            if stream is not None:
                stream.close()
        raise
    return ExecWorker(popen, exit_fd)
