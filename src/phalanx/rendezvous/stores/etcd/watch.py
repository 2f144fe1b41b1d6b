"""Waiting on etcd for keys to exist: a ``/v3/watch`` opened first, then a read, then events.

Why in that order. A watch asked to start at a revision the store has already passed (the
revision of a read made just before, when another node wrote in between: the normal case in a
forming round) is "unsynced" in etcd (``mvcc/watchable_store.go``): it hears of events only
from ``syncWatchersLoop``, which runs every 100 ms, so each such wait cost up to 0.1 s after the
key was written. A watch with no start revision is synced: etcd sends each event as it
commits. Reading after the watch's ``created`` reply keeps it exact: that read is
linearizable and comes after the watcher exists (on whichever member), so every change it did
not see reaches the stream. Events it did see are skipped: applied after the read, an old put
would bring back a key the read saw deleted.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from phalanx.rendezvous.stores.etcd import wire
from phalanx.rendezvous.stores.etcd.client import EtcdClient, EtcdRequestError
from phalanx.rendezvous.stores.etcd.stream import StreamBroken

# Which of the keys exist, and the revision the read saw them at.
Read = Callable[[list[bytes]], tuple[dict[bytes, bool], int]]


def watch_until_present(
    client: EtcdClient, prefix: str, wanted: list[bytes], read: Read, deadline: float
) -> bool:
    """Watch the range of the sorted keys ``wanted`` (under the run's ``prefix``), read them
    with ``read``, then follow the stream;
    ``True`` once all exist, ``False`` at ``deadline``.

    Raises ``StreamBroken`` when the stream ends early or etcd cancels the watch (the caller
    waits again), ``EtcdRequestError`` when etcd refuses it (permissions).
    """
    request = {"key": wire.b64(wanted[0]), "range_end": wire.b64(wanted[-1] + b"\0")}
    stream = client.stream("watch", {"create_request": request}, deadline)
    with contextlib.closing(stream):  # closes the HTTP stream on every way out
        seen: int | None = None  # the read's revision, once read
        present: dict[bytes, bool] = {}
        for result in stream:
            _check(client, prefix, result)
            if seen is None:
                if not result.created:
                    continue  # (etcd sends ``created`` before any event: nothing else counts)
                present, seen = read(wanted)
            for event in result.events:
                if event.key in present and event.revision > seen:
                    present[event.key] = not event.deleted
            if all(present.values()):
                return True
    return False


def _check(client: EtcdClient, prefix: str, result: wire.WatchResult) -> None:
    """Raise for a cancelled watch: refused (``EtcdRequestError``), else ``StreamBroken``."""
    if not result.canceled:
        return
    reason = result.cancel_reason or "history compacted"
    if "PermissionDenied" in reason:
        raise EtcdRequestError(f"etcd refused to watch {prefix}: {reason}")
    if "Unauthenticated" in reason:
        client.invalidate_token()
    raise StreamBroken(f"etcd cancelled the watch: {reason}")
