"""Files the agent writes in its run directory: the report (a write that cannot hold up the
exit) and ``launcher.json`` (how ``phalanx stacks``/``status``/``stop`` find the agent)."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

from phalanx.status import launcher
from phalanx.supervisor.signals import SignalWatcher
from phalanx.worker.contract import STACK_SIGNAL
from phalanx.worker.nofollow import replace_file

log = logging.getLogger("phalanx")
LAUNCHER_FILE = launcher.LAUNCHER_FILE  # the agent's pid, for ``phalanx stacks RUN_DIR``


def write_bounded(path: Path, text: str, timeout: float = 2.0) -> None:
    """Write ``path`` from a thread, waiting at most ``timeout``: a full disk or a filesystem
    that stops answering costs one line (the report was printed already), never the exit."""

    def write() -> None:
        try:
            replace_file(path, text.encode())  # never through a symlink planted there
        except OSError as exc:
            log.warning("cannot write %s (%s)", path, exc.strerror)

    writer = threading.Thread(target=write, name="phalanx-report", daemon=True)
    writer.start()
    writer.join(timeout)
    if writer.is_alive():
        log.warning("cannot write %s (its filesystem did not answer within %g s)", path, timeout)


def write_launcher_file(run_dir: Path, signals: SignalWatcher) -> None:
    data = {
        **launcher.this_process(),  # pid, host, start time (``phalanx stop`` checks it)
        "stacks_signal": STACK_SIGNAL.name if signals.stacks_active else None,
    }
    try:
        replace_file(run_dir / LAUNCHER_FILE, (json.dumps(data) + "\n").encode())
    except OSError as exc:
        log.warning(
            "cannot write %s (%s): phalanx stacks will not find this agent",
            run_dir / LAUNCHER_FILE,
            exc.strerror,
        )
