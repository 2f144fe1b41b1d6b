"""A preemption as the worker sees it: the agent's notice, and the signal it forwards.

The notice is the truth: before forwarding the signal the agent writes
``PREEMPT_NOTICE_FILE`` in the rank's directory, and ``noticed()`` is whether it is there
(one ``stat``). So ``phalanx.preempted()`` keeps working when the script installs its own
handler for the same signal after phalanx's boot (the script then also gets the signal,
as it would under ``srun``), and no user code ever runs inside a signal handler.

The forwarded signal is absorbed by ``install``'s handler, so a script that does not
listen is not killed by it before the deadline (SIGUSR1's default action ends a process).
SIGTERM is phalanx's own stop signal too: it is absorbed only while a notice says the
grace is still running; otherwise (a plain stop, or the deadline) it acts as it would
without phalanx, and a scheduler that signals every process directly (Slurm's cgroup
delivery) before the agent's notice is written is absorbed the same way for the others.

Stdlib only: the warm-start template imports this before torch.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Mapping
from types import FrameType

from phalanx.worker.contract import PREEMPT_NOTICE_FILE, PREEMPT_SIGNALS_ENV, STOP_NOTICE_FILE

# How long a SIGTERM with no word from the agent waits for one: the agent got the same
# signal at the same moment and writes its notice within a monitor tick or two.
NOTICE_WAIT = 2.0

_notice: str | None = None  # this rank's notice path, once ``install`` found its directory
_stopping: str | None = None  # and its stop notice's
_previous: dict[int, object] = {}


def install(environ: Mapping[str, str], rank_dir: str) -> None:
    """Absorb the job's preemption signals (``PREEMPT_SIGNALS_ENV``) in this worker."""
    global _notice, _stopping
    _notice = os.path.join(rank_dir, PREEMPT_NOTICE_FILE)
    _stopping = os.path.join(rank_dir, STOP_NOTICE_FILE)
    for name in environ.get(PREEMPT_SIGNALS_ENV, "").split(","):
        sig = getattr(signal.Signals, name.strip(), None) if name.strip() else None
        if sig is not None and sig not in (signal.SIGKILL, signal.SIGSTOP):
            _previous[sig] = signal.signal(sig, _absorb)


def noticed() -> bool:
    """Whether the agent told this rank that the job is preempted (False outside phalanx)."""
    return _notice is not None and os.path.exists(_notice)


def _stop_at() -> float | None:
    """When the agent stops the workers (``time.monotonic()``: one clock for the whole
    host), from the notice; None without one."""
    if _notice is None:
        return None
    try:
        with open(_notice) as handle:
            return float(json.load(handle)["stop_at"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _await_notice() -> float | None:
    """A SIGTERM with no notice: phalanx's own stop says so (``STOP_NOTICE_FILE``: act at
    once); otherwise it came from outside, to every process of the job at once, and the
    agent's notice follows within ``NOTICE_WAIT`` if it is a preemption."""
    waited = time.monotonic() + NOTICE_WAIT
    while _stopping is not None and not os.path.exists(_stopping):
        stop_at = _stop_at()
        if stop_at is not None or time.monotonic() >= waited:
            return stop_at
        time.sleep(0.05)
    return None


def _absorb(signum: int, frame: FrameType | None) -> None:
    if signum != signal.SIGTERM:
        return
    stop_at = _stop_at()
    if stop_at is None:
        stop_at = _await_notice()
    if stop_at is not None and time.monotonic() < stop_at:
        return  # the grace runs: the script saves, or is stopped at the deadline
    previous = _previous.get(signum)
    if callable(previous):
        previous(signum, frame)
        return
    signal.signal(signum, signal.SIG_DFL if previous is None else previous)  # type: ignore[arg-type]
    os.kill(os.getpid(), signum)
