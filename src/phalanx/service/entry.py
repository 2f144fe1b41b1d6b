"""``python -u -c SERVICE_SHIM FD PATH IDLE LINEAGE [MODULE,...]``: the warm service's process.

Started by ``phalanx.service.client`` with the socket ``FD`` already bound at ``PATH``: it
forks once (its launcher reaps the first process at once), leaves the run's cgroup it was born
in, starts from python's default signal dispositions, imports torch and the preload modules
(``phalanx.worker.template.preload``), and serves (``phalanx.service.server``) until it ends; a
forked worker returns from ``serve`` with its request and runs it here.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import traceback
from pathlib import Path

from phalanx.service import cgroups, job, paths
from phalanx.service.server import Service
from phalanx.worker import become, leave, template
from phalanx.worker.batch import STOP_SIGNALS


def reset_inherited_signals() -> None:
    """Start from python's defaults, not the first agent's: what a job's workers ignore or
    block is their own agent's (``job.apply``)."""
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    # SIGPIPE and SIGXFSZ python itself ignores at start-up, in every process
    for sig in signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP, *job.RESET_AT_EXEC}:
        if signal.getsignal(sig) == signal.SIG_IGN:
            default = signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL
            signal.signal(sig, default)


def main(argv: list[str]) -> None:
    if os.fork() > 0:
        os._exit(0)  # the launch that started us reaps this at once (``client._start``)
    become.install_exit_hook()  # first registered, so it runs after all the others
    listener, path = socket.socket(fileno=int(argv[0])), Path(argv[1])
    idle, lineage = float(argv[2]), argv[3]
    theirs = tuple(m for m in (argv[4] if len(argv) > 4 else "").split(",") if m)
    cgroups.leave_run_cgroup()
    reset_inherited_signals()
    try:
        ready = template.preload(template.DEFAULT_PRELOAD, theirs)
    except BaseException:
        traceback.print_exc()
        with paths.locked(path.with_suffix(".lock")), contextlib.suppress(OSError):
            os.unlink(path)
        sys.exit(1)  # waiting agents read the end of their connection: they fall back
    os.chdir("/")  # the first launch's directory was only where its preload modules are
    service = Service(listener, path, idle, {**ready, "lineage": lineage}, theirs)
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: None)  # noted by the wakeup fd: drain, then end
    signal.set_wakeup_fd(service.wakeup_fd)
    request = service.serve()
    if request is not None:
        leave.run_to_exit(lambda: become.run_job(request, template.RUNNERS))


if __name__ == "__main__":
    main(sys.argv[1:])
