"""Error types. Every error carries the exit code the launcher should end with.

``signal_name`` is the one spelling of a signal in these errors and in every message and
report."""

from __future__ import annotations

import signal
import threading

# The job was preempted (asked to stop by its scheduler), not failed: sysexits' EX_TEMPFAIL,
# "try again later", what a requeue wrapper or a scheduler's policy can key on.
REQUEUE_EXIT_CODE = 75
# This node is out of the job, cut off from a quorum of its members (``CutOff``), while the job
# may go on without it: phalanx's own code, just past sysexits' range (64-78), so that
# ``--hosts``' controller (or a scheduler's wrapper) can tell a lost member from a failed job.
CUT_OFF_EXIT_CODE = 79


def signal_name(signum: int) -> str:
    """``SIGKILL`` for 9; ``signal 64`` for a number with no name here."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


class PhalanxError(Exception):
    """Root of every error phalanx raises on purpose."""

    exit_code: int = 1


class UsageError(PhalanxError):
    """Bad command line or configuration. Reported as one line per problem, never a traceback."""

    exit_code = 2

    def __init__(self, problems: list[str] | str) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("; ".join(self.problems))


class RendezvousError(PhalanxError):
    """The nodes could not agree on membership (timeout, store lost, too few nodes)."""

    exit_code = 1


class CutOff(RendezvousError):
    """This node is out of the job: its restart round could not gather a quorum of the last
    round's members (``rendezvous.dynamic.majority``: cut off from them, it served or kept a
    store that too few of them reached), or it served the store and came back to find the
    others moved the job to a successor's (``superseded``: ``rendezvous.dynamic.failover``);
    the others go on without it where they are a majority. Exit code ``CUT_OFF_EXIT_CODE``,
    not the job's failure: ``--hosts``' controller counts the host as a lost member and ends
    with the others."""

    exit_code = CUT_OFF_EXIT_CODE


class MismatchError(PhalanxError):
    """The nodes of a round do not run the same code or versions (``phalanx.consistency``).

    Exit code 2, as a usage error: a configuration to fix before anything can run, found at
    the rendezvous but always before a worker starts."""

    exit_code = 2


class NodeExcluded(PhalanxError):
    """This node leaves the job, excluded: the node check named it under ``--node-check
    exclude`` (``phalanx.nodecheck``), its worker was the root cause ``--exclude-after``
    rounds in a row, or an exclusion file lists it (``exclusion``). Exit code 69,
    sysexits' EX_UNAVAILABLE, "this node is not available"; the other nodes re-form without
    it where ``--nnodes MIN:MAX`` allows."""

    exit_code = 69


class NotNeeded(PhalanxError):
    """A spare (an agent beyond ``--nnodes MAX``) waited while the job ran with all its
    members, and the job ended without it -- it finished, or it failed (the members report
    that, with its code): exit 0, one line (``formation``)."""

    exit_code = 0


class JobFailed(PhalanxError):
    """A worker failed and the restart budget is spent; ``exit_code`` is the root cause's code."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class Interrupted(PhalanxError, SystemExit):
    """The launcher was asked to stop by a signal; exit code is 128 + the signal number.

    Also a ``SystemExit`` whose ``code`` is that exit code: a ``phalanx.spawn`` program that
    does not catch it ends as the CLI does (143 for SIGTERM, 130 for SIGINT), without a
    traceback; ``except Interrupted`` (or ``except Exception``) still catches it to clean up.
    """

    def __init__(self, signum: int, where: str = "") -> None:
        """``where``: the node whose signal stopped the job, when not this one."""
        super().__init__(signal_name(signum) + (f" on {where}" if where else ""))
        self.signum = signum
        self.where = where
        self.exit_code = self.code = 128 + signum


class Preempted(Interrupted):
    """The job was preempted (``--preempt-signals``): it stopped within ``--preempt-grace``
    and asks to be run again. Exit code ``REQUEUE_EXIT_CODE`` whatever the signal was; an
    ``Interrupted`` so every way out that cleans up after a signal cleans up after this."""

    def __init__(self, signum: int, detail: str = "", where: str = "") -> None:
        super().__init__(signum, where)
        self.args = (detail or f"preempted by signal {signum}",)
        self.exit_code = self.code = REQUEUE_EXIT_CODE


def stopped_line(exc: Interrupted) -> str:
    """What the CLI and ``phalanx.spawn`` print when a signal ended the job (one line)."""
    if isinstance(exc, Preempted):
        return f"{exc}; exit {exc.exit_code} (run the job again)"
    return f"stopped by {exc}"


# The signals the launcher handles in Python (stop, hang-up, stacks, preemption).
_HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
            signal.SIGUSR2)  # fmt: skip


def start_thread(thread: threading.Thread) -> None:
    """Start ``thread`` with the launcher's signal handlers held back until ``start()``
    returns, then run what arrived meanwhile.

    A stop signal's handler raises (``Interrupted``) in the main thread; raised inside
    ``Thread.start()`` while the new thread bootstraps, the main thread exits under it and
    the thread prints a ``KeyError`` traceback from ``threading`` (seen once: SIGTERM to a
    c10d store host as its store thread started). Blocking the signals would not do: the
    kernel hands a process's signal to any thread that does not block it, and Python then
    runs the handler in the main thread wherever it is."""
    if threading.current_thread() is not threading.main_thread():
        thread.start()
        return
    arrived: list[int] = []
    held = {
        held_signal: signal.signal(held_signal, lambda got, frame: arrived.append(got))
        for held_signal in _HANDLED
        if callable(signal.getsignal(held_signal))
    }
    try:
        thread.start()
    finally:
        for held_signal, handler in held.items():
            signal.signal(held_signal, handler)
    for got in arrived:
        handler = held[signal.Signals(got)]
        if callable(handler):
            handler(got, None)
