"""``worker.slowio.Answers``: questions to a filesystem answered by one thread, each caller
waiting at most its bound (real threads; the slow answers are sleeps)."""

from __future__ import annotations

import threading
import time

from phalanx.worker.slowio import Answers


def _slow(seconds: float, value: str) -> str:
    time.sleep(seconds)
    return value


def test_an_answer_in_time_is_returned() -> None:
    answers: Answers[str] = Answers("test-answers")
    assert answers.ask("a", lambda: "ok", 5.0) == "ok"


def test_a_slow_answer_is_not_waited_for_and_serves_the_next_caller_once_known() -> None:
    answers: Answers[str] = Answers("test-answers")
    started = time.monotonic()
    assert answers.ask("a", lambda: _slow(3.0, "late"), 0.05, stale=False) is None
    assert time.monotonic() - started < 2.0  # not the answer's 3 s
    deadline = time.monotonic() + 10
    while answers.ask("a", lambda: "fresh", 0.0) is None and time.monotonic() < deadline:
        time.sleep(0.05)  # the thread is still on the slow one: the last answer, once known
    assert answers.ask("a", lambda: _slow(5.0, "later"), 0.0) == "late"


def test_a_question_behind_one_answered_in_good_time_waits_its_bound() -> None:
    """Two agents in one process (or two probes) ask at once: the second waits its turn."""
    answers: Answers[str] = Answers("test-answers")
    got: dict[str, str | None] = {}
    first = threading.Thread(
        target=lambda: got.update(a=answers.ask("a", lambda: _slow(0.2, "A"), 5.0))
    )
    first.start()
    time.sleep(0.05)  # "a" is being answered
    got["b"] = answers.ask("b", lambda: "B", 5.0, stale=False)
    first.join(10)
    assert got == {"a": "A", "b": "B"}


def test_a_question_behind_a_slow_one_is_not_waited_for() -> None:
    """Behind a question that has taken longer than the caller's bound, the caller goes on at
    once (waiting would cost its whole 2 s bound: the one ahead takes 3 s)."""
    answers: Answers[str] = Answers("test-answers")
    assert answers.ask("a", lambda: _slow(3.0, "A"), 0.0) is None
    time.sleep(2.2)  # "a" has now run longer than the next caller's bound
    started = time.monotonic()
    assert answers.ask("b", lambda: "B", 2.0, stale=False) is None
    assert time.monotonic() - started < 1.5
