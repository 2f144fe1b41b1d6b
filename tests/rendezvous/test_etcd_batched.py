"""The batched reads of a restart on a real 3-member etcd (issue 41, session 55): what each
returns, and that it is one request where it says so.

The reader talks to member 0 only, the writer to member 1 only, so every write reaches the
reader through the cluster, as another node's does. Requests are counted by wrapping the
reader's own client (every request still goes to etcd).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import pytest

from phalanx.rendezvous.dynamic.board import Board
from phalanx.rendezvous.dynamic.keys import Keys
from phalanx.rendezvous.stores.etcd.conf import etcd_options_from_conf, parse_endpoints, run_prefix
from phalanx.rendezvous.stores.etcd.store import EtcdStore
from support.etcd_requests import Requests
from support.etcd_server import EtcdCluster
from support.tools import needs_etcd

pytestmark = needs_etcd

HANG = 60.0  # generous bound that only catches hangs
SHORT = 1.0  # a wait that must end at its timeout


@pytest.fixture(scope="module")
def cluster() -> Iterator[EtcdCluster]:
    with EtcdCluster(size=3) as started:
        yield started


@pytest.fixture
def pair(cluster: EtcdCluster) -> Iterator[tuple[EtcdStore, EtcdStore]]:
    run_id = uuid.uuid4().hex
    options = etcd_options_from_conf({})
    reader = EtcdStore(parse_endpoints(cluster.endpoints[0]), run_prefix(run_id), options)
    writer = EtcdStore(parse_endpoints(cluster.endpoints[1]), run_prefix(run_id), options)
    try:
        yield reader, writer
    finally:
        reader.close()
        writer.close()


def test_a_wait_get_on_keys_already_there_reads_them_in_its_one_request(
    pair: tuple[EtcdStore, EtcdStore],
) -> None:
    reader, writer = pair
    writer.set("r1/members", b"the members")
    writer.set("r1/master", b"the master")
    counted = Requests(reader)
    found, values = reader.wait_get(
        ["r1/members", "r1/master"], HANG, ["r1/master", "r1/absent", "r1/members"]
    )
    assert found
    assert values == [b"the master", None, b"the members"]
    assert counted.paths == ["kv/txn"]


def test_a_wait_get_that_waits_reads_what_was_written_meanwhile(
    pair: tuple[EtcdStore, EtcdStore],
) -> None:
    reader, writer = pair
    writer.set("r1/members", b"the members")

    def later() -> None:
        time.sleep(0.3)
        writer.set("r1/master", b"late")

    thread = threading.Thread(target=later)
    thread.start()
    try:
        found, values = reader.wait_get(["r1/master"], HANG, ["r1/members", "r1/master"])
    finally:
        thread.join(HANG)
    assert found
    assert values == [b"the members", b"late"]


def test_a_wait_get_that_times_out_still_answers_its_reads(
    pair: tuple[EtcdStore, EtcdStore],
) -> None:
    reader, writer = pair
    writer.set("r1/members", b"the members")
    found, values = reader.wait_get(["r1/members", "r1/never"], SHORT, ["r1/members", "r1/never"])
    assert not found
    assert values == [b"the members", None]


def test_the_failure_log_is_read_in_two_requests_holes_and_swept_entries_left_out(
    pair: tuple[EtcdStore, EtcdStore],
) -> None:
    reader, writer = pair
    keys = Keys("batched")
    posting = Board(writer, keys, "writer")
    for n in range(1, 6):
        posting.add_failure({"round": n, "what": f"failure {n}"})
    writer.add(keys.failure_count, 1)  # a writer that died between its slot and its entry
    posting.add_failure({"round": 7, "what": "failure 7"})
    writer.set(keys.failures_from, b"3")  # entries 1 and 2 were swept
    counted = Requests(reader)
    found = Board(reader, keys, "reader").failures()
    assert [(f["seq"], f["what"]) for f in found] == [
        (3, "failure 3"),
        (4, "failure 4"),
        (5, "failure 5"),
        (7, "failure 7"),
    ]
    assert counted.paths == ["kv/txn", "kv/txn"]  # the bounds, then the entries
    assert counted.paths.count("kv/put") == 0  # reading the log writes nothing


def test_an_empty_failure_log_is_read_in_one_request(pair: tuple[EtcdStore, EtcdStore]) -> None:
    reader, _ = pair
    counted = Requests(reader)
    assert Board(reader, Keys("batched"), "reader").failures() == []
    assert counted.paths == ["kv/txn"]
