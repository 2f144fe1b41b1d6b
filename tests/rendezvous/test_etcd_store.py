"""The etcd v3 store against real etcd servers (``support.tools.ETCD``): no mocks of etcd."""

from __future__ import annotations

import base64
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import requests

from phalanx.errors import RendezvousError, UsageError
from phalanx.rendezvous.stores.base import KVStore, MalformedValue, StoreUnavailable
from phalanx.rendezvous.stores.etcd import wire
from phalanx.rendezvous.stores.etcd.conf import parse_endpoints, run_prefix
from phalanx.rendezvous.stores.etcd.store import (
    EtcdOptions,
    EtcdRequestError,
    EtcdStore,
    LeaseExpired,
    create_etcd_store,
    etcd_options_from_conf,
)
from support.drop_reply import DropOneReply
from support.etcd_server import (
    EtcdCluster,
    authenticate,
    enable_auth,
    make_tls_files,
    revoke_all_leases,
)
from support.tools import needs_etcd

SRC = Path(__file__).resolve().parents[2] / "src"
HANG = 60.0  # generous bound that only catches hangs

pytestmark = needs_etcd

StoreFactory = Callable[..., EtcdStore]


# -- tier (a): options and endpoints, pure ------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "scheme", "expected"),
    [
        ("localhost", "http", ["http://localhost:2379"]),
        ("10.0.0.1:2380", "http", ["http://10.0.0.1:2380"]),
        ("a:1, b:2 ,c", "http", ["http://a:1", "http://b:2", "http://c:2379"]),
        ("etcd.example", "https", ["https://etcd.example:2379"]),
        ("http://h:5,https://g", "https", ["http://h:5", "https://g:2379"]),
        ("[::1]:2379", "http", ["http://[::1]:2379"]),
        ("https://[fe80::1]", "http", ["https://[fe80::1]:2379"]),
    ],
)
def test_parse_endpoints(text: str, scheme: str, expected: list[str]) -> None:
    assert parse_endpoints(text, scheme=scheme) == expected


@pytest.mark.parametrize(
    "text", ["", "a,,b", "h:port", "h:99999", "ftp://h", "http://h/x", "u@h:1"]
)
def test_parse_endpoints_rejects(text: str) -> None:
    with pytest.raises(UsageError, match="--rdzv-endpoint"):
        parse_endpoints(text)


def test_options_from_conf(tmp_path: Path) -> None:
    for name in ("ca.pem", "c.pem", "k.pem"):
        (tmp_path / name).write_text("x")
    conf = {
        "ca_cert": str(tmp_path / "ca.pem"),  # torchrun's etcd-v3 spellings are aliases
        "ssl_cert": str(tmp_path / "c.pem"),
        "key": str(tmp_path / "k.pem"),
        "user": "alice",
        "password": "pw",
        "request_timeout": "2.5",
        "lease_ttl": "4",
        "join_timeout": "600",  # the rendezvous's key: skipped here
        "last_call_timeout": "5",
    }
    assert etcd_options_from_conf(conf) == EtcdOptions(
        cacert=str(tmp_path / "ca.pem"),
        cert=str(tmp_path / "c.pem"),
        key=str(tmp_path / "k.pem"),
        user="alice",
        password="pw",
        request_timeout=2.5,
        lease_ttl=4.0,
    )
    assert etcd_options_from_conf(conf).scheme == "https"
    assert etcd_options_from_conf({}) == EtcdOptions()
    assert EtcdOptions().scheme == "http"
    assert etcd_options_from_conf({"protocol": "https"}).scheme == "https"


