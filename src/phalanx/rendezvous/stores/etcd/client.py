"""A small etcd v3 client over etcd's gRPC-JSON gateway (``POST /v3/...``), with failover.

etcd serves every v3 RPC as JSON at ``/v3/<service>/<method>`` (3.4 also at ``/v3beta/``;
3.5 and 3.6 only at ``/v3/``): keys and values are base64 strings and int64 fields are
decimal strings. Unary calls answer one JSON object; streaming calls (``watch``,
``lease/keepalive``) answer newline-delimited ``{"result": ...}`` objects. Errors come as
``{"code": <gRPC code>, "message": ...}``.

The client tries the endpoint that answered last, then the others in order, until one answers
or ``EtcdOptions.request_timeout`` runs out (then ``StoreUnavailable`` names every endpoint and
why it failed). Every request is retried as a whole, so callers only send requests that are
safe to repeat (``EtcdStore`` makes its transactions so). HTTP sessions are ``sessions``';
streaming replies are read by ``stream``.

Every reply is decoded by a checker of ``wire`` that the caller names; a reply that is not
what etcd sends (not an object, a missing or mistyped field, bad base64, a stream line that
is not JSON) raises ``MalformedReply`` naming the endpoint and the request, at once: asking
again would only get the same junk.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import TypeVar

import requests

from phalanx.errors import RendezvousError
from phalanx.rendezvous.stores.base import MalformedReply, StoreUnavailable
from phalanx.rendezvous.stores.etcd.conf import EtcdOptions
from phalanx.rendezvous.stores.etcd.sessions import Sessions, describe
from phalanx.rendezvous.stores.etcd.stream import read_stream
from phalanx.rendezvous.stores.etcd.wire import JSON, BadReply, WatchResult, auth_token

log = logging.getLogger(__name__)

_CONNECT_TIMEOUT = 2.0  # per attempt: a live member accepts at once; a dead host never does
_READ_TIMEOUT = 5.0  # per attempt: long enough for an fsync on a loaded disk
# gRPC codes meaning "this member cannot serve now; another may": CANCELLED, UNKNOWN (3.4
# reports some raft errors so), DEADLINE_EXCEEDED, UNAVAILABLE ("no leader", "request timed out").
_TRY_NEXT_CODES = frozenset({1, 2, 4, 14})
_UNAUTHENTICATED = 16

T = TypeVar("T")


class EtcdRequestError(RendezvousError):
    """etcd answered, with an error that retrying elsewhere will not fix (auth, permission)."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


