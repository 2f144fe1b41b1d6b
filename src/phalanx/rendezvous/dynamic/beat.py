"""The heartbeat's own thread: the writes that prove this node alive (to its peers and its
``Fence``) never wait behind another store call, nor behind one another.

On a lossy link one request can sit in TCP's retransmission backoff for many seconds
(0.2, 0.4, 0.8, 1.6, 3.2 s... between tries) although the next request, on a connection
of its own, would get through at once. So the beat goes out on connections of its own
(``TwinnedStore.twin``: a pool only the heartbeat uses, each call bounded by ``bound``),
and while one beat is still unanswered when the next is due, the next goes out beside it
on another connection: up to ``hedge`` beats in flight. With heartbeat counters each beat
writes a value of its own, so the proof a beat gives counts from that beat's own start
(``pulse.Counters``); a slow beat landing late only makes the counter change again. The
threads that write the beats live on between beats (one, while beats are answered in time).

When the node leaves on purpose (``stop_beating``), the thread first lets the beats in
flight end (each within ``bound``), then writes ``LEFT``: no older beat lands after it.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable

from phalanx.rendezvous.dynamic.pulse import Counters, Pulse
from phalanx.rendezvous.settings import RendezvousSettings
from phalanx.rendezvous.stores.base import Malformed, StoreUnavailable

log = logging.getLogger("phalanx")


def hedge(pulse: Pulse, settings: RendezvousSettings, bound: float) -> int:
    """How many beats may be in flight at once. Counters: while a beat waits for its answer
    the next goes out beside it, so that within a bound several are; a lease is only read,
    one read at a time."""
    return math.ceil(bound / settings.heartbeat_interval) + 1 if isinstance(pulse, Counters) else 1


class Beater:
    def __init__(
        self,
        pulse: Pulse,
        interval: float,
        bound: float,
        hedge: int,
        *,
        answered: Callable[[], None],
        failed: Callable[[StoreUnavailable], None],
        expelled: Callable[[str], None],
    ) -> None:
        """``answered``: a beat got its answer; ``failed``: one did not (it raised);
        ``expelled``: this node can no longer count as a member (final)."""
        self._pulse = pulse
        self._interval = interval
        self._bound = bound
        self._hedge = max(1, hedge)
        self._answered, self._failed, self._expelled = answered, failed, expelled
        # Beats are written by threads that live on, each waiting for its next beat: a thread
        # started per beat cost its start (a clone and two hand-overs of the interpreter's
        # lock) every second on every node, a thousand a second in a driver of the store's
        # benchmark. A beat due while every such thread still waits for an answer gets a
        # new one, up to ``hedge``.
        self._lock = threading.Condition()
        self._beating = True
        self._asked = 0  # beats due that no thread has taken yet
        self._flight = 0  # beats due or being written
        self._writers = 0  # threads that write beats (busy or waiting for the next)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, name: str) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=name, daemon=True)
            self._thread.start()

    def stop_beating(self) -> None:
        """No more beats; returns once the beats in flight ended (each within ``bound``), so
        a ``LEFT`` written after this is not overwritten by an older beat landing late."""
        with self._lock:
            self._beating = False
            self._asked, self._flight = 0, self._flight - self._asked  # not taken: not sent
            self._lock.wait_for(lambda: self._flight == 0, timeout=self._bound)

    def stop(self, wait: float) -> None:
        self._stop.set()
        with self._lock:
            self._lock.notify_all()  # the writers waiting for a beat end
        if self._thread is not None:
            self._thread.join(timeout=wait)

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                beating = self._beating
                if beating and self._flight < self._hedge:
                    self._flight += 1
                    self._asked += 1
                    if self._writers < self._flight:  # every writer is busy: one more
                        self._writers += 1
                        threading.Thread(
                            target=self._write, name="phalanx-beat", daemon=True
                        ).start()
                    self._lock.notify_all()
                if not beating:
                    self._lock.wait_for(lambda: self._flight == 0, timeout=self._bound)
            if not beating:
                self._write_left()
            self._stop.wait(self._interval)

    def _write(self) -> None:
        """A writer thread: the next beat asked for, then the next, until ``stop``."""
        while True:
            with self._lock:
                self._lock.wait_for(lambda: self._asked > 0 or self._stop.is_set())
                if self._stop.is_set():
                    self._writers -= 1
                    return
                self._asked -= 1
            try:
                self._beat()
            except BaseException:  # (a bug): this thread ends, the next beat gets a new one
                with self._lock:
                    self._flight, self._writers = self._flight - 1, self._writers - 1
                    self._lock.notify_all()
                raise
            with self._lock:
                self._flight -= 1
                self._lock.notify_all()

    def _beat(self) -> None:
        try:
            why = self._pulse.beat(True)
        except Malformed as exc:
            log.error("rendezvous: %s", exc)
            self._expelled(str(exc))  # final: the same write would meet the same junk
            return
        except StoreUnavailable as exc:
            self._failed(exc)
            return
        self._answered()
        if why is not None:
            log.error("rendezvous: %s", why)
            self._expelled(why)

    def _write_left(self) -> None:
        try:
            self._pulse.beat(False)
        except StoreUnavailable as exc:
            self._failed(exc)
        else:
            self._answered()
