"""A spare waiting on a real 3-member etcd while the job's round runs (issue 41, session 56):
each wake of its wait reads what it needs in one request, then waits on the next round's
``open`` key (``EtcdStore.wait``: a read, a watch, a read), and it still leaves when the
job ends.

The three nodes are ``DynamicRendezvous`` handlers in threads, each on an ``EtcdStore`` of
its own. The spare's requests are counted by wrapping its own client (every request still
goes to etcd), and only those its joining thread sends: its heartbeat and lease threads
send theirs on the same client. Counts, not times: the wakes are counted by the watches the
wait opens, one a wake.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from phalanx.errors import NotNeeded
from phalanx.rendezvous.dynamic.handler import DynamicRendezvous
from phalanx.rendezvous.stores.etcd.conf import etcd_options_from_conf, parse_endpoints, run_prefix
from phalanx.rendezvous.stores.etcd.store import EtcdStore
from support.etcd_server import EtcdCluster
from support.launch import wait_for
from support.memcluster import FAST, WAIT, Join, agreed
from support.tools import needs_etcd

pytestmark = needs_etcd

WAKES = 6  # wakes counted (each a watch opened by the wait)
# Requests the joining thread may send per wake besides its watch: the wake's reads (one
# transaction) and the wait's two (its read of the ``open`` key, and the read that follows the
# watch's creation). Eight before (one request per read).
PER_WAKE = 3


class Counted:
    """The paths of the requests one thread sends through a store's client (``stream``:
    ``watch``), in order."""

    def __init__(self, store: EtcdStore, thread: threading.Thread) -> None:
        self.paths: list[str] = []
        self._lock = threading.Lock()
        client = store._client
        call, stream = client.call, client.stream

        def counted_call(path: str, body: Any, decode: Callable[[Any], Any], **kw: Any) -> Any:
            self._count(thread, path)
            return call(path, body, decode, **kw)

        def counted_stream(path: str, body: Any, deadline: float) -> Any:
            self._count(thread, path)
            return stream(path, body, deadline)

        client.call = counted_call  # type: ignore[method-assign]
        client.stream = counted_stream  # type: ignore[method-assign]

    def _count(self, thread: threading.Thread, path: str) -> None:
        if threading.current_thread() is thread:
            with self._lock:
                self.paths.append(path)

    def taken(self) -> list[str]:
        with self._lock:
            return list(self.paths)


@pytest.fixture(scope="module")
def cluster() -> Iterator[EtcdCluster]:
    with EtcdCluster(size=3) as started:
        yield started


@pytest.fixture
def nodes(cluster: EtcdCluster) -> Iterator[list[DynamicRendezvous]]:
    """Three nodes of one job at --nnodes 2:2, each on a store of its own (member i on etcd
    member i), shut down after the test."""
    run_id = uuid.uuid4().hex
    options = etcd_options_from_conf({})
    made: list[DynamicRendezvous] = []
    try:
        for i in range(3):
            store = EtcdStore(parse_endpoints(cluster.endpoints[i]), run_prefix(run_id), options)
            node = DynamicRendezvous(
                store, run_id=run_id, min_nodes=2, max_nodes=2, addr=f"addr-{i}",
                hostname=f"node{i}", settings=FAST,
            )  # fmt: skip
            made.append(node)
        yield made
    finally:
        for node in made:
            node.shutdown()


def test_a_waiting_spare_reads_each_wake_in_one_request_and_leaves_when_the_job_ends(
    nodes: list[DynamicRendezvous],
) -> None:
    a, b, spare = nodes
    agreed([j.result() for j in [Join(a), Join(b)]])
    waiting = Join(spare)
    counted = Counted(spare._store, waiting._thread)  # type: ignore[arg-type]

    # Between the first watch counted and the last: whole wakes only (each ends in a watch).
    wait_for(lambda: counted.taken().count("watch") > WAKES, WAIT, f"{WAKES} wakes of the spare")
    paths = counted.taken()
    first = paths.index("watch")
    whole = paths[first + 1 : len(paths) - paths[::-1].index("watch")]
    watches = whole.count("watch")
    assert watches >= WAKES - 1, paths
    requests = len(whole) - watches
    assert requests <= PER_WAKE * watches, (
        f"{requests} requests in {watches} wakes (at most {PER_WAKE} a wake): {whole}"
    )

    # Ends as before: the job finishes, the spare is not needed.
    for node in (a, b):
        node.report_done(True)
    with pytest.raises(NotNeeded, match="not needed"):
        waiting.joined()