def test_options_from_conf_reports_every_problem(tmp_path: Path) -> None:
    conf = {
        "protocol": "gopher",
        "cacert": str(tmp_path / "missing.pem"),
        "cert": str(tmp_path / "missing-cert.pem"),
        "password": "pw",
        "request_timeout": "soon",
        "lease_ttl": "-1",
        "colour": "blue",
    }
    with pytest.raises(UsageError) as info:
        etcd_options_from_conf(conf)
    text = "\n".join(info.value.problems)
    assert len(info.value.problems) == 8, text
    for fragment in (
        "protocol=gopher",
        "missing.pem: no such file",
        "missing-cert.pem: no such file",
        "cert and key go together",
        "a password is given (--rdzv-conf password) without user",
        "request_timeout=soon",
        "lease_ttl=-1",
        "--rdzv-conf colour: unknown key for etcd (known: ca_cert, cacert, cert,",
    ):
        assert fragment in text
    with pytest.raises(UsageError, match="sets cacert twice"):
        etcd_options_from_conf({"cacert": "/dev/null", "ca_cert": "/dev/null"})


def test_run_prefix_quotes_the_run_id() -> None:
    assert run_prefix("job-1") == "/phalanx/runs/job-1/"
    assert run_prefix("a/b c") == "/phalanx/runs/a%2Fb%20c/"
    with pytest.raises(UsageError, match="rdzv-id"):
        run_prefix("")


# -- tier (c): one real etcd server ------------------------------------------------------------


@pytest.fixture(scope="module")
def etcd() -> Iterator[EtcdCluster]:
    with EtcdCluster(size=1) as cluster:
        yield cluster


@pytest.fixture
def make_store() -> Iterator[StoreFactory]:
    """``make_store(cluster, run_id, **conf)`` -> a connected store, closed after the test."""
    stores: list[EtcdStore] = []

    def make(cluster: EtcdCluster, run_id: str = "", **conf: str) -> EtcdStore:
        store = create_etcd_store(cluster.endpoint_arg, run_id or uuid.uuid4().hex, conf)
        stores.append(store)
        return store

    yield make
    for store in stores:
        store.close()


def test_is_a_kvstore(etcd: EtcdCluster, make_store: StoreFactory) -> None:
    store: KVStore = make_store(etcd)  # mypy checks the protocol; this checks it runs
    assert store.get("nothing") is None


def test_get_set_delete(etcd: EtcdCluster, make_store: StoreFactory) -> None:
    store = make_store(etcd)
    assert store.get("k") is None
    store.set("k", b"v1")
    assert store.get("k") == b"v1"
    store.set("k", b"")  # empty and binary values survive the gateway's base64/JSON
    assert store.get("k") == b""
    store.set("bin", bytes(range(256)))
    assert store.get("bin") == bytes(range(256))
    assert store.delete("k") is True
    assert store.get("k") is None
    assert store.delete("k") is False


def test_delete_prefix_deletes_that_prefix_only(
    etcd: EtcdCluster, make_store: StoreFactory
) -> None:
    run_id = uuid.uuid4().hex
    store, other_run = make_store(etcd, run_id), make_store(etcd)
    for key in ("r1/a", "r1/b/c", "r10/a", "r1", "r2/a"):
        store.set(key, b"x")
    other_run.set("r1/a", b"y")
    store.delete_prefix("r1/")
    assert [store.get(k) for k in ("r1/a", "r1/b/c", "r10/a", "r1", "r2/a")] == [
        None, None, b"x", b"x", b"x"
    ]  # fmt: skip
    assert other_run.get("r1/a") == b"y"  # another run's keys are under another prefix


def test_add(etcd: EtcdCluster, make_store: StoreFactory) -> None:
    store = make_store(etcd)
    assert store.add("n", 1) == 1  # absent counts as 0
    assert store.add("n", 5) == 6
    assert store.add("n", -10) == -4
    assert store.get("n") == b"-4"
    store.set("text", b"abc")
    with pytest.raises(MalformedValue, match=r"'text'.*not an integer"):
        store.add("text", 1)


def test_compare_set(etcd: EtcdCluster, make_store: StoreFactory) -> None:
    store = make_store(etcd)
    assert store.compare_set("c", b"x", b"y") == (False, None)  # expected a value, key absent
    assert store.get("c") is None
    assert store.compare_set("c", None, b"first") == (True, b"first")
    assert store.compare_set("c", None, b"second") == (False, b"first")
    assert store.compare_set("c", b"wrong", b"second") == (False, b"first")
    assert store.compare_set("c", b"first", b"second") == (True, b"second")
    assert store.get("c") == b"second"


