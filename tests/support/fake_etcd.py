"""A fake etcd on loopback that answers chosen endpoints with chosen junk.

``FakeEtcd(junk)`` serves etcd's gRPC-JSON gateway paths (``/v3/kv/range``, ``/v3/kv/txn``,
``/v3/lease/grant``, ...) from an ``http.server`` in a thread. A path named in ``junk``
gets that reply (``Junk``: a status and raw bytes, or a function of the request's JSON);
every other path gets a plausible etcd reply, enough for phalanx to reach the request under
test: ranges find nothing, writes succeed, leases are granted, a watch stays open with
nothing to say. It is the fault injection of ``test_etcd_junk``, not a model of etcd.
Threads only; every wait is bounded, and ``close`` ends them all.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

JSON = dict[str, Any]
HEADER = {"cluster_id": "1", "member_id": "2", "revision": "5", "raft_term": "2"}
_WATCH_LIMIT = 60.0  # an idle watch ends after this even if nobody closes it


@dataclass(frozen=True)
class Junk:
    body: bytes
    status: int = 200


Reply = Junk | Callable[[JSON], Junk]


def junk_json(value: object, status: int = 200) -> Junk:
    return Junk(json.dumps(value).encode(), status)


class FakeEtcd:
    def __init__(self, junk: dict[str, Reply] | None = None) -> None:
        self.junk = dict(junk or {})
        self.requests: list[str] = []  # paths asked, in order
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                path = self.path.removeprefix("/v3/")
                with fake._lock:
                    fake.requests.append(path)
                try:
                    request = json.loads(raw or b"{}")
                except ValueError:
                    request = {}
                reply = fake.junk.get(path)
                if reply is not None:
                    answer = reply(request) if callable(reply) else reply
                    self._send(answer.status, answer.body)
                elif path == "watch":
                    self._watch()
                else:
                    self._send(200, json.dumps(_plausible(path, request)).encode())

            def _send(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _watch(self) -> None:
                # HTTP/1.0 without a length: the body is the stream, until the socket closes.
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                created = {"result": {"header": HEADER, "created": True}}
                self.wfile.write(json.dumps(created).encode() + b"\n")
                deadline = time.monotonic() + _WATCH_LIMIT
                while not fake._stopping.wait(0.2) and time.monotonic() < deadline:
                    try:  # a blank line is skipped by the client; it finds a closed peer
                        self.wfile.write(b"\n")
                        self.wfile.flush()
                    except OSError:
                        return

            def log_message(self, format: str, *args: object) -> None:
                pass  # quiet: the tests assert on phalanx's output, not the server's

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.1,))
        self._thread.daemon = True
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def asked(self, path: str) -> int:
        with self._lock:
            return self.requests.count(path)

    def close(self) -> None:
        self._stopping.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)

    def __enter__(self) -> FakeEtcd:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _plausible(path: str, request: JSON) -> JSON:
    """What etcd would answer if every key were absent and every write succeeded."""
    if path == "kv/txn":
        compare = request.get("compare") or [{"target": "CREATE", "result": "EQUAL"}]
        # On an empty store only "the key is absent" (CREATE revision EQUAL 0) holds.
        ok = compare[0].get("target") == "CREATE" and compare[0].get("result") == "EQUAL"
        ops = request.get("success" if ok else "failure") or []
        responses = [
            {kind.replace("request_", "response_", 1): {"header": {"revision": "5"}}}
            for (kind,) in (op.keys() for op in ops)
        ]
        return {"header": HEADER, "succeeded": ok, "responses": responses}
    if path == "lease/grant":
        return {"header": HEADER, "ID": "7", "TTL": request.get("TTL", "10")}
    if path == "lease/keepalive":
        return {"result": {"header": HEADER, "ID": "7", "TTL": "10"}}
    return {"header": HEADER}
