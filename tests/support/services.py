"""The warm services (``--keep-warm``) a test session started: the suite's live in a directory
of its own (``XDG_RUNTIME_DIR``, set by ``conftest.py``), and none may outlive the session."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Mapping

from phalanx.service.client import ask_all

STOP_WAIT = 15.0  # for a stopped service to end (it ends once its jobs have); then SIGKILL


def service_pids(environ: Mapping[str, str]) -> list[int]:
    with contextlib.suppress(OSError):
        return [int(a["pid"]) for a in ask_all(environ, {"status": 1})]
    return []


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def end_services(environ: Mapping[str, str]) -> list[int]:
    """Stop every service under ``environ``'s directory; SIGKILL (by pid) any not gone after
    ``STOP_WAIT``. Returns the pids that had to be killed."""
    pids = service_pids(environ)
    with contextlib.suppress(OSError):
        ask_all(environ, {"stop": 1})
    deadline = time.monotonic() + STOP_WAIT
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    killed = [p for p in pids if _alive(p)]
    for pid in killed:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return killed
