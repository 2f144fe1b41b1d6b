"""The controller: one ssh session per host, each running the normal agent, until the job
ends. It sends each session the environment line, then keeps the lifeline beating; to stop
the job anywhere it closes the lifelines (the agents stop their workers and exit), and only
ssh clients it started itself are ever killed, by their process group.

A preemption signal (``--preempt-signals``) is written on the first session's lifeline, so
that host's agent preempts the job through the rendezvous, as if it had been signalled.

When it stops everything: a signal (SIGINT, SIGTERM, SIGHUP) to the controller; a session
lost (ssh's exit status 255: a cut link, a dead host), unless the job has spare hosts or three
members or more (they go on without it, c10d failing over if it served the store); or a host that failed while the others
still run ``AFTER_FAILURE`` seconds later (their agents normally end on their own, told by
the rendezvous). A host that finished well stops nothing: its peers may train on, and their
own agents watch them; nor does, in such a job, a host whose agent was cut off from the
other members while its session held (``CUT_OFF``, exit 79: the others go on where they are
a majority), nor a host excluded from the job (``EXCLUDED``, exit 69: the node check, or
``--exclude-after``) where the others can go on without it (``HostsPlan.goes_on_without_one``).
The exit status is the job's: the first failing agent's code, 1 if the job was
stopped for a lost connection, 128+N when stopped by signal N.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from types import FrameType

from phalanx.errors import CUT_OFF_EXIT_CODE, NodeExcluded, signal_name
from phalanx.hosts.console import Console
from phalanx.hosts.lifeline import BEAT, PREEMPT_LINE
from phalanx.hosts.plan import HostPlan, HostsPlan
from phalanx.hosts.ssh import env_line

SSH_LOST = 255
CUT_OFF = CUT_OFF_EXIT_CODE  # the agent was cut off from the other members: out, not failed
EXCLUDED = NodeExcluded.exit_code  # the agent left the job excluded: out, where others go on
AFTER_FAILURE = 60.0
DRAIN = 15.0  # after the lifelines close: the agents stop within about 10 s


class Session:
    def __init__(self, host: HostPlan, line: bytes, console: Console) -> None:
        self.host = host
        self.proc = subprocess.Popen(
            host.ssh,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # a Ctrl-C at the terminal is the controller's to handle
        )
        self._lock = threading.Lock()
        self._open = True
        self.ended_at: float | None = None
        self._send(line)
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self.relays = [
            threading.Thread(target=console.relay, args=(host.name, stream, sink), daemon=True)
            for stream, sink in ((self.proc.stdout, sys.stdout), (self.proc.stderr, sys.stderr))
        ]
        for relay in self.relays:
            relay.start()

    def _send(self, data: bytes) -> None:
        with self._lock:
            if not self._open or self.proc.stdin is None:
                return
            try:
                self.proc.stdin.write(data)
                self.proc.stdin.flush()
            except (BrokenPipeError, ValueError):
                self._open = False

    def beat(self) -> None:
        self._send(b"\n")

    def preempt(self, name: str) -> None:
        self._send(PREEMPT_LINE + name.encode() + b"\n")

    def close_lifeline(self) -> None:
        with self._lock:
            if self._open and self.proc.stdin is not None:
                self._open = False
                with contextlib.suppress(BrokenPipeError):
                    self.proc.stdin.close()

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)


class Controller:
    def __init__(self, plan: HostsPlan, preempt_signals: tuple[str, ...] = ()) -> None:
        """``preempt_signals``: the job's (``--preempt-signals``); one of them to the
        controller is passed to one agent, whose rendezvous preempts every node (each
        agent told separately would take a second signal for "stop at once")."""
        self._plan = plan
        self._preempt_signals = {int(signal.Signals[name]) for name in preempt_signals}
        self._preempted: int | None = None
        self._signal: int | None = None
        self._wake = threading.Event()
        self._done = threading.Event()
        self._told_lost: set[str] = set()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # Only state: the loop does the stopping. A second preemption signal is a stop.
        if signum in self._preempt_signals and self._preempted is None:
            self._preempted = signum
        else:
            self._signal = signum
        self._wake.set()

    def run(self) -> int:
        stops = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP, *self._preempt_signals}
        previous = {s: signal.signal(s, self._on_signal) for s in stops}
        console = Console()
        sessions: list[Session] = []
        try:
            line = env_line(self._plan.env)
            sessions = [Session(host, line, console) for host in self._plan.hosts]
            threading.Thread(target=self._beat, args=(sessions,), daemon=True).start()
            for session in sessions:
                threading.Thread(target=self._wait, args=(session,), daemon=True).start()
            return self._supervise(sessions)
        finally:
            self._done.set()
            for session in sessions:
                session.close_lifeline()
            self._drain(sessions)
            for s, handler in previous.items():
                signal.signal(s, handler)

    def _beat(self, sessions: list[Session]) -> None:
        while not self._done.wait(BEAT):
            for session in sessions:
                session.beat()

    def _wait(self, session: Session) -> None:
        session.proc.wait()
        session.ended_at = time.monotonic()
        self._wake.set()

    def _supervise(self, sessions: list[Session]) -> int:
        told = False
        while True:
            self._wake.wait(1.0)
            self._wake.clear()
            if self._preempted is not None and not told:
                told = True
                name = signal_name(self._preempted)
                print(f"phalanx: preempted ({name}): passed to {sessions[0].host.name}'s agent, "
                      "which preempts every host (--preempt-grace)", file=sys.stderr, flush=True)  # fmt: skip
                sessions[0].preempt(name)
            if self._signal is not None:
                print(f"phalanx: stopping the job on every host ({signal_name(self._signal)})",
                      file=sys.stderr, flush=True)  # fmt: skip
                return 128 + self._signal
            ended = [s for s in sessions if s.ended_at is not None]
            tolerate = bool(self._plan.spares) or self._plan.fails_over
            lost = [s for s in ended if s.proc.returncode in _out(tolerate)]
            if lost and tolerate:
                self._carry_on(lost, sessions)  # a spare takes its place, or the others go on
            elif lost:  # said even when every session ended at once: the cause is the ssh link
                return self._stop_all(sessions, f"the ssh session to {lost[0].host.name} was lost")
            going_on = self._plan.goes_on_without_one
            self._tell_excluded([s for s in ended if going_on and s.proc.returncode == EXCLUDED])
            if len(ended) == len(sessions):
                return _job_code(sessions, tolerate_lost=tolerate, excluded_out=going_on)
            out = (*_out(tolerate), *((EXCLUDED,) if going_on else ()))
            failed = [
                s.ended_at for s in ended
                if s.ended_at is not None and s.proc.returncode not in (0, *out)
            ]  # fmt: skip
            if failed and time.monotonic() - min(failed) > AFTER_FAILURE:
                return self._stop_all(sessions, "a host failed and the others did not follow")

    def _carry_on(self, lost: list[Session], sessions: list[Session]) -> None:
        """With spare hosts, or three members or more, a lost host is a lost member: its agent
        stops itself (its lifeline is gone) and the job re-forms with a spare in its place, or
        without it (the store's host: on a successor's store) -- while a session is left."""
        running = sum(s.ended_at is None for s in sessions)
        code = _job_code(sessions, tolerate_lost=True)  # the job's, if none is left
        for session in lost:
            if session.host.name not in self._told_lost:
                self._told_lost.add(session.host.name)
                cut = session.proc.returncode == CUT_OFF
                line = (cut_off_line if cut else lost_line)(session.host.name, running, code)
                print(line, file=sys.stderr, flush=True)

    def _tell_excluded(self, excluded: list[Session]) -> None:
        """Say once of each host that left the job excluded: the others go on without it."""
        for session in excluded:
            if session.host.name not in self._told_lost:
                self._told_lost.add(session.host.name)
                print(excluded_line(session.host.name), file=sys.stderr, flush=True)

    def _stop_all(self, sessions: list[Session], why: str) -> int:
        print(f"phalanx: {why}; stopping the job on every host", file=sys.stderr, flush=True)
        stopped_at = time.monotonic()
        for session in sessions:
            session.close_lifeline()
        self._drain(sessions)
        return _job_code(sessions, stopped_at)

    def _drain(self, sessions: list[Session]) -> None:
        deadline = time.monotonic() + DRAIN
        for session in sessions:
            try:
                session.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                session.kill()
            for relay in session.relays:
                relay.join(max(0.1, deadline - time.monotonic()))


def lost_line(host: str, running: int, code: int) -> str:
    """What the controller says when the ssh session to ``host`` is lost and the job may go
    on without a host (spares, or a store that fails over): it goes on while ``running``
    sessions are left; with none left it ends here with ``code``, the job's exit status."""
    if running:
        return (
            f"phalanx: the ssh session to {host} was lost; the job goes on without it (its agent "
            "stops itself; a spare host takes its place, or the others re-form without it)"
        )
    if code == 0:
        return (
            f"phalanx: the ssh session to {host} was lost after the other hosts finished the "
            "job: it ends here (exit 0; that host's agent stops itself)"
        )
    return (
        f"phalanx: the ssh session to {host} was lost, and the job has no session left (every "
        f"host's was lost or ended): it ends here (exit {code}); each agent whose session was "
        "lost stops itself (its lifeline is gone); start the job again to go on from its last "
        "checkpoint"
    )


