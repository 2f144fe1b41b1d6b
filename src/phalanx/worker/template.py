"""``python -u -c TEMPLATE_SHIM FD PARENT_PID [MODULE,...] [OURS,...]``: the warm-start template.

One per node, started by the agent with the environment every worker of the node shares
(``OMP_NUM_THREADS`` included: the OpenMP runtime reads it once, when torch loads it). It
imports ``OURS`` (torch, unless the agent found that the program never imports it: then
nothing; see ``phalanx.supervisor.reach``) and the ``--preload`` modules ``MODULE``,
reports ``ready`` on the socket ``FD``, then forks the workers of each request
(``phalanx.worker.batch``: a round's in one), for this attempt and every restart. Forking skips the interpreter start-up and the torch import each worker
would otherwise pay.

The working directory is not on ``sys.path`` (``TEMPLATE_SHIM``: see
``phalanx.worker.contract.isolated_main``), so a user's ``types.py`` or ``random.py`` there
is never imported in place of the standard library's; only the ``--preload`` modules named
by the user are looked for there too, as ``python -m`` would, after torch.

Why forking is safe here: the template forks from its only Python thread and never runs
torch code, so no lock is held, no OpenMP or autograd pool has been started and CUDA has
not been touched (it refuses to serve if importing initialized CUDA or started a Python
thread). Native threads that libraries start at load time must survive fork; the known
one, OpenBLAS's pool (loaded with numpy), stops itself in a ``pthread_atfork`` handler.
The template dies with the agent (``PR_SET_PDEATHSIG``) and each worker dies with the
template, so killing the agent -- even with SIGKILL -- leaves no process; it reaps its
workers as they end (pidfds in one ``select``) and forwards each status to the agent.

See ``phalanx.worker.become`` for what a forked worker sets up, and
``phalanx.worker.protocol`` for the messages.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import selectors
import signal
import socket
import sys
import threading
import time
import traceback
from typing import Any

from phalanx.worker import become, boot, leave  # every worker runs boot first: import once
from phalanx.worker.batch import STOP_SIGNALS, fork_batch
from phalanx.worker.protocol import BATCH, ForkRequest, ProtocolError, receive, send

DEFAULT_PRELOAD = ("torch",)


def preload(ours: tuple[str, ...], theirs: tuple[str, ...] = ()) -> dict[str, object]:
    """Import ``ours``, then the user's ``theirs`` (with the working directory first on
    ``sys.path`` meanwhile); raise ``RuntimeError`` if that made forking unsafe."""
    started = time.monotonic()
    modules = ours + theirs
    for name in ours:
        importlib.import_module(name)
    here = [] if getattr(sys.flags, "safe_path", False) or not theirs else [os.getcwd()]
    sys.path[:0] = here
    try:
        for name in theirs:
            importlib.import_module(name)
    finally:
        del sys.path[: len(here)]  # no worker may find phalanx's imports there
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        raise RuntimeError(f"importing {', '.join(modules)} initialized CUDA")
    if threading.active_count() > 1:
        names = ", ".join(
            t.name for t in threading.enumerate() if t is not threading.current_thread()
        )
        raise RuntimeError(f"importing {', '.join(modules)} started Python threads ({names})")
    # Native threads are allowed (see the module docstring); name them for whoever debugs.
    threads = [_thread_name(tid) for tid in os.listdir("/proc/self/task")]
    seconds = time.monotonic() - started
    print(
        f"template pid {os.getpid()}: imported {', '.join(modules) or 'no module'} in "
        f"{seconds:.2f} s; "
        f"{len(threads)} OS threads before the first fork: {', '.join(threads)}",
        file=sys.stderr,
    )
    return {"ready": os.getpid(), "seconds": round(seconds, 3), "threads": len(threads),
            "modules": list(modules)}  # fmt: skip


def _thread_name(tid: str) -> str:
    try:
        with open(f"/proc/self/task/{tid}/comm") as handle:
            return f"{tid} ({handle.read().strip()})"
    except OSError:
        return tid  # it ended meanwhile


class Server:
    """The request loop: fork on request, reap on exit. ``serve`` returns only in a child."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._selector = selectors.DefaultSelector()
        self._selector.register(sock, selectors.EVENT_READ, None)
        self._children: dict[int, int] = {}  # pid -> pidfd
        self._signals: dict[int, Any] = {
            sig: signal.getsignal(sig)
            for sig in signal.valid_signals()
            if sig not in (signal.SIGKILL, signal.SIGSTOP) and signal.getsignal(sig) is not None
        }
        self._mask: set[int] = set(signal.pthread_sigmask(signal.SIG_BLOCK, []))

    def serve(self) -> ForkRequest | None:
        """Serve until the agent closes the socket (then None); a forked child gets its request."""
        while True:
            for key, _ in self._selector.select():
                if key.data is None:
                    try:
                        received = receive(self._sock, max_fds=2 * BATCH)
                    except ProtocolError as exc:
                        send(self._sock, {"error": f"ProtocolError: {exc}"})
                        continue
                    if received is None:
                        self._stop_children()
                        return None
                    request = self._fork(*received)
                    if request is not None:
                        return request
                else:
                    self._reap(key.data)

    def _fork(self, message: dict[str, Any], fds: list[int]) -> ForkRequest | None:
        """Fork the request's workers (``batch``): a child's request in that child; None
        here, once the answer is sent. A bad request gets an error answer, not a crash."""
        forked = fork_batch(message, fds, self._mask)
        if forked.child is not None:
            request, stdio = forked.child
            self._become(request, stdio)
            return request
        for pid, pidfd in forked.children:
            self._children[pid] = pidfd
            self._selector.register(pidfd, selectors.EVENT_READ, pid)
        send(self._sock, *forked.answer())
        return None

    def _become(self, request: ForkRequest, stdio: tuple[int, int]) -> None:
        try:
            template_pid = os.getppid()
            # Close the template's own descriptors (not the libraries'): the worker must not
            # hold the agent's socket or its siblings' pidfds.
            self._selector.close()
            self._sock.close()
            for pidfd in self._children.values():
                os.close(pidfd)
            become.become(request, stdio, template_pid, self._signals, self._mask)
        except KeyboardInterrupt:  # a SIGINT that was pending at fork: die of it, as python
            traceback.print_exc()
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
            os._exit(1)
        except BaseException:
            traceback.print_exc()
            os._exit(1)

    def _reap(self, pid: int) -> None:
        pidfd = self._children.pop(pid)
        self._selector.unregister(pidfd)
        os.close(pidfd)
        _, status = os.waitpid(pid, 0)
        send(self._sock, {"exit": pid, "status": status})

    def _stop_children(self) -> None:
        """The agent is gone or done: nothing it started may outlive it."""
        for pid, pidfd in self._children.items():
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
            os.close(pidfd)
        self._children.clear()


