"""The warm service's loop: a template that outlives its launch (``--keep-warm``).

Started by the first launch of a key (``phalanx.service.client``, ``phalanx.service.entry``)
with the listening socket already bound, it imports torch and the preload modules as the
per-run template does (``phalanx.worker.template.preload``), then serves any number of agents of its user at once,
each on its own connection (a session): the agent says ``hello`` with its process settings
(``phalanx.service.job``), gets ``ready``, and then sends fork requests exactly as to the
template (``phalanx.worker.protocol``; a round's workers in one, ``phalanx.worker.batch``). ``status`` and ``stop`` are answered too.

- A peer of another uid is refused (``SO_PEERCRED``), besides the socket's 0700 directory.
- Each session holds a pidfd of its agent. When the agent dies (even by SIGKILL) or closes
  the connection, the session's workers are SIGKILLed and reaped: nothing of a job outlives
  its agent. Each worker also dies with the service (``PR_SET_PDEATHSIG``).
- A forked worker closes every descriptor of the service, then gets its request's
  environment and working directory, and its agent's settings (umask, limits, cgroups,
  priority, affinity, ignored and blocked signals) before any of the job runs.
- It runs in its own session (no controlling terminal), with ``/`` as its working directory,
  in the cgroup its first agent had before the run's own (``cgroups.leave_run_cgroup``).
- It ends ``IDLE`` seconds after its last session ended, on ``stop`` or on SIGTERM (once its
  sessions have ended), removing its socket first so that the next launch starts a new one.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import socket
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from phalanx.service import job, paths
from phalanx.worker import become
from phalanx.worker.batch import fork_batch
from phalanx.worker.protocol import (
    BATCH,
    MAX_MESSAGE,
    ForkRequest,
    ProtocolError,
    receive,
    send,
)

Reply = tuple[dict[str, Any], tuple[int, ...]]


@dataclass
class Session:
    """One agent's connection."""

    sock: socket.socket
    agent: int = 0  # its pid (SO_PEERCRED), once it said hello
    agent_fd: int = -1  # a pidfd of it
    settings: job.JobSettings | None = None
    children: dict[int, int] = field(default_factory=dict)  # pid -> pidfd


