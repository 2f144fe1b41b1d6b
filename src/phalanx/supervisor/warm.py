"""Warm start, the agent's side: one template process per agent run, workers forked from it.

``open_template`` starts ``phalanx.worker.template`` with the environment every worker of this
node shares and returns at once; the template imports torch while the rendezvous runs -- unless
the program provably never imports it and no ``--preload`` is given (``template_imports``,
``supervisor.reach``): then nothing, and forking still skips python's and phalanx's start-up.
``Template.launch_all`` is the supervisor's ``LaunchAll``: it waits for the template to be
ready, then sends one request for the round's workers with each one's stdout and stderr pipe
ends (``SCM_RIGHTS``) and gets back, in one answer, each pid and a pidfd (the template forks
them back to back: ``phalanx.worker.batch``), so the supervisor watches, logs and stops a
forked worker exactly as an exec'd one; ``Template.launch`` does the same for one worker.
Restarts fork again from the same template.

Fallback: when the template cannot start, fails to import, is not ready in ``READY_TIMEOUT``
seconds or dies, one line is logged and workers start cold (``exec_worker``) from then on.
A worker whose command is not ``python -u SCRIPT`` (a regular ``.py``-style file) or
``python -u -m MODULE`` -- a zip app, a directory, a ``.pyc`` -- starts cold too.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from phalanx.config import LaunchMode, WorkersConfig
from phalanx.plan import WorkerPlan
from phalanx.plan.env import node_env
from phalanx.resources.limits import LIMIT_ERRNOS
from phalanx.supervisor.process import RunningWorker, exec_worker
from phalanx.supervisor.start import Started, one_by_one
from phalanx.worker.contract import TEMPLATE_SHIM
from phalanx.worker.nofollow import append_to
from phalanx.worker.protocol import BATCH, ForkRequest, ProtocolError, make_pair, receive, send

log = logging.getLogger("phalanx")

# Every mode whose workers are python running a file or module (--run-path runs the module
# phalanx.worker.run_path, so it keeps its semantics); --no-python programs are exec'd.
WARM_MODES = frozenset({LaunchMode.SCRIPT, LaunchMode.MODULE, LaunchMode.RUN_PATH})
# By default, before --preload: torch and phalanx's in-script API over it (design.md, "Warm start")
TORCH = ("torch", "phalanx.inscript.dist", "phalanx.inscript.checkpoint")
READY_TIMEOUT = 120.0  # importing torch on a loaded machine; a cold start would wait as long
REPLY_TIMEOUT = 30.0  # one fork, or one exit status after the pidfd said the worker ended


def template_env(workers: WorkersConfig, base_env: Mapping[str, str]) -> dict[str, str]:
    """The environment all workers of this node share (``plan.env.node_env``); each fork
    request then carries the worker's whole environment. Libraries read it at import, in the
    template."""
    return node_env(workers, base_env)


def template_imports(workers: WorkersConfig, env: Mapping[str, str], cwd: str) -> tuple[str, ...]:
    """What the template imports before the ``--preload`` modules: torch, unless the program
    cannot reach it (its source read, not run: ``supervisor.reach``). Any
    ``--preload`` keeps torch: those modules are the user's own choice of what to pay once."""
    if workers.preload:
        return TORCH
    from phalanx.supervisor.reach import may_import_torch  # a template's own: not the service's

    kind = "module" if workers.mode is LaunchMode.MODULE else "script"
    return TORCH if may_import_torch(kind, workers.program, cwd, env).may else ()


def fork_request(worker: WorkerPlan, cwd: str, python: str = sys.executable) -> ForkRequest | None:
    """The fork request for ``worker``'s command, or None when it must be exec'd: a program
    not run by this python, or a script python runs in its own way (a zip app, a ``.pyc``,
    a directory; a missing file gets python's own error)."""
    command = worker.command
    main = command.python_main()
    if main is None or command.python != python:
        return None
    kind, target, args = main
    if kind == "script" and not _plain_source(os.path.join(cwd, target)):
        return None
    return ForkRequest(kind, target, args, dict(worker.env), cwd, command.argv)


def _plain_source(path: str) -> bool:
    return os.path.isfile(path) and not path.endswith(".pyc") and not zipfile.is_zipfile(path)


@dataclass
class WarmWorker:
    """A worker forked by the template (the warm path), as the supervisor sees it."""

    template: Template
    pid: int
    exit_fd: int  # a pidfd: readable once the worker has exited
    stdout_fd: int
    stderr_fd: int

    def reap(self) -> int:
        return self.template.exit_status(self.pid)

    def close(self) -> None:
        for fd in (self.exit_fd, self.stdout_fd, self.stderr_fd):
            with contextlib.suppress(OSError):
                os.close(fd)


