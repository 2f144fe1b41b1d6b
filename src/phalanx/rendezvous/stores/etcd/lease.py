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
        self._ttl = max(1, round(ttl))
        self._lock = threading.Lock()
        self._id: int | None = None
        self._lost = False
        self._stop = threading.Event()
        self._keeper: threading.Thread | None = None

    def id(self) -> int:
        """The lease id, granting the lease (and starting its renewal) on first use.

        Raises ``LeaseExpired`` once the lease has lapsed.
        """
        with self._lock:
            if self._lost:
                raise LeaseExpired("the etcd lease of this node expired")
            if self._id is None:
                self._id, ttl = self._client.call(
                    "lease/grant", {"TTL": str(self._ttl)}, wire.lease_grant
                )
                # etcd raises a TTL below its minimum (1.5 election timeouts): renew by its figure.
                interval = ttl / 3
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
            if failing:
                log.info("etcd: lease renewed again")
            failing = False
            expires = time.monotonic() + ttl
