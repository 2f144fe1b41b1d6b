"""A tiny watchdog process that kills the workers' process groups if the launcher dies.

``PR_SET_PDEATHSIG`` kills each worker when the launcher dies, but not the worker's own
children (DataLoader workers, ``mp.spawn`` children). The guardian holds the read end of a
pipe whose write end only the launcher has: when the launcher dies -- even by SIGKILL -- the
kernel closes it, the guardian reads EOF and SIGKILLs every process group it was told about.
It starts with ``python -I -S`` (no site, no torch) so it costs a few milliseconds.

When the agent died (EOF without the goodbye) and it was given the agent's *last word*
(``say``; ``phalanx.rendezvous.lastword``), it then tells the rendezvous store that the node
died, so the other nodes count it lost at once instead of after ``heartbeat_timeout`` or
``lease_ttl``. What saying it needs (phalanx and the store's client, from the agent's path:
``lastword.ready``) it imports as soon as it is given the word, in a thread of its own, so
that at the agent's death the word costs one request, not the imports; a guardian given no
word (a single node, or one that hosts the store) imports nothing and stays a few
milliseconds. The word is said under an alarm: a store that does not answer delays the
cleanup by a few seconds at most. A word that could not be said is told on the guardian's
stderr, which is the agent's (the node's log; ``lastword.say_died``).

With a job cgroup (``phalanx.supervisor.cgroup``) it then SIGKILLs every other member of the
cgroup but the agent -- which catches what left its process group, ``setsid`` included --
and, when the agent died, leaves the cgroup and removes it: once the agent has finished
dying (the guardian has been reparented), retrying for a few seconds while a member killed a
moment ago is still listed. Every wait is bounded.

A guardian can die before its agent (the OOM killer, an admin's ``kill``, a crash). The
agent then starts a new one at once and tells it everything the first was told -- every
group still watched, the last word in force, the cgroup -- so it is as good as the first;
``on_lost`` is told once per loss (the agent logs it and records a ``guardian_lost`` event).
A thread waits on the guardian's pidfd for that, so the node is unguarded for milliseconds,
not until the next worker starts or ends; a write that finds the pipe broken first
replaces it there. Past ``MAX_REPLACEMENTS`` (something kills every new one), or when a new
one cannot be started, the node runs on without a guardian, said the same way.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from phalanx.errors import signal_name
from phalanx.rendezvous.credentials import worker_environment
from phalanx.supervisor.cgroup import JobCgroup

MAX_REPLACEMENTS = 10  # per agent run: a guardian killed as soon as it starts is not chased
_REAP_WAIT = 5.0  # s for a guardian whose pipe broke to finish exiting (it is, already)

# Lines on the pipe: "+<pgid>" / "-<pgid>" (watch / forget a group), "!<hex of JSON>" (the
# last word; a bare "!" withdraws it), "=" (the agent is leaving normally and removes its
# cgroup itself). EOF without "=" means the agent died.
_GUARDIAN_CODE = """
import os, signal, sys, time
agent = os.getppid()
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
          signal.SIGUSR2):
    signal.signal(s, signal.SIG_IGN)
groups, buf, leaving, word, readying = set(), b"", False, b"", None
def _ready(text):
    try:
        import json
        said = json.loads(bytes.fromhex(text.decode()))
        sys.path.extend(p for p in said["path"] if p not in sys.path)  # (after the stdlib)
        from phalanx.rendezvous.lastword import ready
        ready(said)
    except BaseException:
        pass  # say_died imports what is missing
while True:
    chunk = os.read(0, 65536)
    if not chunk:
        break
    buf += chunk
    *lines, buf = buf.split(b"\\n")
    for line in lines:
        if line[:1] == b"+":
            groups.add(int(line[1:]))
        elif line[:1] == b"-":
            groups.discard(int(line[1:]))
        elif line[:1] == b"!":
            word = line[1:]
            if word and readying is None:
                # What the last word needs is imported now, while the agent lives, in a
                # thread (the EOF is still read, and the groups killed, at once).
                import threading
                readying = threading.Thread(target=_ready, args=(word,), daemon=True)
                readying.start()
        elif line == b"=":
            leaving = True
for group in groups:
    try:
        os.killpg(group, signal.SIGKILL)
    except OSError:
        pass
