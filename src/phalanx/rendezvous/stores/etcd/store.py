"""etcd v3 as the rendezvous store: ``--rdzv-backend etcd`` (and its alias ``etcd-v2``).

torchrun's etcd backends speak the v2 API, which etcd 3.6 removed; this one speaks v3 through
etcd's JSON gateway (see ``etcd_client``). Every key of a run lives under
``/phalanx/runs/<run id>/``, so runs sharing one etcd never see each other.

Liveness: ``set_ephemeral`` binds a key to this store's lease, which a daemon thread renews
every ``lease_ttl / 3`` s (see ``etcd_lease``). When the process dies, or cannot reach etcd for ``lease_ttl``
seconds, etcd deletes every such key: that is how peers learn this node is gone.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence

from phalanx.rendezvous.stores.base import MalformedValue, StoreUnavailable
from phalanx.rendezvous.stores.etcd import wire
from phalanx.rendezvous.stores.etcd.client import EtcdClient, EtcdRequestError
from phalanx.rendezvous.stores.etcd.conf import (
    EtcdOptions,
    etcd_options_from_conf,
    parse_endpoints,
    run_prefix,
)
from phalanx.rendezvous.stores.etcd.lease import LEASE_NOT_FOUND, EtcdLease, LeaseExpired
from phalanx.rendezvous.stores.etcd.misses import Misses
from phalanx.rendezvous.stores.etcd.stream import StreamBroken
from phalanx.rendezvous.stores.etcd.watch import watch_until_present

__all__ = [
    "EtcdOptions",
    "EtcdRequestError",
    "EtcdStore",
    "LeaseExpired",
    "create_etcd_store",
    "etcd_options_from_conf",
]

log = logging.getLogger(__name__)

_CLOSE_TIMEOUT = 3.0  # close() is best effort: an unreachable etcd expires the lease anyway
_TXN_OPS = 128  # etcd's --max-txn-ops default: the most operations one transaction may hold


def create_etcd_store(endpoint: str, run_id: str, conf: dict[str, str]) -> EtcdStore:
    """Connect to etcd for ``--rdzv-backend etcd``/``etcd-v2``; the rendezvous registry calls this.

    ``endpoint`` is ``--rdzv-endpoint`` (``host[:port][,host[:port]...]``, default port
    2379, ``http(s)://`` allowed); ``conf`` is ``--rdzv-conf``. Raises ``UsageError`` for bad
    options, ``StoreUnavailable`` when no endpoint answers and ``EtcdRequestError`` when etcd
    refuses (credentials, permissions). Makes one request, so that such problems show at once.
    """
    options = etcd_options_from_conf(conf)
    return open_etcd_store(parse_endpoints(endpoint, scheme=options.scheme), run_id, options)


def open_etcd_store(endpoints: list[str], run_id: str, options: EtcdOptions) -> EtcdStore:
    """``create_etcd_store`` for options already checked (the backend's ``check``)."""
    store = EtcdStore(endpoints, run_prefix(run_id), options)
    try:
        store.check()
    except BaseException:
        store.close()
        raise
    return store


class EtcdStore:
    """``KVStore`` on etcd v3, plus ``set_ephemeral``. Thread-safe; constructing it does no I/O.

    Data key ``k`` is stored at ``<prefix>kv/<k>``. Conditional writes (``add``,
    ``compare_set``, ``delete``) are transactions that also write this store's receipt key
    ``<prefix>receipts/<store id>`` with a fresh token, and read it back when the condition
    fails: when a reply is lost and the client resends the request to another member, the
    receipt tells whether the first attempt took effect, so no write is applied twice. (The
    one gap: an attempt stuck inside a member that is given up on, applied only after the
    retry failed and after the key returned to the compared state; etcd's own request
    timeouts keep that window to seconds.)

    A receipt is a plain key (no lease): ``close`` deletes it, and for an agent that dies
    without closing its store its guardian does (``set_dropping``, from the last word): else
    each agent SIGKILL left one behind until the run's final clear.
    """

    def __init__(self, endpoints: Sequence[str], prefix: str, options: EtcdOptions) -> None:
        self.prefix = prefix
        self.options = options
        self.hosting = False  # etcd outlives every agent
        self._client = EtcdClient(endpoints, options)
        self._receipt = f"{prefix}receipts/{uuid.uuid4().hex}".encode()
        self._tokens = itertools.count()
        # One receipt key per store, so one conditional write at a time.
        self._txn_lock = threading.Lock()
        self._lease = EtcdLease(self._client, options.lease_ttl)
        self._closed = False
        self._receipt_written = False  # close() deletes the receipt key only if it exists

    @property
    def receipt(self) -> str:
        """This handle's receipt key (whole, prefix included): for its last word."""
        return self._receipt.decode()

    @property
    def lease_ttl(self) -> float:
        return float(self._lease.ttl)

    def on_renewed(self, proved: Callable[[float], None], every: float) -> None:
        """See ``RenewingStore``: fencing hears of every grant and renewal of the lease."""
        self._lease.on_renewed(proved, every)

    @property
    def current_endpoint(self) -> str:
        """The etcd endpoint that answered last."""
        return self._client.current_endpoint

    def check(self) -> None:
        """One cheap request: an endpoint answers and the credentials may read the prefix."""
        body = {"key": wire.b64(self._receipt), "count_only": True}
        self._client.call("kv/range", body, wire.range_reply)

    def get(self, key: str) -> bytes | None:
        kvs = self._client.call("kv/range", {"key": wire.b64(self._key(key))}, wire.range_reply)
        return kvs[0].value if kvs else None

    def set(self, key: str, value: bytes) -> None:
        self._client.call(
            "kv/put", wire.put_op(self._key(key), value)["request_put"], wire.acknowledged
        )

    def set_dropping(self, key: str, value: bytes, receipt: str) -> None:
        """``set``, and delete another handle's ``receipt`` (a dead agent's, named by its last
        word), in one request. Only a receipt key under this run's prefix is deleted."""
        ops = [wire.put_op(self._key(key), value)]
        if receipt.startswith(f"{self.prefix}receipts/"):
            ops.append(wire.delete_op(receipt.encode()))
        self._txn({"success": ops})

    def set_ephemeral(self, key: str, value: bytes) -> None:
        """Set ``key`` bound to this store's lease.

        etcd deletes the key ``lease_ttl`` seconds after this process stops renewing (it died,
        hung, or lost etcd); ``close`` deletes it at once. The lease is granted on first use.
        Raises ``LeaseExpired`` once the lease has lapsed (the node should leave the job).
        """
        body = wire.put_op(self._key(key), value)["request_put"] | {"lease": str(self._lease.id())}
        try:
            self._client.call("kv/put", body, wire.acknowledged)
        except EtcdRequestError as exc:
            if exc.code != LEASE_NOT_FOUND:
                raise
            raise self._lease.lapsed(exc) from None

    def add(self, key: str, amount: int) -> int:
        """Raises ``StoreUnavailable`` when other writers keep changing the key for longer than
        ``request_timeout`` (``misses``), and ``MalformedValue`` when it holds no integer."""
        full = self._key(key)
        found: wire.KV | None = None  # guess "absent"; a miss returns the value
        misses = Misses(key, self._where, self.options.request_timeout)
        while True:
            total = amount + _count(key, found)
            done, (found,) = self._conditional(
                [_compare(full, found)], [(full, str(total).encode())], [full]
            )
            if done:
                return total
            misses.missed()

    def claim_counted(
        self, key: str, value: bytes, counters: list[str], total: int, full: str
    ) -> bool:
        """``CountingStore``: one transaction a try (a ``compare_set`` and an ``add`` per
        counter, then a ``set``, were a request each: four on the round's critical path for
        the last member to settle its place). Raises as ``add`` does."""
        claim, names = self._key(key), [self._key(c) for c in counters]
        found: list[wire.KV | None] = [None] * len(names)  # guess: nothing counted yet
        misses = Misses(counters[-1], self._where, self.options.request_timeout)
        while True:
            counts = [
                str(1 + _count(c, kv)).encode() for c, kv in zip(counters, found, strict=True)
            ]
            puts = [(claim, value), *zip(names, counts, strict=True)]
            if int(counts[-1]) >= total:
                puts.append((self._key(full), b"1"))
            compare = [wire.compare_absent(claim), *map(_compare, names, found)]
            done, (held, *found) = self._conditional(compare, puts, [claim, *names])
            if done or held is not None:  # (held: another node settled the place first)
                return done
            misses.missed()

    def compare_set(
        self, key: str, expected: bytes | None, desired: bytes
    ) -> tuple[bool, bytes | None]:
        full = self._key(key)
        if expected is None:
            compare = wire.compare_absent(full)
        else:
            compare = wire.compare_value(full, expected)
        done, (found,) = self._conditional([compare], [(full, desired)], [full])
        if done:
            return True, desired
        return False, None if found is None else found.value

    def delete(self, key: str) -> bool:
        full = self._key(key)
        with self._txn_lock:
            token = self._token()
            reply = self._txn(
                {
                    "compare": [wire.compare_present(full)],
                    "success": [wire.delete_op(full), wire.put_op(self._receipt, token)],
                    "failure": [wire.range_op(self._receipt)],
                }
            )
        return reply.succeeded or _is_token(reply.first(0), token)

    def delete_prefix(self, prefix: str) -> None:
        """``PrefixStore``: one range delete (no receipt: resent, it deletes nothing new but
        what a straggler wrote there meanwhile, which it was meant to go anyway)."""
        start = self._key(prefix)
        body = {"key": wire.b64(start), "range_end": wire.b64(_prefix_end(start))}
        self._client.call("kv/deleterange", body, wire.acknowledged)

    def clear(self, keep: str) -> None:
        """Delete everything under the run's prefix but data key ``keep``, in one transaction:
        two ranges, either side of ``keep``, so it costs one request however many keys."""
        kept = self._key(keep)
        end = _prefix_end(self.prefix.encode())
        ops = [
            wire.delete_range_op(self.prefix.encode(), kept),
            wire.delete_range_op(kept + b"\0", end),
        ]
        self._txn({"success": ops})

    def get_many(self, keys: list[str]) -> list[bytes | None]:
        """``[get(key) for key in keys]`` in one request per ``_TXN_OPS`` keys: a transaction
        of ranges (the liveness thread reads the next event and the judged node's key on
        every pass: one request, not two)."""
        found: list[bytes | None] = []
        for at in range(0, len(keys), _TXN_OPS):
            ops = [wire.range_op(self._key(k)) for k in keys[at : at + _TXN_OPS]]
            reply = self._txn({"success": ops})
            found += [None if (kv := reply.first(i)) is None else kv.value for i in range(len(ops))]
        return found

    def wait_get(
        self, keys: list[str], timeout: float, reads: list[str]
    ) -> tuple[bool, list[bytes | None]]:
        """``wait``, then ``get_many(reads)``. The wait's first read carries the reads: keys
        already there (a membership or a master written before this node asks) cost one
        request, not two; a watch carries no reads, so after one they are read again."""
        deadline = time.monotonic() + timeout
        wanted = sorted({self._key(k) for k in keys})
        ops = [wire.range_op(k, keys_only=True) for k in wanted]
        if not ops or len(ops) + len(reads) > _TXN_OPS:
            return self.wait(keys, timeout), self.get_many(reads)
        ops += [wire.range_op(self._key(k)) for k in reads]
        reply = self._txn({"success": ops})
        present = {k: reply.first(i) is not None for i, k in enumerate(wanted)}
        if all(present.values()):
            return True, [None if (kv := reply.first(len(wanted) + i)) is None else kv.value
                          for i in range(len(reads))]  # fmt: skip
        return self._follow(wanted, deadline, present), self.get_many(reads)

    def wait(self, keys: list[str], timeout: float) -> bool:
        """Read the keys; while some are missing, follow a ``/v3/watch`` stream: never polls.

        The watch is opened before the read it continues from (see ``etcd.watch``): a watch
        asked to start at an older revision is served by etcd's 100 ms catch-up loop.
        A watch broken by a lost member is resumed on another one. Raises ``StoreUnavailable``
        when no endpoint answers within ``request_timeout`` before ``timeout`` is up.
        """
        deadline = time.monotonic() + timeout
        wanted = sorted({self._key(k) for k in keys})
        if not wanted:
            return True
        return self._follow(wanted, deadline, self._read(wanted)[0])  # (there: no watch)

    def _follow(self, wanted: list[bytes], deadline: float, present: dict[bytes, bool]) -> bool:
        """``wait`` on from a first read that found ``present``."""
        pause = 0.05
        while not all(present.values()) and time.monotonic() < deadline:
            try:
                return watch_until_present(self._client, self.prefix, wanted, self._read, deadline)
            except StreamBroken as exc:
                log.info("etcd: watch interrupted (%s); reading again", exc)
                # A member that breaks every watch at once must not make this loop spin.
                time.sleep(max(0.0, min(pause, deadline - time.monotonic())))
                pause = min(pause * 2, 0.5)
                present = self._read(wanted)[0]
            except StoreUnavailable:
                if time.monotonic() < deadline:
                    raise
                return False
        return all(present.values())

    def close(self) -> None:
        """Stop renewing, revoke the lease (its ephemeral keys vanish), drop the receipt key.

        Bounded (a few seconds) even when etcd is gone; idempotent.
        """
        if self._closed:
            return
        self._closed = True
        try:
            # A revoke that etcd refused (a lease that lapsed while this node was frozen)
            # must not leave the receipt, which no lease removes; an etcd that does not
            # answer is not asked twice (close stays bounded).
            for cleanup in (self._revoke, self._drop_receipt):
                try:
                    cleanup()
                except EtcdRequestError as exc:
                    log.info("etcd: cleanup on close: %s", exc)
        except StoreUnavailable as exc:
            log.info("etcd: cleanup on close skipped (%s); the lease will expire", exc)
        finally:
            self._client.close()

    def _revoke(self) -> None:
        self._lease.close(_CLOSE_TIMEOUT)  # stops the renewals first, even if revoking fails

    def _drop_receipt(self) -> None:
        if self._receipt_written:
            receipt = {"key": wire.b64(self._receipt)}
            self._client.call("kv/deleterange", receipt, wire.acknowledged, timeout=_CLOSE_TIMEOUT)

    # -- internals ---------------------------------------------------------------------------

    def _where(self) -> str:
        return self.current_endpoint

    def _key(self, key: str) -> bytes:
        return f"{self.prefix}kv/{key}".encode()

    def _token(self) -> bytes:
        self._receipt_written = True  # (or about to be: close() cleans up either way)
        return self._receipt + f"#{next(self._tokens)}".encode()

    def _txn(self, request: wire.JSON) -> wire.TxnReply:
        return self._client.call("kv/txn", request, lambda reply: wire.txn_reply(request, reply))

    def _conditional(
        self, compare: list[wire.JSON], puts: list[tuple[bytes, bytes]], reads: list[bytes]
    ) -> tuple[bool, list[wire.KV | None]]:
        """Put each ``(key, value)`` if every ``compare`` holds; otherwise report what
        ``reads`` hold (``None`` each when the puts were done)."""
        with self._txn_lock:
            token = self._token()
            success = [*(wire.put_op(k, v) for k, v in puts), wire.put_op(self._receipt, token)]
            reply = self._txn(
                {
                    "compare": compare,
                    "success": success,
                    "failure": [*(wire.range_op(k) for k in reads), wire.range_op(self._receipt)],
                }
            )
        if reply.succeeded or _is_token(reply.first(len(reads)), token):
            return True, [None] * len(reads)  # (resent, it found its own receipt: the first won)
        return False, [reply.first(i) for i in range(len(reads))]

    def _read(self, wanted: list[bytes]) -> tuple[dict[bytes, bool], int]:
        """Which of the keys exist, and the revision the read saw them at."""
        reply = self._txn({"success": [wire.range_op(k, keys_only=True) for k in wanted]})
        return {k: reply.first(i) is not None for i, k in enumerate(wanted)}, reply.revision


def _prefix_end(prefix: bytes) -> bytes:
    """The end of the range of keys that start with ``prefix`` (it ends in ``/``, so adding
    one to its last byte never overflows)."""
    return prefix[:-1] + bytes([prefix[-1] + 1])


def _is_token(kv: wire.KV | None, token: bytes) -> bool:
    return kv is not None and kv.value == token


def _compare(key: bytes, found: wire.KV | None) -> wire.JSON:
    """The key is still as a read ``found`` it (absent: ``None``)."""
    return wire.compare_absent(key) if found is None else wire.compare_mod(key, found.mod_revision)


def _count(key: str, found: wire.KV | None) -> int:
    """A counter's value as a read ``found`` it (absent: 0)."""
    return 0 if found is None else _as_int(key, found.value)


def _as_int(key: str, value: bytes) -> int:
    try:
        return int(value)
    except ValueError:
        raise MalformedValue(key, f"add: {value[:80]!r} is not an integer") from None