class Template:
    """The agent's handle on the template process; ``launch`` is a supervisor ``Launch``."""

    def __init__(
        self,
        proc: subprocess.Popen[bytes] | None,
        sock: socket.socket,
        log_file: BinaryIO | None,
        log_path: Path,
    ) -> None:
        self._proc = proc
        self._sock = sock
        self._log = log_file
        self._log_path = log_path  # the file object's name is its descriptor's number
        self._state = "starting"  # -> "ready" | "gone"
        self._statuses: dict[int, int] = {}  # pid -> wait status, as the template reported it

    @classmethod
    def start(
        cls,
        env: Mapping[str, str],
        preload: tuple[str, ...],
        log_path: Path,
        imports: tuple[str, ...] = TORCH,
    ) -> Template:
        ours, theirs = make_pair()
        log_file = os.fdopen(append_to(log_path), "ab")
        try:
            proc = subprocess.Popen(
                # -c, not -m: the working directory stays off sys.path (isolated_main).
                [sys.executable, "-u", "-c", TEMPLATE_SHIM,
                 str(theirs.fileno()), str(os.getpid()), ",".join(preload), ",".join(imports)],
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log_file,
                pass_fds=(theirs.fileno(),),
                # Its own group: a Ctrl-C to the launcher's group must not reach it.
                process_group=0,
            )  # fmt: skip
        except BaseException:
            ours.close()
            log_file.close()
            raise
        finally:
            theirs.close()
        return cls(proc, ours, log_file, log_path)

    @property
    def pid(self) -> int:
        return self._proc.pid if self._proc is not None else 0

    def launch(self, worker: WorkerPlan) -> RunningWorker:
        cwd = os.getcwd()
        request = fork_request(worker, cwd)
        if request is None:
            return exec_worker(worker)
        if not self._ready():
            return self._instead(worker)
        try:
            return self._fork(request)
        except OSError as exc:
            if exc.errno in LIMIT_ERRNOS:  # a cold start would hit the same limit
                raise
            self._give_up(f"forking rank {worker.global_rank} failed: {exc}")
            return self._instead(worker)
        except ProtocolError as exc:
            self._give_up(f"forking rank {worker.global_rank} failed: {exc}")
            return self._instead(worker)

    def _instead(self, worker: WorkerPlan) -> RunningWorker:
        """How a worker starts once this template is given up: cold."""
        return exec_worker(worker)

    def wait_ready(self, until: Callable[[], bool], every: float) -> None:
        """Block until the template has imported (or was given up: workers start cold), or
        ``until()``, asked every ``every`` s meanwhile, is true (``agent.join_when_ready``)."""
        deadline = time.monotonic() + READY_TIMEOUT
        while self._state == "starting" and time.monotonic() < deadline:
            if select.select([self._sock], [], [], every)[0]:
                self._ready()  # (an answer came: read it)
            elif until():
                return

    def _ready(self) -> bool:
        if self._state == "starting":
            try:
                message, _ = self._next(lambda m: "ready" in m or "failed" in m, READY_TIMEOUT)
            except (OSError, ProtocolError) as exc:
                self._give_up(str(exc))
            else:
                if "failed" in message:
                    self._give_up(self._failed(str(message["failed"])))
                else:
                    self._state = "ready"
                    self._on_ready(message)
        return self._state == "ready"

    def _failed(self, why: str) -> str:
        return f"the template could not import: {why}"

    def _on_ready(self, message: dict[str, Any]) -> None:
        seconds = float(message.get("seconds", 0.0))
        log.info(
            "warm start: workers fork from template pid %d (%s)",
            self.pid,
            f"imports took {seconds:.1f} s"
            if message.get("modules", TORCH)
            else "nothing imported: the program never imports torch",
        )

    def launch_all(self, workers: Sequence[WorkerPlan]) -> Started:
        """A supervisor ``LaunchAll``: the workers forked in one request per ``BATCH`` (one
        that must be exec'd is, in its place; ``launch``'s fallbacks apply)."""
        cwd = os.getcwd()
        todo = [(worker, fork_request(worker, cwd)) for worker in workers]
        started: Started = []
        while todo and not (started and isinstance(started[-1], BaseException)):
            batch = list(itertools.takewhile(lambda pair: pair[1] is not None, todo[:BATCH]))
            if batch and self._ready():
                started += self._fork_all(
                    [w for w, _ in batch], [r for _, r in batch if r is not None]
                )
                del todo[: len(batch)]
            else:
                started += one_by_one(self.launch)([todo.pop(0)[0]])
        return started

    def _fork_all(self, workers: list[WorkerPlan], requests: list[ForkRequest]) -> Started:
        try:
            forked, error = self._fork_many(requests)
        except OSError as exc:
            if exc.errno in LIMIT_ERRNOS:  # a cold start would hit the same limit
                return [exc]
            self._abandon()
            forked, error = [], {"error": str(exc)}
        except ProtocolError as exc:
            self._abandon()
            forked, error = [], {"error": str(exc)}
        started: Started = list(forked)
        if error is None:
            return started
        if error.get("errno") in LIMIT_ERRNOS:  # the template's fork hit a limit
            return [*started, OSError(int(error["errno"]), str(error["error"]))]
        failed = workers[len(forked)]
        self._give_up(f"forking rank {failed.global_rank} failed: {error['error']}")
        return started + one_by_one(self._instead)(workers[len(forked) :])

    def _fork(self, request: ForkRequest) -> WarmWorker:
        forked, error = self._fork_many([request])
        if error is not None:
            if error.get("errno") in LIMIT_ERRNOS:  # the template's fork hit a limit
                raise OSError(int(error["errno"]), str(error["error"]))
            raise ProtocolError(str(error["error"]))
        return forked[0]

    def _fork_many(
        self, requests: list[ForkRequest]
    ) -> tuple[list[WarmWorker], dict[str, Any] | None]:
        """One round trip: the workers forked (in order), and the answer when one was not."""
        reads: list[int] = []
        writes: list[int] = []
        try:
            for _ in range(2 * len(requests)):  # each worker's stdout and stderr
                read, write = os.pipe()
                reads.append(read)
                writes.append(write)
            send(self._sock, {"forks": [r.to_json() for r in requests]}, tuple(writes))
            reply, pidfds = self._next(
                lambda m: "pids" in m or "error" in m, REPLY_TIMEOUT, len(requests)
            )
        except BaseException:
            _close(reads)
            raise
        finally:
            _close(writes)
        pids = reply.get("pids", [])
        if not isinstance(pids, list) or len(pids) != len(pidfds) or len(pids) > len(requests):
            _close(reads + pidfds)
            raise ProtocolError(f"a fork answer with {len(pidfds)} pidfds for pids {pids!r}")
        forked = [
            WarmWorker(self, int(pid), pidfd, reads[2 * i], reads[2 * i + 1])
            for i, (pid, pidfd) in enumerate(zip(pids, pidfds, strict=True))
        ]
        _close(reads[2 * len(forked) :])
        if "error" not in reply and len(forked) < len(requests):
            reply = {**reply, "error": f"{len(forked)} of {len(requests)} workers in the answer"}
        return forked, (reply if "error" in reply else None)

    def _abandon(self) -> None:
        """A request went unanswered (no answer in time, or a broken one): what the template
        forked for it may run, unknown to the supervisor, while the same ranks start
        elsewhere. Ending the connection ends them: the template kills its children when
        the agent's end closes, the service its session's; a per-run template is killed
        too (its children die with it), since a stalled one may never read that end."""
        with contextlib.suppress(OSError):
            self._sock.close()
        if self._proc is not None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.kill()

    def exit_status(self, pid: int) -> int:
        """The return code of a forked worker (negative: killed by that signal)."""
        if pid not in self._statuses and self._state != "gone":
            try:
                self._next(lambda m: m.get("exit") == pid, REPLY_TIMEOUT)
            except (OSError, ProtocolError) as exc:
                self._give_up(str(exc))
        if pid not in self._statuses:
            # The template is gone, and its workers died with it (PR_SET_PDEATHSIG: SIGKILL).
            log.warning("exit status of pid %d unknown (template gone); reporting SIGKILL", pid)
            return -signal.SIGKILL
        return os.waitstatus_to_exitcode(self._statuses.pop(pid))

    def _next(
        self, wanted: Callable[[dict[str, Any]], bool], timeout: float, max_fds: int = 1
    ) -> tuple[dict[str, Any], list[int]]:
        """Read messages until ``wanted`` matches one (returned with its fds); exit statuses
        are kept as they pass."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([self._sock], [], [], remaining)[0]:
                raise ProtocolError(f"no answer from the template in {timeout:.0f} s")
            received = receive(self._sock, max_fds=max_fds)
            if received is None:
                raise ProtocolError(f"the template exited ({self._describe_exit()})")
            message, fds = received
            if "exit" in message:
                self._statuses[int(message["exit"])] = int(message["status"])
            if wanted(message):
                return message, fds
            for fd in fds:
                os.close(fd)

    def _describe_exit(self) -> str:
        if self._proc is None:
            return "it closed the connection"
        try:
            code = self._proc.wait(timeout=1)
        except subprocess.TimeoutExpired:
            return "still running"
        return f"exit status {code}"

    def _give_up(self, reason: str) -> None:
        if self._state != "gone":
            self._state = "gone"
            log.warning(
                "warm start unavailable (%s; see %s); starting workers cold",
                reason,
                self._log_path,
            )

    def close(self) -> None:
        """Stop the template at once: it holds nothing but memory its workers shared."""
        with contextlib.suppress(OSError):
            self._sock.close()
        if self._proc is not None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=5)  # bounded: one stuck in the kernel cannot be reaped
        if self._log is not None:
            self._log.close()


def _close(fds: Iterable[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def open_template(
    workers: WorkersConfig, base_env: Mapping[str, str], run_dir: Path
) -> Template | None:
    """Start the template for this agent run, or None (cold start) when warm start is off,
    the mode execs programs (``--no-python``), or the process cannot be started (logged)."""
    if not workers.warm_start or workers.mode not in WARM_MODES:
        return None
    env = template_env(workers, base_env)
    try:
        imports = template_imports(workers, env, os.getcwd())
        return Template.start(env, workers.preload, run_dir / "template.log", imports)
    except OSError as exc:
        log.warning("warm start unavailable (%s); starting workers cold", exc)
        return None