if word and not leaving:
    def _late(*_):
        raise TimeoutError
    signal.signal(signal.SIGALRM, _late)
    signal.setitimer(signal.ITIMER_REAL, 6.0)  # lastword.say_died: a few 2 s steps at most
    until = time.monotonic() + 5.5  # its second try only if it ends before the alarm
    try:
        try:
            if readying is not None:
                readying.join(4.0)
            import json
            said = json.loads(bytes.fromhex(word.decode()))
            # After the standard library: a user's types.py in the agent's working directory
            # (on its path) must not stand in for a standard module here either.
            sys.path.extend(said["path"])
            from phalanx.rendezvous.lastword import say_died
            say_died(said, until)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except BaseException:
        pass  # (the alarm may ring in the finally: the cleanup below must still run)
if len(sys.argv) > 2:
    job, parent, me = sys.argv[1], sys.argv[2], os.getpid()
    if not leaving:
        # The pipe closes part-way through the agent's exit, before the kernel takes the
        # agent out of its cgroup; it has once this process is reparented.
        deadline = time.monotonic() + 5.0
        while os.getppid() == agent and time.monotonic() < deadline:
            time.sleep(0.01)
        try:
            with open(parent + "/cgroup.procs", "w") as procs:
                procs.write(str(me))
        except OSError:
            pass
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        try:
            with open(job + "/cgroup.procs") as procs:
                others = [int(p) for p in procs.read().split() if int(p) not in (me, agent)]
        except OSError:
            break
        for pid in others:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        if leaving:
            break  # the agent empties and removes the cgroup itself, on a bounded wait
        if not leaving and not others:
            # Nobody else will remove the cgroup. A member SIGKILLed a moment ago can still
            # be listed (a thread of it still exiting): try again until the deadline.
            try:
                os.rmdir(job)
                break
            except OSError:
                pass
        time.sleep(0.01)
