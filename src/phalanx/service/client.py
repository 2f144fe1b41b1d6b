"""Reaching a warm service: a launch connects to (or starts) the service of its key; ``phalanx
service status|stop`` asks every service of the user.

A launch computes its key (``phalanx.service.key``) and connects to ``KEY.sock``; if nothing
listens there it takes ``KEY.lock``, tries again, and otherwise binds the socket itself,
starts the service with it (``python -u -c SERVICE_SHIM``, in a session of its own, with
only the keyed environment) and connects at once: the connection waits in the socket's
backlog while the service imports torch, as the per-run template's would, so a first launch
is no slower. The lock makes two launches of a key on one node start one service between
them. The launch then says ``hello`` with its own settings (``phalanx.service.job``).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from phalanx.service import job, paths
from phalanx.service.key import service_env, service_key
from phalanx.worker.contract import isolated_main
from phalanx.worker.nofollow import append_to
from phalanx.worker.protocol import MAX_MESSAGE, ProtocolError, receive, send

SERVICE_SHIM = isolated_main("phalanx.service.entry")
CONNECT_TIMEOUT = 5.0  # a live service accepts at once; one importing keeps us in its backlog
ANSWER_TIMEOUT = 5.0
STALE_TIMEOUT = 1.0  # a launch does not wait long for an old service's answer
START_WAIT = 10.0
MAX_ADDRESS = 107  # bytes of a Unix socket's name (sun_path, less its terminating NUL)  # for the service's first process to fork and exit  # status and stop are answered between two requests


@dataclass
class Connection:
    """A launch's connection to its service, ``hello`` sent."""

    sock: socket.socket
    key: str
    path: Path
    started: bool  # this launch started the service


def _socket() -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        sock.setsockopt(socket.SOL_SOCKET, option, MAX_MESSAGE)
    return sock


@contextlib.contextmanager
def _address(path: Path) -> Iterator[str]:
    """``path`` as a socket address: a Unix socket's name is at most 107 bytes, so a longer
    one (a deep ``TMPDIR``) is named through its directory, opened for the call."""
    if len(os.fsencode(path)) <= MAX_ADDRESS:
        yield str(path)
        return
    directory = os.open(path.parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield f"/proc/self/fd/{directory}/{path.name}"
    finally:
        os.close(directory)


def _connect(path: Path) -> socket.socket | None:
    """A connection to the service listening at ``path``; None if none listens there."""
    sock = _socket()
    sock.settimeout(CONNECT_TIMEOUT)
    try:
        with _address(path) as address:
            sock.connect(address)
    except (FileNotFoundError, ConnectionRefusedError):
        sock.close()
        return None
    except BaseException:
        sock.close()
        raise
    sock.settimeout(None)
    _, uid = paths.peer(sock)
    if uid != os.getuid():  # the directory is ours and 0700: only a bug or root gets here
        sock.close()
        raise ProtocolError(f"the service at {path} runs as uid {uid}, not {os.getuid()}")
    return sock


def _start(
    path: Path, env: Mapping[str, str], preload: tuple[str, ...], idle: float, lineage: str
) -> None:
    """Bind ``path`` and start a service with it (the caller holds the key's lock)."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()  # a dead service's: nothing listens (we just failed to connect)
    listener = _socket()
    log = append_to(path.with_suffix(".log"))
    try:
        with _address(path) as address:
            listener.bind(address)
        listener.listen(64)
        first = subprocess.Popen(
            # -c, not -m: the working directory stays off sys.path (isolated_main). The
            # service forks once at start: its launcher reaps the first process at once and
            # never keeps a child that outlives it.
            [sys.executable, "-u", "-c", SERVICE_SHIM, str(listener.fileno()), str(path),
             str(idle), lineage, ",".join(preload)],
            env=service_env(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log,
            pass_fds=(listener.fileno(),),
            start_new_session=True,  # no controlling terminal: no job's terminal reaches it
        )  # fmt: skip
    finally:
        listener.close()
        os.close(log)
    # Bounded: on a loaded machine the first process may take a while to fork; the service
    # comes up all the same (the launch is in its backlog), and an exit status nobody
    # collected is only a zombie until this launcher ends.
    with contextlib.suppress(subprocess.TimeoutExpired):
        first.wait(timeout=START_WAIT)


def connect(env: Mapping[str, str], preload: tuple[str, ...], idle: float, cwd: str) -> Connection:
    """Connect to the service for ``env`` (the template's environment) and ``preload``,
    starting it if needed, and say hello. Raises ``OSError``, ``ProtocolError`` or
    ``paths.UnsafeDirectory``; the caller falls back to a per-run template."""
    directory = paths.service_dir(env)
    key, lineage = service_key(env, preload, cwd)
    path = paths.socket_path(directory, key)
    started = False
    sock = _connect(path)
    if sock is None:
        with paths.locked(path.with_suffix(".lock")):
            sock = _connect(path)
            if sock is None:
                _start(path, env, preload, idle, lineage)
                started = True
                sock = _connect(path)
        if started:
            _stop_stale(directory, key, lineage)
    if sock is None:
        raise ProtocolError(f"the service at {path} did not start (see {path.with_suffix('.log')})")
    try:
        send(sock, {"hello": job.collect().to_json(), "idle": idle})
    except BaseException:
        sock.close()
        raise
    return Connection(sock, key, path, started)


def ask(
    path: Path, message: dict[str, Any], timeout: float = ANSWER_TIMEOUT
) -> dict[str, Any] | None:
    """Send ``message`` (status or stop) to the service at ``path``; its answer, or None
    when no service listens there (a stale socket is removed) or none came in ``timeout``
    seconds (one still importing answers once it has)."""
    try:
        sock = _connect(path)
    except (OSError, ProtocolError):
        return None
    if sock is None:
        _remove_stale(path)
        return None
    with sock:
        sock.settimeout(timeout)
        try:
            send(sock, message)
            received = receive(sock, max_fds=0)
        except (OSError, ProtocolError):
            return None
    return received[0] if received is not None else None


def _stop_stale(directory: Path, key: str, lineage: str) -> None:
    """Tell the services of ``lineage`` under another key than ``key`` to stop: what they
    imported changed since (each ends once its jobs have)."""
    for path in paths.sockets(directory):
        if path != paths.socket_path(directory, key):
            answer = ask(path, {"status": 1}, STALE_TIMEOUT)
            if answer is not None and answer.get("lineage") == lineage:
                ask(path, {"stop": 1}, STALE_TIMEOUT)


def _remove_stale(path: Path) -> None:
    """Remove ``path`` if still no service listens there (under the key's lock)."""
    with paths.locked(path.with_suffix(".lock")), contextlib.suppress(OSError, ProtocolError):
        again = _connect(path)
        if again is None:
            path.unlink()
        else:
            again.close()


def ask_all(environ: Mapping[str, str], message: dict[str, Any]) -> list[dict[str, Any]]:
    """Every live service's answer to ``message``, in key order."""
    answers = []
    for path in paths.sockets(paths.service_dir(environ)):
        answer = ask(path, message)
        if answer is not None:
            answers.append(answer)
    return answers
