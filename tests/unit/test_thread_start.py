"""``errors.start_thread``: a signal's handler cannot run inside ``Thread.start()``."""

from __future__ import annotations

import os
import signal
import threading
from types import FrameType

from phalanx.errors import start_thread


def test_a_signal_sent_while_a_thread_starts_is_handled_after_start_returns() -> None:
    seen: list[str] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        seen.append("handler")

    class Noting(threading.Thread):
        def start(self) -> None:
            os.kill(os.getpid(), signal.SIGUSR1)  # arrives inside start(), as in the race
            super().start()
            seen.append("started")

    before = signal.signal(signal.SIGUSR1, handler)
    try:
        thread = Noting(target=lambda: None)
        start_thread(thread)
        thread.join(5)
        assert seen == ["started", "handler"]  # held back until start() returned, then run
        assert signal.getsignal(signal.SIGUSR1) is handler  # the launcher's own is back
    finally:
        signal.signal(signal.SIGUSR1, before)
