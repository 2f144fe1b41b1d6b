"""How long a compare-and-swap on etcd tries again after another writer's change made it miss
(``EtcdStore.add``, ``EtcdStore.claim_counted``): each try is one transaction that compares
what the last one read.

It gives up only after ``_MIN_READ_MISSES`` tries with a value it read missed: one late reply
(a paused or starved process) costs its guess and at most one such try, never the write. A
deadline (not a count) bounds the tries after that, so nothing makes it spin; it bounds
contention, not one late reply: its clock also runs while a reply is slow or the process is
descheduled (a loaded machine, SIGSTOP), after which the guess misses with nobody
contending; giving up then blamed contention nobody made (a loaded CI run).

After a try with a value it read missed too, it pauses before the next one, a random share of
a pause that doubles from ``_PAUSE_FIRST`` up to ``_PAUSE_MAX``: writers that keep colliding
spread out instead of each sending a transaction as soon as the last one's miss came back
(683 tries in 1 s against an etcd that always said "changed"). As torch's etcd store does
(``cas_delay``: 0-0.1 s) and etcd's own client between retries (25 ms, 10 % jitter). The
guess and the first try with the value read go at once: one other writer, whom the read saw.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from phalanx.rendezvous.stores.base import StoreUnavailable

_MIN_READ_MISSES = 2
_PAUSE_FIRST = 0.01
_PAUSE_MAX = 0.1


class Misses:
    """The misses of one compare-and-swap on ``counter`` (a data key, as the caller names it)."""

    def __init__(self, counter: str, endpoint: Callable[[], str], request_timeout: float) -> None:
        """``endpoint``: the etcd endpoint that answered last, as the message names it."""
        self._counter, self._endpoint, self._timeout = counter, endpoint, request_timeout
        self._start = time.monotonic()
        self._misses = 0

    def missed(self) -> None:
        """A try missed: pause before the next (see the module), or raise ``StoreUnavailable``
        when other writers kept changing the key for longer than ``request_timeout``."""
        self._misses += 1  # (all but the first were tries with the value read)
        spent = time.monotonic() - self._start
        if self._misses > _MIN_READ_MISSES and spent >= self._timeout:
            raise StoreUnavailable(
                f"add({self._counter!r}) on etcd at {self._endpoint()}: the key changed between "
                f"each read and write, {self._misses} tries in {spent:.3g} s (request_timeout "
                f"{self._timeout:.3g} s)"
            )
        if self._misses >= _MIN_READ_MISSES:
            time.sleep(_pause(self._misses - _MIN_READ_MISSES))


def _pause(n: int) -> float:
    """Seconds before the next try after ``n + 1`` tries with a value read missed: between
    half and all of a cap that doubles from ``_PAUSE_FIRST`` to ``_PAUSE_MAX`` (so never less
    than half of it: the tries before the deadline are bounded)."""
    cap = min(_PAUSE_MAX, _PAUSE_FIRST * 2 ** min(n, 16))
    return random.uniform(cap / 2, cap)