class Service:
    """The request loop; ``serve`` returns None when the service ends, a request in a child."""

    def __init__(
        self,
        listener: socket.socket,
        path: Path,
        idle: float,
        ready: dict[str, object],
        preload: tuple[str, ...],
    ) -> None:
        self._preload = preload
        self._listener: socket.socket | None = listener
        self._path = path  # bound as a shorter name when long (``client._address``)
        self._inode = os.stat(self._path).st_ino
        self._idle = idle
        self._ready = ready
        self._started = time.time()
        self._last = time.monotonic()
        self._stopping = False
        self._sessions: dict[socket.socket, Session] = {}
        self._selector = selectors.DefaultSelector()
        self._selector.register(listener, selectors.EVENT_READ, ("listen", None))
        self._wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._wake_w = wake_w
        self._selector.register(self._wake_r, selectors.EVENT_READ, ("signal", None))
        self._signals: dict[int, Any] = {
            sig: signal.getsignal(sig)
            for sig in signal.valid_signals()
            if sig not in (signal.SIGKILL, signal.SIGSTOP) and signal.getsignal(sig) is not None
        }
        self._mask: set[int] = set(signal.pthread_sigmask(signal.SIG_BLOCK, []))

    @property
    def wakeup_fd(self) -> int:
        return self._wake_w

    def serve(self) -> ForkRequest | None:
        while True:
            events = self._selector.select(self._timeout())
            if not events and self._try_exit():
                return None
            for key, _ in events:
                kind, what = key.data
                if kind == "listen":
                    self._accept()
                elif kind == "signal":
                    with contextlib.suppress(OSError):
                        os.read(self._wake_r, 512)
                    self._stop()
                elif kind == "conn":
                    request = self._message(what)
                    if request is not None:
                        return request
                elif kind == "agent":
                    self._end(what)  # the agent died
                else:
                    self._reap(*what)
            if self._stopping and not self._sessions:
                return None

    def _timeout(self) -> float | None:
        if self._sessions or self._stopping:
            return None
        return max(0.0, self._last + self._idle - time.monotonic())

    def _accept(self) -> None:
        assert self._listener is not None
        try:
            sock, _ = self._listener.accept()
        except BlockingIOError:
            return
        _, uid = paths.peer(sock)
        if uid != os.getuid():  # the directory's mode already keeps others out
            sock.close()
            return
        for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            sock.setsockopt(socket.SOL_SOCKET, option, MAX_MESSAGE)
        self._sessions[sock] = Session(sock)
        self._selector.register(sock, selectors.EVENT_READ, ("conn", sock))

    def _message(self, sock: socket.socket) -> ForkRequest | None:
        session = self._sessions.get(sock)
        if session is None:
            return None  # ended earlier in this round of events
        try:
            received = receive(sock, max_fds=2 * BATCH)
        except (ProtocolError, OSError) as exc:
            with contextlib.suppress(OSError):
                send(sock, {"error": f"{type(exc).__name__}: {exc}"})
            return None
        if received is None:
            self._end(session)
            return None
        message, fds = received
        if "forks" in message and session.settings is not None:
            return self._fork(session, message, fds)
        for fd in fds:
            os.close(fd)
        reply = self._answer(session, message)
        with contextlib.suppress(OSError):
            send(sock, reply)
        if "ready" not in reply:
            self._end(session)  # a status, a stop or a refusal ends the connection
        return None

    def _answer(self, session: Session, message: dict[str, Any]) -> dict[str, Any]:
        if "status" in message:
            return self._status()
        if "stop" in message:
            self._stop()
            return {"stopping": os.getpid(), "jobs": self._jobs()}
        if "hello" not in message or session.settings is not None:
            return {"failed": f"unexpected message {sorted(message)}"}
        try:
            settings = job.JobSettings.from_json(message["hello"])
            pid, _ = paths.peer(session.sock)
            why = job.refusal(settings)
            if why is not None:
                return {"failed": f"refused this job: {why}"}
            session.agent_fd = os.pidfd_open(pid)
        except (KeyError, TypeError, ValueError, OSError) as exc:
            return {"failed": f"refused this job: {type(exc).__name__}: {exc}"}
        session.agent, session.settings = pid, settings
        self._selector.register(session.agent_fd, selectors.EVENT_READ, ("agent", session))
        self._idle = float(message.get("idle", self._idle))  # the latest launch's choice
        return {**self._ready, "ready": os.getpid()}

    def _jobs(self) -> int:
        return sum(1 for s in self._sessions.values() if s.settings is not None)

    def _status(self) -> dict[str, Any]:
        idle_for = 0.0 if self._jobs() else time.monotonic() - self._last
        return {
            "pid": os.getpid(), "key": self._path.name.removesuffix(paths.SOCKET),
            "python": sys.executable, "preload": list(self._preload),
            "started": self._started, "idle": self._idle, "idle_for": round(idle_for, 1),
            "jobs": self._jobs(), "stopping": self._stopping, "lineage": self._ready["lineage"],
            "workers": sum(len(s.children) for s in self._sessions.values()),
            "agents": [s.agent for s in self._sessions.values() if s.agent],
        }  # fmt: skip

    def _fork(
        self, session: Session, message: dict[str, Any], fds: list[int]
    ) -> ForkRequest | None:
        """Fork the request's workers for ``session`` (``batch``): a child's request in that
        child; None in the service, once the answer is sent."""
        forked = fork_batch(message, fds, self._mask)
        if forked.child is not None:
            request, stdio = forked.child
            self._become(session, request, stdio)
            return request
        for pid, pidfd in forked.children:
            session.children[pid] = pidfd
            self._selector.register(pidfd, selectors.EVENT_READ, ("child", (session, pid)))
        with contextlib.suppress(OSError):  # an agent gone meanwhile: its end is read next
            send(session.sock, *forked.answer())
        return None

    def _become(self, session: Session, request: ForkRequest, stdio: tuple[int, int]) -> None:
        assert session.settings is not None
        try:
            service = os.getppid()
            self._close_all()  # no job may hold the service's sockets or another's pidfds
            become.become(request, stdio, service, self._signals, self._mask)
            job.apply(session.settings)
        except BaseException:
            traceback.print_exc()
            os._exit(1)

    def _close_all(self) -> None:
        self._selector.close()
        for fd in (self._wake_r, self._wake_w):
            os.close(fd)
        if self._listener is not None:
            self._listener.close()
        for session in self._sessions.values():
            session.sock.close()
            for fd in (session.agent_fd, *session.children.values()):
                if fd >= 0:
                    os.close(fd)

    def _reap(self, session: Session, pid: int) -> None:
        if pid not in session.children:
            return  # reaped when its session ended, earlier in this round of events
        pidfd = session.children.pop(pid)
        self._selector.unregister(pidfd)
        os.close(pidfd)
        _, status = os.waitpid(pid, 0)
        with contextlib.suppress(OSError):
            send(session.sock, {"exit": pid, "status": status})

    def _end(self, session: Session) -> None:
        """The agent is done or dead: nothing it started may outlive it."""
        for pid, pidfd in session.children.items():
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
            self._selector.unregister(pidfd)
            os.close(pidfd)
        session.children.clear()
        if session.agent_fd >= 0:
            self._selector.unregister(session.agent_fd)
            os.close(session.agent_fd)
            session.agent_fd = -1
        if self._sessions.pop(session.sock, None) is not None:
            self._selector.unregister(session.sock)
        session.sock.close()
        self._last = time.monotonic()

    def _unlink(self) -> None:
        """Remove the socket if it is still ours (under the key's lock: see client.connect)."""
        with contextlib.suppress(OSError):
            if os.stat(self._path).st_ino == self._inode:
                os.unlink(self._path)

    def _stop(self) -> None:
        if self._listener is not None:
            with paths.locked(self._path.with_suffix(".lock")):
                self._unlink()
            self._selector.unregister(self._listener)
            self._listener.close()
            self._listener = None
        self._stopping = True

    def _try_exit(self) -> bool:
        """Idle long enough: leave, unless a launch connected meanwhile."""
        if self._sessions or self._listener is None:
            return self._listener is None and not self._sessions
        with paths.locked(self._path.with_suffix(".lock")):
            self._listener.setblocking(False)
            self._accept()
            self._listener.setblocking(True)
            if self._sessions:
                return False
            self._unlink()
        return True
