"""``EtcdStore.add``'s retries, driven by a fake etcd that models one key (``support.fake_etcd``)
and a fake clock for ``add``'s deadline: what bounds them is contention, not one late reply;
and between tries with a value read that missed, ``add`` pauses a little, so that writers
that keep colliding do not hammer etcd.

Seen in a loaded CI run (``test_stopped_while_joining``): an agent's ``add`` on a round's
``settled`` counter, which only two nodes ever write, gave up ("the key changed under every
attempt for 4 s") because the process was stopped (SIGSTOP; on a loaded machine, starved)
between starting the add and its first reply: its first try, a guess that the key is absent,
missed because the other node had counted meanwhile, and the deadline had passed, so it never
tried with the value it had read. The real-process form is that test.
"""

from __future__ import annotations

import base64
import contextlib
from collections.abc import Callable

import pytest

from phalanx.rendezvous.stores.base import StoreUnavailable
from phalanx.rendezvous.stores.etcd import misses as etcd_misses
from phalanx.rendezvous.stores.etcd.conf import run_prefix
from phalanx.rendezvous.stores.etcd.store import EtcdOptions, EtcdStore
from support.fake_etcd import HEADER, JSON, FakeEtcd, Junk, junk_json

TIMEOUT = 4.0  # request_timeout, as the CI run's


class Clock:
    """``add``'s clock: moves only when a reply says time passed (``pauses_move_it``: and by
    each pause ``add`` makes between tries, which are kept)."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.pauses: list[float] = []
        self.pauses_move_it = False

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)
        if self.pauses_move_it:
            self.now += seconds


class OneKey:
    """``kv/txn`` on one integer key: ``before(try number)`` runs before each try is judged
    (another writer's add, time passing); the compares asked are kept."""

    def __init__(self, before: Callable[[OneKey, int], None]) -> None:
        self.value: int | None = None
        self.mod = 0
        self.compares: list[JSON] = []
        self._before = before

    def write(self, value: int) -> None:
        self.value, self.mod = value, self.mod + 1

    def __call__(self, request: JSON) -> Junk:
        compare = request["compare"][0]
        self.compares.append(compare)
        self._before(self, len(self.compares))
        if compare["target"] == "CREATE":
            holds = self.value is None
        else:
            holds = self.value is not None and int(compare["mod_revision"]) == self.mod
        if holds:
            self.write(int(base64.b64decode(request["success"][0]["request_put"]["value"])))
            puts = [{"response_put": {"header": HEADER}}] * 2
            return junk_json({"header": HEADER, "succeeded": True, "responses": puts})
        kvs = []
        if self.value is not None:
            value = base64.b64encode(str(self.value).encode()).decode()
            kvs = [{"key": "aw==", "value": value, "mod_revision": str(self.mod)}]
        ranges = [{"response_range": {"header": HEADER, "kvs": k}} for k in (kvs, [])]
        return junk_json({"header": HEADER, "succeeded": False, "responses": ranges})


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(etcd_misses, "time", fake)  # (the retries' clock and pauses)
    return fake


def _store(fake: FakeEtcd) -> contextlib.closing[EtcdStore]:
    options = EtcdOptions(request_timeout=TIMEOUT)
    return contextlib.closing(EtcdStore([fake.endpoint], run_prefix("add"), options))


def test_a_first_reply_late_past_the_deadline_still_gets_a_try_with_the_value_read(
    clock: Clock,
) -> None:
    def other_node_counted_while_this_one_was_stopped(key: OneKey, n: int) -> None:
        if n == 1:
            key.write(1)
            clock.now += 3 * TIMEOUT

    key = OneKey(other_node_counted_while_this_one_was_stopped)
    with FakeEtcd({"kv/txn": key}) as fake, _store(fake) as store:
        assert store.add("settled", 1) == 2
    assert [c["target"] for c in key.compares] == ["CREATE", "MOD"]
    assert key.value == 2


def test_a_key_changed_before_every_try_gives_up_at_the_deadline_saying_so(
    clock: Clock,
) -> None:
    def another_writer_adds_first(key: OneKey, n: int) -> None:
        key.write((key.value or 0) + 1)
        clock.now += TIMEOUT / 4

    key = OneKey(another_writer_adds_first)
    with (
        FakeEtcd({"kv/txn": key}) as fake,
        _store(fake) as store,
        pytest.raises(StoreUnavailable) as caught,
    ):
        store.add("settled", 1)
    assert len(key.compares) == 4  # the deadline, not a count: 4 tries of TIMEOUT / 4 each
    assert f"add('settled') on etcd at {fake.endpoint}" in str(caught.value)
    assert "the key changed between each read and write, 4 tries in 4 s" in str(caught.value)


def test_a_late_reply_and_one_change_after_it_do_not_end_the_add(clock: Clock) -> None:
    """The guess misses late, and the first try with the value read meets one more change
    (the other writer's): the second try with a value read succeeds."""

    def late_then_one_change(key: OneKey, n: int) -> None:
        if n <= 2:
            key.write((key.value or 0) + 1)
            clock.now += 3 * TIMEOUT

    key = OneKey(late_then_one_change)
    with FakeEtcd({"kv/txn": key}) as fake, _store(fake) as store:
        assert store.add("settled", 1) == 3
    assert [c["target"] for c in key.compares] == ["CREATE", "MOD", "MOD"]


def test_a_key_that_always_changed_is_tried_a_bounded_number_of_times(clock: Clock) -> None:
    """Against an etcd that says "changed" to every try, at once (1 ms a reply, as the fake
    etcd answered: 683 tries in 1 s before the pauses), ``add`` pauses between tries with the
    value read: at most 83 tries in the 4 s, not 4,000. The bound: 2 tries without a pause,
    then pauses of at least 5, 10, 20 and 40 ms and then 50 ms each (half of each cap), and
    the try before the last still short of the deadline: 0.001 t + 0.075 + 0.05 (t - 7) < 4."""
    clock.pauses_move_it = True

    def another_writer_adds_first(key: OneKey, n: int) -> None:
        key.write((key.value or 0) + 1)
        clock.now += 0.001

    key = OneKey(another_writer_adds_first)
    with (
        FakeEtcd({"kv/txn": key}) as fake,
        _store(fake) as store,
        pytest.raises(StoreUnavailable, match="the key changed between each read and write"),
    ):
        store.add("settled", 1)
    tries = len(key.compares)
    assert 3 <= tries <= 83, tries
    assert len(clock.pauses) == tries - 2  # none after the guess, none after the last try
    assert all(0.005 <= pause <= 0.1 for pause in clock.pauses), clock.pauses
