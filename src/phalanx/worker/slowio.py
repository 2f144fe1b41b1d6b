"""Reads and probes of the run directory that must not hold up the agent's loop.

A struggling NFS server answers each file operation in a second or more; the agent looks at
its ranks' progress counters every tick and probes the run directory after a failure, and
each of those, done in the agent's own thread, would delay the reaction to a peer's failure
or a signal by that long. ``Answers`` makes them in one thread of its own: the caller waits at
most a bound, then goes on with the last answer known for that question (``stale``) or
with ``None`` (not known now); the question is answered later for the next caller. (Stdlib only, in ``worker`` beside
``nofollow``, as ``progress`` reads through it.)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

T = TypeVar("T")


class Answers(Generic[T]):
    """Questions (a key, a function) answered by one daemon thread; ``ask`` never waits
    past its bound. A function must not raise (it answers ``None`` for "cannot tell")."""

    def __init__(self, name: str) -> None:
        self._lock = threading.Lock()
        self._done = threading.Condition(self._lock)
        self._asked: dict[Hashable, Callable[[], T | None]] = {}
        self._known: dict[Hashable, T | None] = {}
        self._unwanted: set[Hashable] = set()  # asked with stale=False, given up on
        self._name = name
        self._thread: threading.Thread | None = None
        self._since = 0.0  # when the thread began the question it answers now (monotonic)

    def ask(
        self, key: Hashable, answer: Callable[[], T | None], wait: float, *, stale: bool = True
    ) -> T | None:
        """``answer()``, made in the thread, if it comes within ``wait`` seconds; else the
        last answer to ``key`` (``stale``) or None. A question still open is not asked twice,
        and one queued behind a question that has already taken longer than ``wait`` is not
        waited for (so many questions to a slow filesystem cost one ``wait``, not one each;
        one behind a question being answered in good time -- another agent's probe in the
        same process, a sibling rank's reading -- waits its bound as if first). With
        ``stale=False`` the answer is this caller's alone (its key a fresh ``object()``, asked
        once): it is not kept, nor is it when it comes after the caller gave up. (Kept, each
        worker start, exit and restart left one behind for the agent's life.)"""
        now = time.monotonic()
        deadline = now + wait
        with self._lock:
            if self._thread is None:  # started on first use: never before a fork
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            if key not in self._asked:
                if not self._asked:
                    self._since = now  # the thread takes it now (its clock starts here)
                self._asked[key] = answer
                self._done.notify_all()
            if next(iter(self._asked)) != key and now - self._since > wait:
                deadline = 0.0  # behind a slow question: the thread would be late for this
            while key in self._asked and (left := deadline - time.monotonic()) > 0:
                self._done.wait(left)
            if not stale:
                if key in self._asked:
                    self._unwanted.add(key)
                    return None
                return self._known.pop(key, None)  # this caller's alone: not kept
            return self._known.get(key)

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._asked:
                    self._done.wait()
                key, answer = next(iter(self._asked.items()))
                self._since = time.monotonic()
            value = answer()
            with self._lock:
                if key in self._unwanted:
                    self._unwanted.discard(key)
                else:
                    self._known[key] = value
                del self._asked[key]
                self._done.notify_all()