# Each conditional write once more, with its first reply lost: (how to do it, what a second
# application would have returned, had the receipt not told the resent request "done").
ONCE: dict[str, tuple[Callable[[EtcdStore], object], object]] = {
    "add": (lambda store: store.add("k", 5), 5),
    "compare_set": (lambda store: store.compare_set("k", None, b"one"), (True, b"one")),
    "delete": (lambda store: store.delete("k"), True),
}


@pytest.mark.parametrize("op", ONCE)
def test_a_request_resent_after_a_lost_reply_applies_once(
    etcd: EtcdCluster, make_store: StoreFactory, op: str
) -> None:
    """A proxy forwards the first transaction on the key but drops etcd's reply: the client
    resends it (one endpoint: to the same member), and the receipt key makes that a no-op."""
    run_id = uuid.uuid4().hex
    direct = make_store(etcd, run_id)
    if op == "delete":
        direct.set("k", b"there")
    port = int(etcd.endpoints[0].rsplit(":", 1)[1])
    key = wire.b64(f"{run_prefix(run_id)}kv/k".encode()).encode()
    with DropOneReply(port, lambda r: r.startswith(b"POST /v3/kv/txn ") and key in r) as proxy:
        store = EtcdStore([proxy.endpoint], run_prefix(run_id), EtcdOptions())
        try:
            do, once = ONCE[op]
            assert do(store) == once
        finally:
            store.close()
        assert proxy.dropped.is_set()
        resent = [r for r in proxy.requests if r.startswith(b"POST /v3/kv/txn ") and key in r]
        assert len(resent) == 2  # the lost one and its resend
        assert resent[0].partition(b"\r\n\r\n")[2] == resent[1].partition(b"\r\n\r\n")[2]
    assert direct.get("k") == {"add": b"5", "compare_set": b"one", "delete": None}[op]


def test_concurrent_adds_from_many_clients_are_atomic(
    etcd: EtcdCluster, make_store: StoreFactory
) -> None:
    run_id = uuid.uuid4().hex
    stores = [make_store(etcd, run_id) for _ in range(4)]
    results: list[int] = []
    lock = threading.Lock()

    def adder(store: EtcdStore) -> None:
        for _ in range(10):
            value = store.add("counter", 1)
            with lock:
                results.append(value)

    threads = [threading.Thread(target=adder, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=HANG)
    assert sorted(results) == list(range(1, 41))  # every sum seen exactly once
    assert stores[0].get("counter") == b"40"


def test_concurrent_compare_set_has_one_winner(etcd: EtcdCluster, make_store: StoreFactory) -> None:
    run_id = uuid.uuid4().hex
    stores = [make_store(etcd, run_id) for _ in range(5)]
    outcomes: dict[int, tuple[bool, bytes | None]] = {}
    barrier = threading.Barrier(len(stores))

    def claim(i: int) -> None:
        barrier.wait(timeout=HANG)
        outcomes[i] = stores[i].compare_set("leader", None, f"node-{i}".encode())

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(len(stores))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=HANG)
    winners = [i for i, (swapped, _) in outcomes.items() if swapped]
    assert len(winners) == 1
    leader = f"node-{winners[0]}".encode()
    assert all(current == leader for _, current in outcomes.values())


def test_wait(etcd: EtcdCluster, make_store: StoreFactory) -> None:
    store = make_store(etcd)
    assert store.wait([], timeout=1) is True
    store.set("a", b"1")
    assert store.wait(["a"], timeout=1) is True
    assert store.wait(["a", "b"], timeout=0.5) is False  # returns at its timeout
    assert store.wait(["b"], timeout=0) is False


def test_wait_is_satisfied_by_another_clients_set(
    etcd: EtcdCluster, make_store: StoreFactory
) -> None:
    run_id = uuid.uuid4().hex
    waiter, writer = make_store(etcd, run_id), make_store(etcd, run_id)
    writer.set("x", b"1")

    def set_later() -> None:
        writer.set("y", b"2")
        writer.set("z", b"3")

    setter = threading.Timer(0.5, set_later)
    setter.start()
    try:
        assert waiter.wait(["x", "y", "z"], timeout=HANG) is True
    finally:
        setter.join(timeout=HANG)
    assert waiter.get("z") == b"3"


