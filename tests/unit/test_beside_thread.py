"""``agent.beside.CheckBeside``: a restart round's node check in a thread beside its workers.
Its place in a real job (the order of its events, the report): ``tests/multinode/
test_check_beside.py``. Here, the thread's own rules with a stand-in check: it stops when
its round is over, a bug in it ends nothing, a verdict's lines reach the state once."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import pytest

from phalanx.agent.beside import CheckBeside
from phalanx.agent.sofar import RunState
from phalanx.errors import RendezvousError
from phalanx.nodecheck.verdict import Named, Verdict

WAIT = 10.0  # a bound on each wait below, never reached when the code is right


def _named(*lines: str) -> Verdict:
    return Verdict((), {}, tuple(Named(i, f"h{i}", f"10.0.0.{i}", x) for i, x in enumerate(lines)))


def test_a_check_still_running_when_its_round_ends_stops_at_its_next_look() -> None:
    """The check asks ``stop`` as it waits for records (``_gather``, once a second); once
    ``over`` is said, ``stop`` raises, naming why, and the thread ends."""
    looking, why = threading.Event(), []

    def check(stop: Callable[[], None]) -> Verdict | None:
        while True:
            try:
                stop()
            except RendezvousError as exc:
                why.append(str(exc))
                return None
            looking.set()
            threading.Event().wait(0.01)

    beside = CheckBeside()
    beside.start(check, 3)
    assert looking.wait(WAIT)
    beside.over()
    beside.close()
    assert why == ["its round ended before the check did"]
    assert not any(t.name == "phalanx-node-check" for t in threading.enumerate())


def test_a_new_rounds_check_stops_the_last_ones_first() -> None:
    """A round that ended before its workers started has nobody to say ``over``: the next
    round's ``start`` says it for that round's check."""
    stopped = threading.Event()

    def old(stop: Callable[[], None]) -> Verdict | None:
        while not stopped.is_set():
            try:
                stop()
            except RendezvousError:
                stopped.set()
            threading.Event().wait(0.01)
        return None

    beside = CheckBeside()
    beside.start(old, 4)
    beside.start(lambda stop: None, 5)
    assert stopped.wait(WAIT)
    beside.close()


def test_a_verdict_reaches_the_state_once() -> None:
    beside = CheckBeside()
    beside.start(lambda stop: _named("node 1 is slow"), 2)
    beside.close()
    state = beside.fold(RunState(checked=("round 0's line",)))
    assert state.checked == ("node 1 is slow",)
    assert beside.fold(state) is state  # nothing new: the lines stay the newest round's


def test_a_bug_in_the_check_is_logged_and_ends_nothing(caplog: pytest.LogCaptureFixture) -> None:
    def broken(stop: Callable[[], None]) -> Verdict | None:
        raise KeyError("a record's field")

    beside = CheckBeside()
    with caplog.at_level(logging.ERROR, logger="phalanx"):
        beside.start(broken, 6)
        beside.close()
    assert "round 6: the node check beside the workers failed" in caplog.text
    assert "KeyError" in caplog.text
    state = RunState(checked=("kept",))
    assert beside.fold(state) is state
