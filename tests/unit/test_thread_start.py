"""``errors.start_thread``: a stop signal cannot land inside ``Thread.start()``."""

from __future__ import annotations

import os
import signal
import threading
from types import FrameType

from phalanx.errors import start_thread


def test_a_signal_sent_while_a_thread_starts_is_handled_after_start_returns() -> None:
    seen: list[str] = []
    masks: list[set[signal.Signals]] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        seen.append("handler")

    def run() -> None:
        masks.append(signal.pthread_sigmask(signal.SIG_BLOCK, []))

    class Noting(threading.Thread):
        def start(self) -> None:
            os.kill(os.getpid(), signal.SIGUSR1)  # arrives inside start(), as in the race
            super().start()
            seen.append("started")

    before = signal.signal(signal.SIGUSR1, handler)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    try:
        thread = Noting(target=run)
        start_thread(thread)
        thread.join(5)
    finally:
        signal.signal(signal.SIGUSR1, before)
    assert seen == ["started", "handler"]  # held back until start() returned, then handled
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == mask  # the main thread's is back
    assert signal.SIGTERM in masks[0]  # the new thread keeps them blocked: the main gets them
