"""``launcher.json``, how ``phalanx stacks``/``status``/``stop`` find the agent, handed to the
run directory's writer (``agent.filewriter``): it never holds up the agent's start."""

from __future__ import annotations

import json

from phalanx.agent.filewriter import RunFiles
from phalanx.status import launcher
from phalanx.supervisor.signals import SignalWatcher
from phalanx.worker.contract import STACK_SIGNAL

LAUNCHER_FILE = launcher.LAUNCHER_FILE  # the agent's pid, for ``phalanx stacks RUN_DIR``


def write_launcher_file(files: RunFiles, signals: SignalWatcher) -> None:
    data = {
        **launcher.this_process(),  # pid, host, start time (``phalanx stop`` checks it)
        "stacks_signal": STACK_SIGNAL.name if signals.stacks_active else None,
    }
    files.offer(LAUNCHER_FILE, (json.dumps(data) + "\n").encode())