def cut_off_line(host: str, running: int, code: int) -> str:
    """What the controller says when ``host``'s agent ended cut off from the other members
    (exit 79) while its ssh session held: it is out, and the job goes on with the others
    while ``running`` sessions are left; with none left it ends here with ``code``."""
    said = (
        f"phalanx: {host}'s agent was cut off from the other members and left the job (exit "
        f"{CUT_OFF}; its ssh session held)"
    )
    if running:
        return f"{said}; the job goes on without it where a quorum of its members met"
    if code == 0:
        return f"{said} after the other hosts finished the job: it ends here (exit 0)"
    return f"{said}, and no other host runs the job any more: it ends here (exit {code})"


def excluded_line(host: str) -> str:
    """What the controller says when ``host``'s agent left the job excluded (exit 69) in a
    job that can go on without it (a spare, a failover, or ``--nnodes MIN``)."""
    return (
        f"phalanx: {host}'s agent was excluded from the job (exit {EXCLUDED}; its own lines "
        "say why); the job goes on without it, where --nnodes MIN or a spare host allows"
    )


def _out(tolerate: bool) -> tuple[int, ...]:
    """The agents' exit codes that, in a job that goes on without a host (``tolerate``:
    spares, or a store that fails over), mean a member is out, not that the job failed: a
    lost ssh session and a member cut off from the others; without it, a lost session."""
    return (SSH_LOST, CUT_OFF) if tolerate else (SSH_LOST,)