class EtcdClient:
    """Sends gateway requests to the first endpoint that answers. Thread-safe; no I/O until used."""

    def __init__(self, endpoints: Sequence[str], options: EtcdOptions) -> None:
        if not endpoints:
            raise ValueError("EtcdClient needs at least one endpoint")
        self.endpoints = tuple(e.rstrip("/") for e in endpoints)
        self.options = options
        self._current = 0  # index of the endpoint that answered last
        self._token: str | None = None
        self._sessions = Sessions(options)
        self._answered_once = False  # some endpoint has answered this client

    @property
    def current_endpoint(self) -> str:
        """The endpoint that answered last (where the next request goes first)."""
        return self.endpoints[self._current]

    def call(
        self,
        path: str,
        body: JSON,
        decode: Callable[[JSON], T],
        *,
        timeout: float | None = None,
    ) -> T:
        """POST ``body`` to ``/v3/<path>``; return ``decode(reply)``, failing over between
        endpoints.

        Raises ``StoreUnavailable`` when no endpoint answers within ``timeout`` (default
        ``request_timeout``), ``MalformedReply`` when one answers junk (``decode`` raised
        ``BadReply``) and ``EtcdRequestError`` when etcd refuses the request.
        """
        deadline = time.monotonic() + (self.options.request_timeout if timeout is None else timeout)
        failures: dict[str, str] = {}
        refused: set[str] = set()
        for endpoint in self._attempts(path, deadline, failures):
            try:
                reply = self._post(endpoint, path, body, deadline, failures, stream=False)
                with reply:
                    data = self._check(reply, endpoint, path, failures)
            except _TryNext as exc:
                if exc.refused:
                    refused.add(endpoint)
                else:
                    refused.discard(endpoint)
                if self._answered_once and len(refused) == len(self.endpoints):
                    # Every endpoint refused the connection: no etcd process listens on any
                    # of them (a member that is up but cannot serve answers with an error
                    # instead). Retrying until request_timeout only delays the verdict, and
                    # calls made one after another on a lost store added up (issue 26). Before
                    # the first answer (agents started before etcd) it is waited for.
                    raise self._unavailable(path, failures, None) from None
                continue
            try:
                decoded = decode(data)
            except BadReply as exc:
                raise MalformedReply(f"etcd at {endpoint}", path, str(exc)) from None
            self._answered(endpoint)
            return decoded
        raise AssertionError("unreachable: _attempts ends by raising")  # pragma: no cover

    def stream(self, path: str, body: JSON, deadline: float) -> Generator[WatchResult, None, None]:
        """POST to a streaming method and yield its checked results until ``deadline``.

        Opening fails over like ``call``. Returns quietly at ``deadline``; raises
        ``StreamBroken`` when the connection drops earlier (the caller re-syncs and reopens)
        and ``MalformedReply`` for a line that is not etcd's.
        """
        open_deadline = min(deadline, time.monotonic() + self.options.request_timeout)
        failures: dict[str, str] = {}
        for endpoint in self._attempts(path, open_deadline, failures):
            try:
                reply = self._post(endpoint, path, body, deadline, failures, stream=True)
                if reply.status_code != 200:
                    with reply:
                        self._check(reply, endpoint, path, failures)
            except _TryNext:
                continue
            self._answered(endpoint)
            with reply:
                yield from read_stream(reply, endpoint, path, deadline)
            return

    def invalidate_token(self) -> None:
        self._token = None

    def close(self) -> None:
        self._sessions.close()

    def open_sessions(self) -> int:
        """How many HTTP sessions (one per thread that used the client recently) are open."""
        return self._sessions.count()

    # -- internals ---------------------------------------------------------------------------

    def _attempts(self, path: str, deadline: float, failures: dict[str, str]) -> Iterator[str]:
        """Endpoints to try, the last healthy one first, round after round until ``deadline``.

        The attempts record why each endpoint failed in ``failures``, for the final error.
        """
        budget = deadline - time.monotonic()
        pause = 0.05
        while True:
            start = self._current
            for i in range(len(self.endpoints)):
                if time.monotonic() >= deadline:
                    raise self._unavailable(path, failures, budget)
                yield self.endpoints[(start + i) % len(self.endpoints)]
            # Every endpoint refused: back off a little before the next round so a cluster
            # electing a leader is not hammered; the pause never outlasts the deadline.
            time.sleep(max(0.0, min(pause, deadline - time.monotonic())))
            pause = min(pause * 2, 0.5)

    def _unavailable(
        self, path: str, failures: dict[str, str], budget: float | None
    ) -> StoreUnavailable:
        """``budget`` None: every endpoint refused the connection (not waited on)."""
        why = "; ".join(f"{ep}: {err}" for ep, err in failures.items()) or "no time left"
        when = "(every one refused the connection)" if budget is None else f"within {budget:.3g} s"
        return StoreUnavailable(
            f"no etcd endpoint answered {path} {when} "
            f"(endpoints: {', '.join(self.endpoints)}): {why}. "
            "Check --rdzv-endpoint, that etcd is running, and the TLS keys of --rdzv-conf."
        )

    def _answered(self, endpoint: str) -> None:
        self._answered_once = True
        index = self.endpoints.index(endpoint)
        if index != self._current:
            log.info("etcd: now using %s", endpoint)
            self._current = index

    def _post(
        self,
        endpoint: str,
        path: str,
        body: JSON,
        deadline: float,
        failures: dict[str, str],
        *,
        stream: bool,
    ) -> requests.Response:
        """One attempt on one endpoint; raises ``_TryNext`` when this endpoint cannot answer."""
        # "hasleader" (gRPC metadata through the gateway) makes a member that lost its
        # leader refuse requests and end watches at once, instead of serving stale silence.
        headers = {"Grpc-Metadata-hasleader": "true"}
        token = self._auth_token(endpoint, deadline, failures) if self.options.user else ""
        if token:
            headers["Authorization"] = token
        remaining = max(0.001, deadline - time.monotonic())
        read = remaining if stream else min(remaining, _READ_TIMEOUT)
        try:
            return self._sessions.get().post(
                f"{endpoint}/v3/{path}",
                json=body,
                headers=headers,
                timeout=(min(remaining, _CONNECT_TIMEOUT), read),
                stream=stream,
            )
        except requests.RequestException as exc:
            failures[endpoint] = describe(exc)
            raise _TryNext(refused=_is_refused(exc)) from exc

    def _check(
        self, reply: requests.Response, endpoint: str, path: str, failures: dict[str, str]
    ) -> JSON:
        """The reply's JSON object; ``_TryNext`` for errors another endpoint (or a new token)
        may fix. A reply that is not JSON (another server on that port, a proxy's error page)
        counts as no answer from that endpoint."""
        try:
            data = reply.json()
        except ValueError:
            failures[endpoint] = f"HTTP {reply.status_code}, not etcd's JSON gateway"
            raise _TryNext from None
        if not isinstance(data, dict):
            failures[endpoint] = f"HTTP {reply.status_code}, not etcd's JSON gateway"
            raise _TryNext
        # Unary errors read {"code", "message"}; streaming ones {"error": {"grpc_code", ...}}.
        error = data.get("error")
        if reply.status_code == 200 and not isinstance(error, dict):
            return data
        detail = error if isinstance(error, dict) else data
        code = detail.get("code") or detail.get("grpc_code") or -1
        if not isinstance(code, int) or isinstance(code, bool):
            why = f"HTTP {reply.status_code} with error code {str(code)[:60]!r}, not a gRPC code"
            raise MalformedReply(f"etcd at {endpoint}", path, why)
        message = str(detail.get("message", detail))[:300]  # a hostile reply may be huge
        if code == _UNAUTHENTICATED and self.options.user is not None:
            self.invalidate_token()  # expired (simple tokens live --auth-token-ttl): log in again
            failures[endpoint] = message
            raise _TryNext
        if code in _TRY_NEXT_CODES:
            failures[endpoint] = message
            raise _TryNext
        raise EtcdRequestError(f"etcd at {endpoint} refused the request: {message}", code)

    def _auth_token(self, endpoint: str, deadline: float, failures: dict[str, str]) -> str:
        token = self._token
        if token is not None:
            return token
        body = {"name": self.options.user, "password": self.options.password or ""}
        remaining = max(0.001, deadline - time.monotonic())
        try:
            reply = self._sessions.get().post(
                f"{endpoint}/v3/auth/authenticate",
                json=body,
                timeout=(min(remaining, _CONNECT_TIMEOUT), min(remaining, _READ_TIMEOUT)),
            )
        except requests.RequestException as exc:
            failures[endpoint] = describe(exc)
            raise _TryNext from exc
        with reply:
            try:
                data = self._check(reply, endpoint, "auth/authenticate", failures)
            except EtcdRequestError as exc:
                if "authentication is not enabled" in str(exc):
                    self._token = ""  # as etcd's Go client does: go on without a token
                    return ""
                raise EtcdRequestError(
                    f"etcd at {endpoint} did not accept user {self.options.user!r}: {exc}; "
                    "check --rdzv-conf user and the password (password_file, "
                    "PHALANX_ETCD_PASSWORD or password)",
                    exc.code,
                ) from None
        try:
            token = auth_token(data)
        except BadReply as exc:
            raise MalformedReply(f"etcd at {endpoint}", "auth/authenticate", str(exc)) from None
        self._token = token
        return token


class _TryNext(Exception):
    """This endpoint cannot answer now; the reason is in the attempt's ``failures``.
    ``refused``: its host refused the connection (nothing listens on the port)."""

    def __init__(self, *, refused: bool = False) -> None:
        super().__init__()
        self.refused = refused


def _is_refused(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    for _ in range(8):  # requests -> urllib3 -> the socket's error, a few levels down
        if seen is None:
            return False
        if isinstance(seen, ConnectionRefusedError):
            return True
        seen = seen.__cause__ or seen.__context__ or _reason(seen)
    return False


def _reason(exc: BaseException) -> BaseException | None:
    reason = getattr(exc, "reason", None)
    if isinstance(reason, BaseException):
        return reason
    args = getattr(exc, "args", ())
    return next((a for a in args if isinstance(a, BaseException)), None)