def test_wait_counts_a_deleted_key_as_missing(etcd: EtcdCluster, make_store: StoreFactory) -> None:
    run_id = uuid.uuid4().hex
    waiter, writer = make_store(etcd, run_id), make_store(etcd, run_id)
    writer.set("a", b"1")
    seen: list[bytes | None] = []

    def wait_then_read() -> None:
        assert waiter.wait(["a", "b"], timeout=HANG)
        seen.append(waiter.get("a"))  # "a" must exist when wait says so

    thread = threading.Thread(target=wait_then_read)
    thread.start()
    time.sleep(0.5)  # let the watch open (if it opens later, it reads the new state: fine)
    writer.delete("a")
    writer.set("b", b"2")
    time.sleep(0.5)
    writer.set("a", b"3")
    thread.join(timeout=HANG)
    assert seen == [b"3"]


def test_credentials_for_a_server_without_auth(etcd: EtcdCluster, make_store: StoreFactory) -> None:
    store = make_store(etcd, user="alice", password="pw")  # etcd's Go client goes on as well
    store.set("k", b"v")
    assert store.get("k") == b"v"


def test_run_ids_isolate(etcd: EtcdCluster, make_store: StoreFactory) -> None:
    a, b, nested = make_store(etcd, "run"), make_store(etcd, "run-b"), make_store(etcd, "run/kv")
    a.set("k", b"a")
    b.set("k", b"b")
    assert (a.get("k"), b.get("k"), nested.get("k")) == (b"a", b"b", None)
    a.set("kv/x", b"a")  # would collide with run "run/kv"'s key "x" without quoting
    assert nested.get("x") is None
    assert b.add("n", 1) == 1 and a.add("n", 1) == 1
    assert b.wait(["only-in-a"], timeout=0.3) is False
    a.set("only-in-a", b"1")
    assert b.wait(["only-in-a"], timeout=0.3) is False


def test_close_revokes_the_lease(etcd: EtcdCluster, make_store: StoreFactory) -> None:
    run_id = uuid.uuid4().hex
    owner, other = make_store(etcd, run_id), make_store(etcd, run_id)
    owner.set_ephemeral("member", b"me")
    owner.set("plain", b"stays")
    assert other.get("member") == b"me"
    owner.close()
    assert other.get("member") is None
    assert other.get("plain") == b"stays"
    owner.close()  # idempotent


def test_close_drops_the_receipt_even_when_etcd_refuses_the_revoke(
    etcd: EtcdCluster, make_store: StoreFactory
) -> None:
    """A lease gone before the close (revoked, or lapsed while the node was frozen): etcd
    refuses the revoke, and the receipt key, which no lease removes, must still go."""
    owner = make_store(etcd, lease_ttl="30")  # renewed every 10 s: no renewal sees it gone
    owner.set_ephemeral("member", b"me")
    owner.add("counter", 1)  # a conditional write: the receipt key is written
    receipt = {"key": base64.b64encode(owner.receipt.encode()).decode(), "count_only": True}

    def receipts() -> int:
        with etcd.session() as session:
            reply = session.post(f"{etcd.endpoints[0]}/v3/kv/range", json=receipt, timeout=10)
        return int(reply.json().get("count", 0))

    assert receipts() == 1
    assert revoke_all_leases(etcd) >= 1
    owner.close()
    assert receipts() == 0


def test_lost_lease_is_reported(etcd: EtcdCluster, make_store: StoreFactory) -> None:
    store = make_store(etcd)
    store.set_ephemeral("member", b"me")
    assert revoke_all_leases(etcd) >= 1
    with pytest.raises(LeaseExpired):
        store.set_ephemeral("member", b"again")
    assert store.get("member") is None
    store.set("plain", b"still works")  # the store itself is fine


