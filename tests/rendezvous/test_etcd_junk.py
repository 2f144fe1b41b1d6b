"""etcd replies that are junk: a fake etcd on loopback (``support.fake_etcd``) answers one
endpoint phalanx calls with a chosen malformed reply, everything else plausibly.

Each row asserts the one-line error phalanx raises (naming the endpoint and the request) and
that the call returns: never an endless loop, a ``KeyError``/``TypeError`` traceback or a dead
lease thread. One row runs the real CLI against the fake. The client's per-thread HTTP
sessions are counted too: threads that used the store and ended leave none open.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from phalanx.rendezvous.dynamic.pulse import ALIVE
from phalanx.rendezvous.stores.base import MalformedReply, MalformedValue, StoreUnavailable
from phalanx.rendezvous.stores.etcd.conf import run_prefix
from phalanx.rendezvous.stores.etcd.store import EtcdOptions, EtcdStore
from support.fake_etcd import HEADER, JSON, FakeEtcd, Junk, junk_json
from support.launch import run_phalanx, wait_for

HANG = 30.0  # generous: only catches a call that never returns
OPTIONS = EtcdOptions(request_timeout=1.0, lease_ttl=3.0)


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def kv(key: str = "k", value: object = "MQ==", mod: object = "3") -> JSON:
    found: JSON = {"key": b64(key), "mod_revision": mod}
    if value is not None:
        found["value"] = value
    return found


def failed_txn(*responses: object) -> Junk:
    return junk_json({"header": HEADER, "responses": list(responses)})


def ranged(*kvs: object) -> JSON:
    return {"response_range": {"header": HEADER, "kvs": list(kvs)}}


def watch_lines(*lines: bytes) -> Junk:
    return Junk(b"".join(line + b"\n" for line in lines))


def always_changed(request: JSON) -> Junk:
    """A well-formed reply that says the compare failed and the key is absent, every time:
    the shape that made ``add`` retry forever."""
    return failed_txn(ranged(), ranged())


Op = Callable[[EtcdStore], object]
GET: Op = lambda s: s.get("k")  # noqa: E731
ADD: Op = lambda s: s.add("k", 1)  # noqa: E731
CAS: Op = lambda s: s.compare_set("k", b"old", b"new")  # noqa: E731
DELETE: Op = lambda s: s.delete("k")  # noqa: E731
SET: Op = lambda s: s.set("k", b"v")  # noqa: E731
EPHEMERAL: Op = lambda s: s.set_ephemeral("k", b"v")  # noqa: E731
WAIT: Op = lambda s: s.wait(["k"], 10.0)  # noqa: E731
CHECK: Op = lambda s: s.check()  # noqa: E731

# (operation, path answered with junk, the junk, the error, what its message says)
ROWS: dict[str, tuple[Op, str, Junk | Callable[[JSON], Junk], type[Exception], str]] = {
    "range not JSON": (GET, "kv/range", Junk(b"<html>hello</html>"), StoreUnavailable,
                       "answered kv/range within 1 s .*HTTP 200, not etcd's JSON gateway"),
    "range a JSON list": (GET, "kv/range", junk_json([1, 2]), StoreUnavailable,
                          "HTTP 200, not etcd's JSON gateway"),
    "range {}": (GET, "kv/range", junk_json({}), MalformedReply,
                 "malformed reply to kv/range: reply has no 'header'"),
    "check {}": (CHECK, "kv/range", junk_json({}), MalformedReply,
                 "malformed reply to kv/range: reply has no 'header'"),
    "range revision not a number": (GET, "kv/range", junk_json({"header": {"revision": "x"}}),
                                    MalformedReply, "reply.header.revision is 'x', not an integer"),
    "range kvs a string": (GET, "kv/range", junk_json({"header": HEADER, "kvs": "x"}),
                           MalformedReply, "reply.kvs is 'x', not list"),
    "range kv not an object": (GET, "kv/range", junk_json({"header": HEADER, "kvs": [7]}),
                               MalformedReply, r"reply.kvs\[0\] is 7, not an object"),
    "range value bad base64": (GET, "kv/range", junk_json({"header": HEADER, "kvs": [kv(value="!!")]}),
                               MalformedReply, r"reply.kvs\[0\].value is '!!', not base64"),
    "range value a number": (GET, "kv/range", junk_json({"header": HEADER, "kvs": [kv(value=5)]}),
                             MalformedReply, r"reply.kvs\[0\].value is 5, not str"),
    "range no mod_revision": (GET, "kv/range",
                              junk_json({"header": HEADER, "kvs": [{"key": b64("k")}]}),
                              MalformedReply, r"reply.kvs\[0\] has no 'mod_revision'"),
    "error code not a number": (GET, "kv/range", junk_json({"code": "abc"}, 500), MalformedReply,
                                "HTTP 500 with error code 'abc', not a gRPC code"),
    "put {}": (SET, "kv/put", junk_json({}), MalformedReply,
               "malformed reply to kv/put: reply has no 'header'"),
    "txn {} for add": (ADD, "kv/txn", junk_json({}), MalformedReply,
                       "kv/txn: 0 responses to the 2 operations of its failure branch"),
    "txn succeeded without responses": (ADD, "kv/txn", junk_json({"header": HEADER, "succeeded": True}),
                                        MalformedReply, "0 responses to the 2 operations of its success branch"),
    "txn responses a string": (ADD, "kv/txn", junk_json({"header": HEADER, "responses": "x"}),
                               MalformedReply, "reply.responses is 'x', not list"),
    "txn mod_revision junk": (ADD, "kv/txn", failed_txn(ranged(kv(mod="abc")), ranged()),
                              MalformedReply, r"responses\[0\].kvs\[0\].mod_revision is 'abc', not an integer"),
    "txn mod_revision a bool": (ADD, "kv/txn", failed_txn(ranged(kv(mod=True)), ranged()),
                                MalformedReply, "mod_revision is True, not an integer"),
    "txn says absent forever": (ADD, "kv/txn", always_changed, StoreUnavailable,
                                "add\\('k'\\) on etcd at .*: the key changed between each read and write, "
                                r"\d+ tries in [\d.]+ s"),
    "txn value not an integer": (ADD, "kv/txn", failed_txn(ranged(kv(value=b64("abc"))), ranged()),
                                 MalformedValue, "'k': add: b'abc' is not an integer"),
    "txn response of the wrong kind": (CAS, "kv/txn", failed_txn({"response_put": {}}, ranged()),
                                       MalformedReply, r"responses\[0\] has no 'response_range'"),
    "txn response not an object": (CAS, "kv/txn", failed_txn(None, ranged()), MalformedReply,
                                   r"responses\[0\] is None, not an object"),
    "txn succeeded a string": (DELETE, "kv/txn", junk_json({"header": HEADER, "succeeded": "yes"}),
                               MalformedReply, "reply.succeeded is 'yes', not bool"),
    "txn without compare not succeeded": (WAIT, "kv/txn", failed_txn(), MalformedReply,
                                          "a transaction without conditions did not succeed"),
    "lease grant {}": (EPHEMERAL, "lease/grant", junk_json({}), MalformedReply,
                       "malformed reply to lease/grant: reply has no 'ID'"),
    "lease grant without TTL": (EPHEMERAL, "lease/grant", junk_json({"header": HEADER, "ID": "7"}),
                                MalformedReply, "reply has no 'TTL'"),
    "lease grant ID junk": (EPHEMERAL, "lease/grant", junk_json({"ID": [1], "TTL": "3"}),
                            MalformedReply, r"reply.ID is \[1\], not an integer"),
    "lease grant TTL 0": (EPHEMERAL, "lease/grant", junk_json({"ID": "7", "TTL": "0"}),
                          MalformedReply, "granted lease 7 with TTL 0"),
    "watch line not JSON": (WAIT, "watch", watch_lines(b"{oops"), MalformedReply,
                            "malformed reply to watch: a stream line is not JSON: b'{oops'"),
    "watch line a list": (WAIT, "watch", watch_lines(b"[1]"), MalformedReply,
                          r"a stream line is \[1\], not an object"),
    "watch without result": (WAIT, "watch", watch_lines(b'{"x": 1}'), MalformedReply,
                             "line has no 'result'"),
    "watch events a string": (WAIT, "watch", watch_lines(b'{"result": {"events": "x"}}'),
                              MalformedReply, "result.events is 'x', not list"),
    "watch event key bad base64": (WAIT, "watch",
                                   watch_lines(b'{"result": {"events": [{"kv": {"key": "%%"}}]}}'),
                                   MalformedReply, r"result.events\[0\].kv.key is '%%', not base64"),
    "watch event without kv": (WAIT, "watch", watch_lines(b'{"result": {"events": [{}]}}'),
                               MalformedReply, r"result.events\[0\] has no 'kv'"),
    "watch event of an unknown type": (WAIT, "watch",
                                       watch_lines(b'{"result": {"events": [{"type": 3, "kv": {}}]}}'),
                                       MalformedReply, r"result.events\[0\].type is 3, not str"),
    "watch canceled a string": (WAIT, "watch", watch_lines(b'{"result": {"canceled": "no"}}'),
                                MalformedReply, "result.canceled is 'no', not bool"),
}  # fmt: skip


@pytest.fixture
def fake() -> Iterator[FakeEtcd]:
    with FakeEtcd() as server:
        yield server


def returns(call: Callable[[], object]) -> BaseException | None:
    """Run ``call`` in a thread; the exception it raised (``None``: it returned). Fails the
    test if it does not return within ``HANG`` s instead of hanging the run."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
        except BaseException as exc:  # the row's assertion looks at it
            outcome.append(exc)
        else:
            outcome.append(None)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(HANG)
    assert outcome, f"the call did not return within {HANG} s"
    return outcome[0]


