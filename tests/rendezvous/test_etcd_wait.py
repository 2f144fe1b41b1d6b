"""``EtcdStore.wait`` against a real 3-member etcd: the watch it opens before its read.

The waiter talks to member 0 only, the writer to member 1 only, so every change reaches the
waiter's member through the cluster, as another node's does. To put a write at an exact point
of a wait (just before or just after one of its reads), the waiter is an ``EtcdStore`` whose
``_read`` lets the writer write first or next; everything else is the store's own code on a
real stream.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pytest

from phalanx.rendezvous.stores.etcd.conf import (
    etcd_options_from_conf,
    parse_endpoints,
    run_prefix,
)
from phalanx.rendezvous.stores.etcd.store import EtcdStore
from support.etcd_server import EtcdCluster
from support.tools import needs_etcd

pytestmark = needs_etcd

HANG = 60.0  # generous bound that only catches hangs
SHORT = 2.0  # a wait that must end at its timeout: the key it wants is (and stays) gone

Hook = Callable[[], None]


class WaiterWithHooks(EtcdStore):
    """The store, where the writer acts just before (``before``) or just after (``after``)
    the n-th read of the keys a ``wait`` makes (1: the first read; 2: the read that follows
    the watch's ``created`` reply)."""

    def __init__(self, endpoint: str, run_id: str) -> None:
        options = etcd_options_from_conf({})
        super().__init__(parse_endpoints(endpoint), run_prefix(run_id), options)
        self.before: dict[int, Hook] = {}
        self.after: dict[int, Hook] = {}
        self.reads = 0

    def _read(self, wanted: list[bytes]) -> tuple[dict[bytes, bool], int]:
        self.reads += 1
        if hook := self.before.get(self.reads):
            hook()
        found = super()._read(wanted)
        if hook := self.after.get(self.reads):
            hook()
        return found


@pytest.fixture(scope="module")
def cluster() -> Iterator[EtcdCluster]:
    with EtcdCluster(size=3) as started:
        yield started


@pytest.fixture
def pair(cluster: EtcdCluster) -> Iterator[tuple[WaiterWithHooks, EtcdStore]]:
    """A waiter on member 0 and a writer on member 1, in one fresh run."""
    run_id = uuid.uuid4().hex
    waiter = WaiterWithHooks(cluster.endpoints[0], run_id)
    writer = EtcdStore(
        parse_endpoints(cluster.endpoints[1]), run_prefix(run_id), etcd_options_from_conf({})
    )
    try:
        yield waiter, writer
    finally:
        waiter.close()
        writer.close()


@pytest.mark.parametrize(
    "read",
    [1, 2],
    ids=["between-the-first-read-and-the-watch", "right-after-the-read-that-follows-the-watch"],
)
def test_a_key_written_just_after_a_read_is_not_missed(
    pair: tuple[WaiterWithHooks, EtcdStore], read: int
) -> None:
    """A key written after the first read (before the watch exists) is seen by the read
    after ``created``; one written after that read comes on the stream."""
    waiter, writer = pair
    writer.set("a", b"1")
    waiter.after[read] = lambda: writer.set("b", b"2")
    assert waiter.wait(["a", "b"], timeout=HANG) is True
    assert waiter.reads == 2  # the key was missing at the first read: a watch was opened


def test_an_event_older_than_the_read_does_not_bring_a_deleted_key_back(
    pair: tuple[WaiterWithHooks, EtcdStore],
) -> None:
    """Once the watch exists, "a" is written and deleted, and only then read (absent). The
    stream still delivers the put, then the delete, as separate messages: applying the put
    would make both keys look present until the delete arrived, and the wait would say yes
    for a key that is gone."""
    waiter, writer = pair
    writer.set("b", b"2")

    def put_then_delete() -> None:
        writer.set("a", b"1")
        assert writer.delete("a") is True

    waiter.before[2] = put_then_delete
    assert waiter.wait(["a", "b"], timeout=SHORT) is False
    assert waiter.get("a") is None


def test_a_key_deleted_after_the_read_is_missing_again(
    pair: tuple[WaiterWithHooks, EtcdStore],
) -> None:
    """Events newer than the read are applied, deletes included: "a", present at the read
    after ``created``, is deleted, then "b" is written; the wait ends at its timeout."""
    waiter, writer = pair
    writer.set("a", b"1")

    def delete_a_then_set_b() -> None:
        assert writer.delete("a") is True
        writer.set("b", b"2")

    waiter.after[2] = delete_a_then_set_b
    assert waiter.wait(["a", "b"], timeout=SHORT) is False
    assert waiter.get("a") is None


def test_keys_already_there_need_no_watch(pair: tuple[WaiterWithHooks, EtcdStore]) -> None:
    waiter, writer = pair
    writer.set("a", b"1")
    assert waiter.wait(["a"], timeout=HANG) is True
    assert waiter.reads == 1
