"""The etcd lease behind ``EtcdStore.set_ephemeral``: granted on first use, renewed by a
daemon thread, revoked on close.

Keys bound to the lease die with it: ``lease_ttl`` seconds after this process stops renewing
(it died, hung, or lost etcd), or at once when ``close`` revokes it. That is how peers learn a
node is gone.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from phalanx.rendezvous.fencing import lease_seconds
from phalanx.rendezvous.stores.base import StoreUnavailable
from phalanx.rendezvous.stores.etcd import wire
from phalanx.rendezvous.stores.etcd.client import EtcdClient, EtcdRequestError

log = logging.getLogger(__name__)

LEASE_NOT_FOUND = 5  # gRPC NOT_FOUND: etcd's "requested lease not found"


class LeaseExpired(StoreUnavailable):
    """This store's lease expired: its ephemeral keys are gone and peers consider it dead."""


class EtcdLease:
    """One lease per store handle. Thread-safe; constructing it does no I/O."""

    def __init__(self, client: EtcdClient, ttl: float) -> None:
        self._client = client
        self._ttl = lease_seconds(ttl)
        self._proved: Callable[[float], None] = lambda start: None
        self._every = float("inf")
        self._lock = threading.Lock()
        self._id: int | None = None
        self._lost = False
        self._stop = threading.Event()
        self._keeper: threading.Thread | None = None

    @property
    def ttl(self) -> int:
        """The TTL asked of etcd, in seconds."""
        return self._ttl

    def on_renewed(self, proved: Callable[[float], None], every: float) -> None:
        """Call ``proved(start)`` after each grant and renewal that etcd took, ``start`` the
        monotonic time the request was sent (the lease lives ``ttl`` past it at least), and
        renew at least every ``every`` seconds. Call before the lease is granted."""
        self._proved = proved
        self._every = every

    def id(self) -> int:
        """The lease id, granting the lease (and starting its renewal) on first use.

        Raises ``LeaseExpired`` once the lease has lapsed.
        """
        with self._lock:
            if self._lost:
                raise LeaseExpired("the etcd lease of this node expired")
            if self._id is None:
                sent = time.monotonic()
                self._id, ttl = self._client.call(
                    "lease/grant", {"TTL": str(self._ttl)}, wire.lease_grant
                )
                self._proved(sent)
                # etcd raises a TTL below its minimum (1.5 election timeouts): renew by its
                # figure, or more often where fencing needs proofs sooner.
                interval = min(ttl / 3, self._every)
                self._keeper = threading.Thread(
                    target=self._keep_alive,
                    args=(self._id, interval),
                    name="phalanx-etcd-lease",
                    daemon=True,
                )
                self._keeper.start()
            return self._id

    def lapsed(self, exc: EtcdRequestError) -> LeaseExpired:
        """Record that etcd no longer knows the lease (a put with it failed); the error to raise."""
        self._lost = True
        return LeaseExpired(f"the etcd lease of this node expired: {exc}")

    def close(self, timeout: float) -> None:
        """Stop renewing and revoke the lease, within about ``timeout`` seconds.

        Raises ``StoreUnavailable``/``EtcdRequestError`` when the revoke fails (the lease then
        expires on its own).
        """
        deadline = time.monotonic() + timeout
        self._stop.set()
        if self._keeper is not None:
            self._keeper.join(timeout=timeout)
        if self._id is not None and not self._lost:
            left = max(0.1, deadline - time.monotonic())
            self._client.call(
                "lease/revoke", {"ID": str(self._id)}, wire.acknowledged, timeout=left
            )

    def _keep_alive(self, lease_id: int, interval: float) -> None:
        """Renew every ``interval`` (a third of the TTL). A renewal may take until the lease
        would expire: one slow answer from a loaded etcd must not cost the lease, since
        peers would count this node as lost. Repeated failures are logged once."""
        expires = time.monotonic() + 3 * interval
        failing = False
        while not self._stop.wait(interval):
            sent = time.monotonic()
            try:
                ttl = self._client.call(
                    "lease/keepalive",
                    {"ID": str(lease_id)},
                    wire.keepalive_ttl,
                    timeout=max(interval, expires - time.monotonic()),
                )
            except (StoreUnavailable, EtcdRequestError) as exc:
                # (a junk reply too, MalformedReply: the thread must outlive it, and renew
                # again in case the junk came from one member or a passing proxy)
                if not failing:
                    log.warning("etcd: could not renew the lease (%s); retrying", exc)
                failing = True
                continue
            if ttl <= 0:
                log.error("etcd: the lease of this node expired; peers will consider it gone")
                self._lost = True
                return
            self._proved(sent)
            if failing:
                log.info("etcd: lease renewed again")
            failing = False
            expires = time.monotonic() + ttl
