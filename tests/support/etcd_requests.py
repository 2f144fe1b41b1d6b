"""The requests an ``EtcdStore``'s client sends, counted by wrapping its one way out
(``EtcdClient.call``): what the batched-read and re-form tests assert on (a request count is
what a change to the store's round trips must move; a time would not be)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from phalanx.rendezvous.stores.etcd.store import EtcdStore


class Requests:
    """Every request path ``store`` sends from now on, in order (``paths``) and per thread
    name (``by_thread``: a handler's join, its heartbeat and its sweep run in threads of
    their own)."""

    def __init__(self, store: EtcdStore) -> None:
        self.paths: list[str] = []
        self.by_thread: dict[str, list[str]] = {}
        client = store._client
        real = client.call

        def call(path: str, body: Any, decode: Callable[[Any], Any], **kw: Any) -> Any:
            self.paths.append(path)
            self.by_thread.setdefault(threading.current_thread().name, []).append(path)
            return real(path, body, decode, **kw)

        client.call = call  # type: ignore[method-assign]
