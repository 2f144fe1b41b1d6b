"""``--preempt-signals``, ``--preempt-grace``, ``--requeue``: read and checked at the boundary.

The default signals come from the scheduler that started the agent (``phalanx.environments``,
as ``--scheduler`` chooses it): under SLURM SIGUSR1 (``--signal=USR1@90``, ``scancel
--signal=USR1``) and SIGTERM (the end of a time limit, a preemption with GraceTime); under
Kubernetes SIGTERM (a pod's deletion, with its ``terminationGracePeriodSeconds``; any pod,
not only Kubeflow's, since ``KUBERNETES_SERVICE_HOST`` is in every one); elsewhere none, so
SIGTERM keeps stopping the job at once (exit 143) as torchrun's does.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping

from phalanx import parsing
from phalanx.environments import preempt_signals

DEFAULT_GRACE = 25.0  # within Kubernetes' default 30 s grace, with room for the kill margin


def default_signals(environ: Mapping[str, str], scheduler: str = "auto") -> tuple[str, ...]:
    """The preemption signals of a job started in ``environ`` under ``--scheduler``
    ``scheduler`` (pure: reads only the mapping; ``environments.preempt_signals``)."""
    return preempt_signals(scheduler, environ)


def parse_signals(
    text: str | None, environ: Mapping[str, str], scheduler: str = "auto"
) -> tuple[str, ...]:
    """``SIG,...``, ``none``, or None (the default for ``environ``). Raises ``ValueError``."""
    if text is None:
        return default_signals(environ, scheduler)
    if text.strip().lower() == "none":
        return ()
    names = []
    for raw in text.split(","):
        name = raw.strip().upper()
        if not name:
            continue
        name = name if name.startswith("SIG") else f"SIG{name}"  # USR1, as sbatch spells it
        if not hasattr(signal.Signals, name):
            raise ValueError(
                f"--preempt-signals: unknown signal {raw.strip()!r} (expected names like "
                "SIGUSR1,SIGTERM, or none)"
            )
        if name in ("SIGKILL", "SIGSTOP"):
            raise ValueError(f"--preempt-signals: {name} cannot be caught by any process")
        if name == "SIGINT":
            raise ValueError(
                "--preempt-signals: SIGINT stays an interrupt (Ctrl-C); choose another signal"
            )
        names.append(name)
    if not names:
        raise ValueError("--preempt-signals: expected SIG[,SIG...] or none, got nothing")
    return tuple(dict.fromkeys(names))


def parse_grace(text: str) -> float:
    grace = parsing.parse_float(text, "--preempt-grace", minimum=0)
    if grace <= 0:
        raise ValueError(f"--preempt-grace: expected a number of seconds > 0, got {text!r}")
    return grace


def describe(signals: tuple[str, ...], grace: float, requeue: bool) -> str:
    """The ``--dry-run`` line for the job's preemption settings."""
    if not signals:
        return "preemption: off (no --preempt-signals; a signal stops the job at once)"
    again = "; then scontrol requeue (node rank 0)" if requeue else ""
    return (
        f"preemption: {','.join(signals)} forwarded to every worker of every node; "
        f"--preempt-grace {grace:g} s from the first node's signal; exit 75{again}"
    )
