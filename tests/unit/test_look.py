"""A look asked of the watch thread (``rendezvous.dynamic.look.Look``): it wakes the thread's
pause, is waited for until a pass begun after it has ended, makes passes judge the ring
for one interval, and never waits for a thread that does not run or cannot be woken.

Tier (b): a real thread running passes as ``Liveness._run`` does, counting them; a fake
clock for ``due``."""

from __future__ import annotations

import threading

from phalanx.rendezvous.dynamic.look import Look

LONG = 60.0  # the thread's pause: only a look (or ``wake``) ends it within the test


def _thread(look: Look, stop: threading.Event, passes: list[int]) -> threading.Thread:
    def run() -> None:
        with look.running():
            while not stop.is_set():
                with look.passing():
                    passes.append(len(passes))
                look.pause(LONG)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_a_look_wakes_the_pause_and_waits_for_a_pass_begun_after_it() -> None:
    look, stop, passes = Look(0.5, lambda: 0.0, wakes=True), threading.Event(), []
    thread = _thread(look, stop, passes)
    try:
        for asked in range(1, 4):
            look.now(bound=LONG)  # returns only once a pass after the call has ended
            assert len(passes) >= asked + 1
    finally:
        stop.set()
        look.wake()
        thread.join(10)
    assert not thread.is_alive()
    look.now(bound=LONG)  # the thread ended: nothing to wait for (else LONG)


def test_a_look_is_only_asked_for_where_it_cannot_wake_the_thread() -> None:
    now = [100.0]
    look = Look(0.5, lambda: now[0], wakes=False)
    with look.running():
        look.now(bound=LONG)  # no pass comes here: it must not wait for one
    assert look.due(100.0) and look.due(100.49)
    assert not look.due(100.5)


def test_no_look_no_extra_judging() -> None:
    assert not Look(0.5, lambda: 0.0, wakes=True).due(0.0)