"""


@dataclass(frozen=True)
class GuardianLost:
    """A guardian that died before its agent: its pid, how it ended (``killed by SIGKILL``,
    ``exit code 1``), and the pid of the one that replaced it (None: the node runs on
    without one, ``why`` says why)."""

    pid: int
    ended: str
    replacement: int | None
    why: str = ""


class Guardian:
    """Owns the guardian process; ``watch``/``forget`` tell it which groups to kill.

    ``on_lost`` is called (from the watching thread, or from the caller of ``watch``,
    ``forget`` or ``say``) once for each guardian that died before ``close``."""

    def __init__(
        self,
        cgroup: JobCgroup | None = None,
        on_lost: Callable[[GuardianLost], None] = lambda lost: None,
    ) -> None:
        self._where = [str(cgroup.path), str(cgroup.parent)] if cgroup is not None else []
        self._on_lost = on_lost
        # What a replacement must be told: the groups watched, the word in force (hex).
        self._groups: set[int] = set()
        self._word = ""
        self._replaced = 0
        self._closing = False
        self._lock = threading.Lock()  # a long word goes in several writes: lines whole
        self._proc: subprocess.Popen[bytes] | None = self._spawn()
        self._wake_r, self._wake_w = os.pipe()  # close() ends the watching thread
        self._watcher = threading.Thread(target=self._watch, name="phalanx-guardian", daemon=True)
        self._watcher.start()

    def _spawn(self) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _GUARDIAN_CODE, *self._where],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            # The agent's: a last word that could not be said is told in the node's log.
            close_fds=True,
            env=worker_environment(os.environ),  # it needs none of the launcher's secrets
            # Its own group: a Ctrl-C or a kill of the launcher's group must not take it too.
            process_group=0,
        )
        assert proc.stdin is not None
        # Never inherited: a worker holding the write end would hide the agent's death.
        os.set_inheritable(proc.stdin.fileno(), False)
        return proc

    @property
    def pid(self) -> int | None:
        """The guardian's pid (the current one's); None once the node runs without one."""
        proc = self._proc
        return None if proc is None else proc.pid

    def watch(self, pgid: int) -> None:
        with self._lock:
            self._groups.add(pgid)
            lost = self._send(f"+{pgid}\n")
        self._tell(lost)

    def forget(self, pgid: int) -> None:
        with self._lock:
            self._groups.discard(pgid)
            lost = self._send(f"-{pgid}\n")
        self._tell(lost)

    def say(self, word: Mapping[str, object] | None) -> None:
        """What to tell the rendezvous store if the agent dies (``lastword.say_died``); None
        withdraws it. Over the pipe, never the environment: it holds the store's secret."""
        text = "" if word is None else json.dumps(word, separators=(",", ":")).encode().hex()
        with self._lock:
            self._word = text
            lost = self._send(f"!{text}\n")
        self._tell(lost)

    def _send(self, line: str) -> GuardianLost | None:
        """Under the lock, the state already updated: a broken pipe means the guardian died,
        and its replacement is told the whole state, this line's change included."""
        proc = self._proc
        if proc is None or self._closing:
            return None
        try:
            _write(proc, line)
        except OSError:
            return self._replace(proc)
        return None

    def _replace(self, dead: subprocess.Popen[bytes]) -> GuardianLost:
        """Under the lock: reap ``dead`` and start a guardian told what it was told."""
        ended = _reap(dead)
        while self._replaced < MAX_REPLACEMENTS:
            self._replaced += 1
            try:
                proc = self._spawn()
            except OSError as exc:  # a process limit, a full memory: run on without
                self._proc = None
                return GuardianLost(dead.pid, ended, None, exc.strerror or str(exc))
            told = [f"+{group}\n" for group in sorted(self._groups)]
            try:
                _write(proc, "".join([*told, f"!{self._word}\n" if self._word else ""]))
            except OSError:  # died at once as well: the next try, within the bound
                _reap(proc)
                continue
            self._proc = proc
            return GuardianLost(dead.pid, ended, proc.pid)
        self._proc = None
        return GuardianLost(dead.pid, ended, None, f"{MAX_REPLACEMENTS} replaced already")

    def _tell(self, lost: GuardianLost | None) -> None:
        if lost is None:
            return
        try:
            self._on_lost(lost)  # outside the lock: the caller may log, emit, write
        except Exception:  # a bug there must not end the watching thread or the agent
            logging.getLogger("phalanx").exception("guardian: telling of a lost guardian failed")

    def _watch(self) -> None:
        """Replace the guardian as soon as it dies (its pidfd becomes readable)."""
        while True:
            with self._lock:
                proc = self._proc
                if proc is None or self._closing:
                    return
                try:
                    pidfd = os.pidfd_open(proc.pid)  # not reaped: only _replace does, locked
                except OSError:
                    pidfd = -1  # (cannot be: it is not reaped) taken for dead
            if pidfd >= 0:
                try:
                    ready, _, _ = select.select([pidfd, self._wake_r], [], [])
                finally:
                    os.close(pidfd)
                if self._wake_r in ready:
                    return
            with self._lock:
                lost = None if self._closing or self._proc is not proc else self._replace(proc)
            self._tell(lost)

    def close(self) -> None:
        """Stop the guardian (it kills any group still registered, then exits); the caller
        removes the job cgroup itself (``JobCgroup.leave``)."""
        with self._lock:
            self._closing = True  # from here on, a guardian that ends is not replaced
            proc = self._proc
        os.write(self._wake_w, b"x")
        self._watcher.join(_REAP_WAIT)
        if proc is not None:
            if proc.stdin is not None and not proc.stdin.closed:
                with contextlib.suppress(OSError):
                    os.write(proc.stdin.fileno(), b"=\n")
            _reap(proc)
        for fd in (self._wake_r, self._wake_w):
            os.close(fd)


def _write(proc: subprocess.Popen[bytes], line: str) -> None:
    assert proc.stdin is not None
    data = memoryview(line.encode())
    while data:  # a word can be longer than a pipe takes in one write (its sys.path)
        data = data[os.write(proc.stdin.fileno(), data) :]


def _reap(proc: subprocess.Popen[bytes]) -> str:
    """Wait (bounded) for ``proc`` to exit, SIGKILL it past that; how it ended, in words."""
    if proc.stdin is not None:
        with contextlib.suppress(OSError):
            proc.stdin.close()
    # Its exit seen on its pidfd, at once: ``wait(timeout=)`` polls at doubling intervals,
    # which at a launch's end took 2-8 ms past a guardian's exit of a few.
    left = _REAP_WAIT  # the one bound: what the pidfd waited is not waited again
    with contextlib.suppress(OSError):  # reaped already: ``wait`` answers at once
        pidfd = os.pidfd_open(proc.pid)
        try:
            select.select([pidfd], [], [], _REAP_WAIT)
            left = 0.0
        finally:
            os.close(pidfd)
    try:
        code = proc.wait(timeout=left)
    except subprocess.TimeoutExpired:
        proc.kill()
        code = proc.wait()
    return f"killed by {signal_name(-code)}" if code < 0 else f"exit code {code}"