def main(argv: list[str]) -> None:
    become.install_exit_hook()  # first registered, so it runs after all the others
    fd, parent = int(argv[0]), int(argv[1])
    become.die_with_parent(parent)
    theirs = tuple(m for m in (argv[2] if len(argv) > 2 else "").split(",") if m)
    ours = tuple(m for m in argv[3].split(",") if m) if len(argv) > 3 else DEFAULT_PRELOAD
    sock = socket.socket(fileno=fd)
    try:
        ready = preload(ours, theirs)
    except BaseException as exc:  # ImportError, an exception raised by a module, SystemExit...
        traceback.print_exc()
        send(sock, {"failed": f"{type(exc).__name__}: {exc}"})
        sys.exit(1)
    send(sock, ready)
    server = Server(sock)  # records the dispositions its children get back (become)
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    request = server.serve()
    if request is not None:
        leave.run_to_exit(lambda: become.run_job(request, RUNNERS))


def _run_boot(request: ForkRequest) -> None:
    # What ``python -u -c BOOT_SHIM ARGS`` runs, in the forked child: the worker's boot.
    sys.argv = ["-c", *request.args]
    boot.main(list(request.args))


RUNNERS = {**become.RUNNERS, "boot": _run_boot}


if __name__ == "__main__":
    main(sys.argv[1:])
