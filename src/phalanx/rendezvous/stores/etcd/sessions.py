"""The HTTP side of the etcd client: one ``requests.Session`` per thread, and a short reason
for a request that failed."""

from __future__ import annotations

import re
import threading

import requests

from phalanx.rendezvous.stores.etcd.conf import EtcdOptions


class Sessions:
    """One ``requests.Session`` per thread (the caller's, the lease keep-alive thread's):
    ``requests.Session`` is not documented as thread-safe. A session of a thread that ended is
    closed at the next request from any thread, so short-lived threads do not pile up sessions
    and their pooled connections; ``close`` closes the rest."""

    def __init__(self, options: EtcdOptions) -> None:
        self._options = options
        self._lock = threading.Lock()
        self._sessions: dict[threading.Thread, requests.Session] = {}

    def get(self) -> requests.Session:
        """The calling thread's session (made on first use)."""
        me = threading.current_thread()
        with self._lock:
            ended = [t for t in self._sessions if t is not me and not t.is_alive()]
            stale = [self._sessions.pop(t) for t in ended]
            session = self._sessions.get(me)
        for old in stale:
            old.close()  # its thread is gone: nobody else uses it
        if session is None:
            session = requests.Session()
            # etcd is cluster-internal: no HTTP(S)_PROXY (a proxy would also buffer the watch
            # stream), no netrc, and no REQUESTS_CA_BUNDLE overriding the ``cacert`` given.
            session.trust_env = False
            if self._options.cacert:
                session.verify = self._options.cacert
            if self._options.cert and self._options.key:
                session.cert = (self._options.cert, self._options.key)
            with self._lock:
                self._sessions[me] = session
        return session

    def close(self) -> None:
        with self._lock:
            sessions, self._sessions = list(self._sessions.values()), {}
        for session in sessions:
            session.close()

    def count(self) -> int:
        with self._lock:
            return len(self._sessions)


def describe(exc: BaseException) -> str:
    """A short reason for a failed request ("Connection refused", "timed out", an SSL error)."""
    text = str(exc)
    patterns = (
        r"\[SSL[^\]]*\][^'\")]*",
        r"\[Errno -?\d+\] ([^'\")]+)",
        r"Remote end closed[^'\")]*",
    )
    for pattern in patterns:
        match = re.search(pattern, text)
        if match:
            return (match.group(1) if match.groups() else match.group(0)).strip()
    if isinstance(exc, requests.Timeout) or "timed out" in text:
        return "timed out"
    return text[:200]
