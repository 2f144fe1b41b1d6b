"""The checkpoint log: one JSON line per completed checkpoint, for the agent's crash-loop
detection (``PHALANX_CHECKPOINT_LOG``; see ``phalanx.inscript.checkpoint``)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from phalanx.worker.contract import CHECKPOINT_LOG_ENV
from phalanx.worker.nofollow import append_to

_log_warned = False  # the checkpoint log's failure is said once per process


def append_log(step: int, path: Path, when: float) -> None:
    """Best effort: the checkpoint is whole already, and the log is the launcher's (in its
    run directory, which may be full, read-only or deleted): a line that cannot be written
    is said once per process, never raised. The agent then does not take the missing line
    for "no progress" (``agent.crashloop.unrecordable``)."""
    global _log_warned
    log_path = os.environ.get(CHECKPOINT_LOG_ENV)
    if not log_path:
        return
    line = json.dumps({"step": step, "path": str(path.resolve()), "time": when})
    try:
        # One write(2) on an O_APPEND descriptor: concurrent appenders never interleave lines.
        fd = append_to(log_path)  # in the run directory: never through a symlink
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)
    except OSError as exc:
        if not _log_warned:
            _log_warned = True
            print(
                f"phalanx: cannot write {log_path} ({exc.strerror or exc}): checkpoint "
                f"{path} is saved whole, but the launcher cannot count it (said once)",
                file=sys.stderr,
                flush=True,
            )