CHILD = """
import sys, time
from phalanx.rendezvous.stores.etcd.store import create_etcd_store
store = create_etcd_store(sys.argv[1], sys.argv[2], {"lease_ttl": "2"})
store.set("plain", b"stays")
store.set_ephemeral("member", b"alive")
print("ready", flush=True)
time.sleep(600)
"""


def _read_line(process: subprocess.Popen[bytes], timeout: float) -> bytes:
    assert process.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        if not selector.select(timeout):
            raise AssertionError(f"no output from pid {process.pid} in {timeout} s")
    return process.stdout.readline()


def test_ephemeral_key_vanishes_when_its_owner_is_killed(
    etcd: EtcdCluster, make_store: StoreFactory
) -> None:
    run_id = uuid.uuid4().hex
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
    }
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, etcd.endpoint_arg, run_id],
        stdout=subprocess.PIPE,
        env=env,
        start_new_session=True,
    )
    try:
        assert _read_line(child, HANG) == b"ready\n"
        observer = make_store(etcd, run_id)
        time.sleep(5)  # 2.5 lease TTLs: only the keep-alive thread keeps the key
        assert observer.get("member") == b"alive"
        os.killpg(child.pid, signal.SIGKILL)  # no close(), no revoke: only expiry removes it
        child.wait(timeout=HANG)
        with pytest.raises(ProcessLookupError):
            os.kill(child.pid, 0)
        deadline = time.monotonic() + HANG
        while observer.get("member") is not None:
            assert time.monotonic() < deadline, "the ephemeral key outlived its lease"
            time.sleep(0.2)
        assert observer.get("plain") == b"stays"
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait(timeout=HANG)


def test_unreachable_endpoint_raises_store_unavailable() -> None:
    with EtcdCluster(size=1) as cluster:
        endpoint = cluster.endpoint_arg
    with pytest.raises(StoreUnavailable, match=f"{endpoint}: Connection refused"):
        create_etcd_store(endpoint, "r", {"request_timeout": "1"})


# -- tier (c): a 3-member cluster ----------------------------------------------------------------


def test_failover_and_total_loss(make_store: StoreFactory) -> None:
    with EtcdCluster(size=3) as cluster:
        run_id = uuid.uuid4().hex
        store = make_store(cluster, run_id, request_timeout="15")
        writer = EtcdStore([cluster.endpoints[2]], run_prefix(run_id), EtcdOptions())
        try:
            store.set("before", b"1")
            assert store.current_endpoint == cluster.endpoints[0]
            result: list[bool] = []
            waiter = threading.Thread(target=lambda: result.append(store.wait(["late"], HANG)))
            waiter.start()
            time.sleep(1)  # let the watch open on member 0 (if not, it opens elsewhere: fine)
            cluster.stop_member(0)
            writer.set("late", b"2")
            waiter.join(timeout=HANG + 10)
            assert result == [True]  # the broken watch resumed on another member

            assert store.get("before") == b"1"
            assert store.current_endpoint != cluster.endpoints[0]
            store.set("after", b"3")
            assert store.add("n", 2) == 2
            assert store.compare_set("c", None, b"x") == (True, b"x")
            store.set_ephemeral("member", b"me")
            assert store.delete("after") is True
            assert writer.get("member") == b"me"
        finally:
            writer.close()

        # Member 2 alone has no quorum: it refuses (no leader) instead of answering stale data.
        cluster.stop_member(1)
        lonely = EtcdStore(
            cluster.endpoints[2:], run_prefix(run_id), EtcdOptions(request_timeout=5)
        )
        try:
            with pytest.raises(StoreUnavailable, match=cluster.endpoints[2]):
                lonely.get("before")
        finally:
            lonely.close()

        cluster.stop_member(2)
        down = EtcdStore(cluster.endpoints, run_prefix(run_id), EtcdOptions(request_timeout=3))
        started = time.monotonic()
        with pytest.raises(StoreUnavailable) as info:
            down.get("before")
        assert time.monotonic() - started < HANG
        assert str(info.value).count("Connection refused") == 3, info.value
        for endpoint in cluster.endpoints:
            assert endpoint in str(info.value)
        down.close()