def _job_code(
    sessions: list[Session],
    stopped_at: float | None = None,
    *,
    tolerate_lost: bool = False,
    excluded_out: bool = False,
) -> int:
    """The first failing agent's code; sessions that ended after the controller stopped the
    job (``stopped_at``) were stopped by it and do not count. 1 when the controller stopped
    it and no agent had failed on its own (a lost connection). ``tolerate_lost`` (spare
    hosts, or a store that fails over): a lost session, or an agent cut off from the other
    members, is a member the job went on without, not the job's failure, unless no other
    session finished well. ``excluded_out``: the same for a host excluded from the job."""
    own = sorted(
        (s for s in sessions if s.ended_at is not None and s.proc.returncode is not None
         and (stopped_at is None or s.ended_at <= stopped_at)),
        key=lambda s: s.ended_at or 0.0,
    )  # fmt: skip
    # A negative code is an ssh client killed by that signal.
    codes = [_shell_code(s.proc.returncode) for s in own if s.proc.returncode is not None]
    out = (*_out(tolerate_lost), *((EXCLUDED,) if excluded_out else ()))
    failed = [c for c in codes if c not in (0, *out)]
    if failed:
        return failed[0]
    if (tolerate_lost or excluded_out) and stopped_at is None and 0 in codes:
        return 0
    if codes and all(c == EXCLUDED for c in codes):  # every host excluded
        return EXCLUDED
    if codes and all(c == CUT_OFF for c in codes):  # every host out: each one's code
        return CUT_OFF
    return 0 if stopped_at is None and all(c == 0 for c in codes) else 1


def _shell_code(code: int) -> int:
    return 128 - code if code < 0 else code
