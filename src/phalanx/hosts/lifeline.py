"""The remote agent's lifeline: its stdin from ssh.

The controller writes a newline every ``BEAT`` seconds, and ``preempt SIGNAME`` when it got
a preemption signal (``--preempt-signals``): the lifeline sends that signal to this agent,
which then preempts the whole job through the rendezvous (``PREEMPT_LINE``). End of file (the controller stopped
the job, was killed, or its ssh client died) or ``SILENCE`` seconds without a byte (a link
cut without a reset: nobody on this side would notice for minutes) means the job is over
here: SIGTERM to this agent, which stops its workers the usual way, and SIGKILL after
``HARD_STOP`` more seconds in case that stop hangs (the agent's guardian then kills the
workers). So nothing of the job outlives a lost controller by more than about 10 s, and no
process is found by name.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import threading
import time

BEAT = 0.5
SILENCE = 3.0
HARD_STOP = 5.0
PREEMPT_LINE = b"preempt "  # + the signal's name + newline


class Lifeline:
    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._thread = threading.Thread(target=self._watch, name="phalanx-lifeline", daemon=True)

    @classmethod
    def from_stdin(cls) -> Lifeline:
        """Take fd 0 for the lifeline and give the agent (and so its workers) /dev/null
        instead: a worker reading stdin must not eat the heartbeats."""
        fd = os.dup(0)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        return cls(fd)

    def start(self) -> None:
        # The agent forks nothing it does not exec (its template is a new Python), so this
        # thread, started before any of that, cannot leave a forked child a held lock.
        self._thread.start()

    def _watch(self) -> None:
        why = self._wait_for_break()
        print(f"phalanx: lifeline to the controller {why}; stopping this host's job",
              file=sys.stderr, flush=True)  # fmt: skip
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(HARD_STOP)
        os.kill(os.getpid(), signal.SIGKILL)

    def _wait_for_break(self) -> str:
        pending = b""
        while True:
            ready, _, _ = select.select([self._fd], [], [], SILENCE)
            if not ready:
                return f"silent for {SILENCE:g} s"
            try:
                data = os.read(self._fd, 4096)
            except OSError as exc:
                return f"broken ({exc.strerror})"
            if not data:
                return "closed"
            *lines, pending = (pending + data).split(b"\n")
            for line in lines:
                if line.startswith(PREEMPT_LINE):
                    _preempt(line[len(PREEMPT_LINE):].decode(errors="replace").strip())


def _preempt(name: str) -> None:
    """The controller's preemption signal, delivered to this agent as if sent to it."""
    sig = getattr(signal.Signals, name, None)
    if sig is None or sig in (signal.SIGKILL, signal.SIGSTOP):
        return
    print(f"phalanx: the controller was preempted ({name}); preempting this host's job",
          file=sys.stderr, flush=True)  # fmt: skip
    os.kill(os.getpid(), sig)