# -- tier (c): credentials and TLS --------------------------------------------------------------


@pytest.fixture(scope="module")
def etcd_auth() -> Iterator[EtcdCluster]:
    # Tokens live 2 s, so a test can see the store log in again after one expired.
    with EtcdCluster(size=1, extra_args=("--auth-token-ttl=2",)) as cluster:
        enable_auth(
            cluster,
            {"alice": ("alice-pw", "/phalanx/"), "bob": ("bob-pw", "/phalanx/runs/bobs/")},
        )
        yield cluster


def test_user_and_password(etcd_auth: EtcdCluster, make_store: StoreFactory) -> None:
    run_id = uuid.uuid4().hex
    store = make_store(etcd_auth, run_id, user="alice", password="alice-pw")
    other = make_store(etcd_auth, run_id, user="alice", password="alice-pw")
    store.set("k", b"v")
    assert other.get("k") == b"v"
    assert store.add("n", 3) == 3
    assert store.compare_set("c", None, b"x") == (True, b"x")
    threading.Timer(0.3, other.set, args=("w", b"1")).start()
    assert store.wait(["w"], timeout=HANG) is True
    store.set_ephemeral("member", b"me")
    assert other.get("member") == b"me"
    assert store.delete("k") is True

    old_token = authenticate(etcd_auth, "alice", "alice-pw")
    time.sleep(4)  # past --auth-token-ttl=2: every token issued so far is dead
    reply = requests.post(
        f"{etcd_auth.endpoints[0]}/v3/kv/range",
        json={"key": "YQ=="},
        headers={"Authorization": old_token},
        timeout=10,
    )
    assert reply.json()["code"] == 16  # UNAUTHENTICATED: the token expired
    assert store.get("c") == b"x"  # ... and the store logged in again by itself
    assert store.wait(["c"], timeout=1) is True


def test_bad_credentials_fail_at_once(etcd_auth: EtcdCluster) -> None:
    with pytest.raises(EtcdRequestError, match=r"did not accept user 'alice'.*password"):
        create_etcd_store(etcd_auth.endpoint_arg, "r", {"user": "alice", "password": "nope"})
    with pytest.raises(RendezvousError, match="user name is empty"):
        create_etcd_store(etcd_auth.endpoint_arg, "r", {})
    with pytest.raises(EtcdRequestError, match="permission denied"):  # bob may only use run "bobs"
        create_etcd_store(etcd_auth.endpoint_arg, "alices", {"user": "bob", "password": "bob-pw"})
    create_etcd_store(etcd_auth.endpoint_arg, "bobs", {"user": "bob", "password": "bob-pw"}).close()


def test_tls_with_client_certificates(tmp_path: Path, make_store: StoreFactory) -> None:
    tls = make_tls_files(tmp_path / "tls")
    with EtcdCluster(size=1, tls=tls) as cluster:
        assert cluster.endpoints[0].startswith("https://")
        files = {"cacert": str(tls.ca), "cert": str(tls.client_cert), "key": str(tls.client_key)}
        run_id = uuid.uuid4().hex
        store, other = make_store(cluster, run_id, **files), make_store(cluster, run_id, **files)
        store.set("k", b"v")
        threading.Timer(0.3, other.set, args=("w", b"1")).start()
        assert store.wait(["w"], timeout=HANG) is True
        assert other.get("k") == b"v"
        # Without the client certificate the server refuses the handshake; without the CA
        # the client refuses the server: both are reported with the endpoint and the reason.
        bare = cluster.endpoints[0].removeprefix("https://")
        no_cert = {"cacert": str(tls.ca), "request_timeout": "2"}
        with pytest.raises(StoreUnavailable, match=r"SSL|EOF|reset"):
            create_etcd_store(bare, run_id, no_cert)
        no_ca = {"cert": str(tls.client_cert), "key": str(tls.client_key), "request_timeout": "2"}
        with pytest.raises(StoreUnavailable, match="CERTIFICATE_VERIFY_FAILED"):
            create_etcd_store(bare, run_id, no_ca)
