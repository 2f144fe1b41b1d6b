"""Signal numbers as people read them: one spelling for every message and report."""

from __future__ import annotations

import signal


def signal_name(signum: int) -> str:
    """``SIGKILL`` for 9; ``signal 64`` for a number with no name here."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