@pytest.mark.parametrize("row", ROWS)
def test_a_junk_reply_is_one_line_naming_the_endpoint_and_the_request(
    fake: FakeEtcd, row: str
) -> None:
    op, path, junk, error, says = ROWS[row]
    fake.junk[path] = junk
    store = EtcdStore([fake.endpoint], run_prefix("junk"), OPTIONS)
    try:
        exc = returns(lambda: op(store))
    finally:
        store.close()
    assert type(exc) is error, repr(exc)
    text = str(exc)
    assert "\n" not in text, text
    assert f"127.0.0.1:{fake.port}" in text or error is MalformedValue, text
    assert path in text or error is MalformedValue or "add(" in text, text
    assert re.search(says, text), text


def test_a_junk_keepalive_reply_leaves_the_lease_thread_renewing(
    fake: FakeEtcd, caplog: pytest.LogCaptureFixture
) -> None:
    """``{"result": "x"}`` once killed the keep-alive thread (an AttributeError); now it is
    a warning naming the endpoint, and the thread keeps renewing."""
    fake.junk["lease/keepalive"] = junk_json({"result": "x"})
    options = EtcdOptions(request_timeout=1.0, lease_ttl=1.0)  # renews every 1/3 s
    store = EtcdStore([fake.endpoint], run_prefix("junk"), options)
    try:
        with caplog.at_level(logging.WARNING):
            store.set_ephemeral("k", b"v")
            wait_for(lambda: fake.asked("lease/keepalive") >= 3, HANG, "three keep-alives")
        keepers = [t for t in threading.enumerate() if t.name == "phalanx-etcd-lease"]
        assert len(keepers) == 1 and keepers[0].is_alive()
        said = [r.getMessage() for r in caplog.records if "renew" in r.getMessage()]
        assert len(said) == 1, said  # logged once, not at every attempt
        assert f"{fake.endpoint} sent a malformed reply to lease/keepalive" in said[0]
        assert "result is 'x', not dict" in said[0]
        del fake.junk["lease/keepalive"]  # etcd is sane again: the renewals go on
        seen = fake.asked("lease/keepalive")
        wait_for(lambda: fake.asked("lease/keepalive") >= seen + 2, HANG, "renewals")
        store.set_ephemeral("k2", b"v")  # the lease still counts as held
    finally:
        store.close()


