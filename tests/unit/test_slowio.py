"""``worker.slowio.Answers``: questions to a filesystem answered by one thread, each caller
waiting at most its bound (real threads; the slow answers are sleeps)."""

from __future__ import annotations

import gc
import threading
import time
import weakref

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
    assert answers.ask("a", lambda: _slow(3.0, "late"), 0.05) is None  # (none known yet)
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


class _Found:
    """An answer whose life a weak reference can follow."""


def test_an_answer_asked_for_once_is_not_kept() -> None:
    """``stale=False`` with a fresh key each time (a worker's start, its exit, a restart's
    evidence): neither an answer in time nor one that comes after its caller gave up stays
    behind in the thread's memory (each did, for the agent's life)."""
    answers: Answers[_Found] = Answers("test-answers")
    refs = []

    def found(seconds: float) -> _Found:
        time.sleep(seconds)
        value = _Found()
        refs.append(weakref.ref(value))
        return value

    assert answers.ask(object(), lambda: found(0.0), 5.0, stale=False) is not None
    assert answers.ask(object(), lambda: found(0.5), 0.01, stale=False) is None  # given up
    assert answers.ask(object(), lambda: found(0.0), 5.0, stale=False) is not None  # after it
    answers.ask(object(), lambda: None, 5.0, stale=False)  # (the thread's last answer: a local)
    gc.collect()
    assert len(refs) == 3 and all(ref() is None for ref in refs), refs
