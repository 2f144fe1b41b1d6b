"""A tiny watchdog process that kills the workers' process groups if the launcher dies.

``PR_SET_PDEATHSIG`` kills each worker when the launcher dies, but not the worker's own
children (DataLoader workers, ``mp.spawn`` children). The guardian holds the read end of a
pipe whose write end only the launcher has: when the launcher dies -- even by SIGKILL -- the
kernel closes it, the guardian reads EOF and SIGKILLs every process group it was told about.
It starts with ``python -I -S`` (no site, no torch) so it costs a few milliseconds.

When the agent died (EOF without the goodbye) and it was given the agent's *last word*
(``say``; ``phalanx.rendezvous.lastword``), it then tells the rendezvous store that the node
died, so the other nodes count it lost at once instead of after ``heartbeat_timeout`` or
``lease_ttl``. Only then does it import anything (phalanx, from the agent's path), under an
alarm: the normal guardian stays a few milliseconds, and a store that does not answer
delays the cleanup by a few seconds at most.

With a job cgroup (``phalanx.supervisor.cgroup``) it then SIGKILLs every other member of the
cgroup but the agent -- which catches what left its process group, ``setsid`` included --
and, when the agent died, leaves the cgroup and removes it: once the agent has finished
dying (the guardian has been reparented), retrying for a few seconds while a member killed a
moment ago is still listed. Every wait is bounded.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Mapping

from phalanx.credentials import worker_environment
from phalanx.supervisor.cgroup import JobCgroup

# Lines on the pipe: "+<pgid>" / "-<pgid>" (watch / forget a group), "!<hex of JSON>" (the
# last word; a bare "!" withdraws it), "=" (the agent is leaving normally and removes its
# cgroup itself). EOF without "=" means the agent died.
_GUARDIAN_CODE = """
import os, signal, sys, time
agent = os.getppid()
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
          signal.SIGUSR2):
    signal.signal(s, signal.SIG_IGN)
groups, buf, leaving, word = set(), b"", False, b""
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
    try:
        try:
            import json
            said = json.loads(bytes.fromhex(word.decode()))
            # After the standard library: a user's types.py in the agent's working directory
            # (on its path) must not stand in for a standard module here either.
            sys.path.extend(said["path"])
            from phalanx.rendezvous.lastword import say_died
            say_died(said)
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


class Guardian:
    """Owns the guardian process; ``watch``/``forget`` tell it which groups to kill."""

    def __init__(self, cgroup: JobCgroup | None = None) -> None:
        where = [str(cgroup.path), str(cgroup.parent)] if cgroup is not None else []
        self._proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _GUARDIAN_CODE, *where],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            close_fds=True,
            env=worker_environment(os.environ),  # it needs none of the launcher's secrets
            # Its own group: a Ctrl-C or a kill of the launcher's group must not take it too.
            process_group=0,
        )
        assert self._proc.stdin is not None
        self._pipe = self._proc.stdin.fileno()
        self._lock = threading.Lock()  # a long word goes in several writes: lines whole
        os.set_inheritable(self._pipe, False)

    @property
    def pid(self) -> int:
        return self._proc.pid

    def watch(self, pgid: int) -> None:
        self._send(f"+{pgid}\n")

    def forget(self, pgid: int) -> None:
        self._send(f"-{pgid}\n")

    def say(self, word: Mapping[str, object] | None) -> None:
        """What to tell the rendezvous store if the agent dies (``lastword.say_died``); None
        withdraws it. Over the pipe, never the environment: it holds the store's secret."""
        text = "" if word is None else json.dumps(word, separators=(",", ":")).encode().hex()
        self._send(f"!{text}\n")

    def _send(self, line: str) -> None:
        data = memoryview(line.encode())
        with self._lock:
            while data:  # a word can be longer than a pipe takes in one write (its sys.path)
                data = data[os.write(self._pipe, data) :]

    def close(self) -> None:
        """Stop the guardian (it kills any group still registered, then exits); the caller
        removes the job cgroup itself (``JobCgroup.leave``)."""
        if self._proc.stdin is not None and not self._proc.stdin.closed:
            with contextlib.suppress(OSError):
                os.write(self._pipe, b"=\n")
            self._proc.stdin.close()
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