def _get_quietly(store: EtcdStore) -> None:
    # Only the sessions are tested here: a request that times out on a loaded machine
    # (the 1 s budget) still opened and ended its thread's session.
    with contextlib.suppress(StoreUnavailable):
        store.get("k")


def test_threads_that_ended_leave_no_open_sessions(fake: FakeEtcd) -> None:
    """Each thread gets its own HTTP session; one that ended has it closed at the next request,
    so N short-lived threads do not leave N sessions (and their sockets) behind."""
    store = EtcdStore([fake.endpoint], run_prefix("junk"), OPTIONS)
    client = store._client
    try:
        for _ in range(3):  # rounds of threads, as rounds of the rendezvous start them
            threads = [threading.Thread(target=_get_quietly, args=(store,)) for _ in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(HANG)
            assert not any(t.is_alive() for t in threads)
            assert store.get("k") is None  # this thread's request closes theirs
            assert client.open_sessions() == 1
    finally:
        store.close()
    assert client.open_sessions() == 0


def _lease_held(request: JSON) -> Junk:
    """kv/range as etcd answers it while this node's lease is held: its heartbeat key is
    there, every other key absent. So the lease never looks expired, and the node, leaving
    after the junk, is not kept from writing again by a store problem of its own."""
    key = base64.b64decode(request.get("key", "")).decode(errors="replace")
    if "/hb/" not in key:
        return junk_json({"header": HEADER})
    kv = {"key": request["key"], "value": base64.b64encode(ALIVE).decode(), "mod_revision": "5"}
    return junk_json({"header": HEADER, "kvs": [kv], "count": "1"})


CLI_ROWS = {
    "every reply {}": {"kv/range": junk_json({}), "kv/txn": junk_json({})},
    "the first transaction's reply {}": {"kv/txn": junk_json({})},
    # The leave's write got the same junk and said so too (once, under load, before the
    # lease check could keep it quiet): junk is final, so the leave does not write.
    "every transaction's reply {}, the lease held": {
        "kv/txn": junk_json({}),
        "kv/range": _lease_held,
    },
}


@pytest.mark.parametrize("row", CLI_ROWS)
def test_the_cli_against_a_junk_etcd_exits_1_with_one_line(
    fake: FakeEtcd, tmp_path: Path, row: str
) -> None:
    """The real launcher: ``--nnodes 2 --rdzv-backend etcd`` against the fake. The second
    row is the reply shape that once made ``add`` spin forever at 70% CPU."""
    fake.junk.update(CLI_ROWS[row])
    script = tmp_path / "never.py"
    script.write_text("raise SystemExit('the worker must not start')\n")
    started = time.monotonic()
    done = run_phalanx(
        ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "etcd",
         "--rdzv-endpoint", f"127.0.0.1:{fake.port}", "--rdzv-id", "junk",
         "--rdzv-conf", "join_timeout=60,request_timeout=1", str(script)],
        timeout=HANG,
    )  # fmt: skip
    assert time.monotonic() - started < HANG
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr and "must not start" not in done.stderr, done.stderr
    naming = [line for line in done.stderr.splitlines() if f"127.0.0.1:{fake.port}" in line]
    assert len(naming) == 1, done.stderr
    assert "sent a malformed reply to kv/" in naming[0], done.stderr
