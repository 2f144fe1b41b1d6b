"""What the agent and the worker-side code agree on, in a module that imports nothing else:
the agent-side code reads these names here, never from ``phalanx.worker.boot`` (which sets
up a worker process when imported into one).

A rank's log directory is where its ``TORCHELASTIC_ERROR_FILE`` lies, so the worker-side
code finds it from torchrun's own variable. ``STACK_SIGNAL`` makes a worker write every
thread's Python stack to ``STACKS_FILE`` there.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping

STACK_SIGNAL = signal.SIGUSR2
STACKS_FILE = "stacks.txt"
# Where ``phalanx.checkpoint`` records each completed checkpoint (a file in the run
# directory), so the agent can tell a crash loop from progress.
CHECKPOINT_LOG_ENV = "PHALANX_CHECKPOINT_LOG"
CHECKPOINT_LOG_FILE = "checkpoints.jsonl"
# A preemption: the agent writes PREEMPT_NOTICE_FILE in each rank's directory (JSON: the
# signal, the wall-clock deadline, the monotonic instant the agent stops the workers), then
# forwards the signal; PREEMPT_SIGNALS_ENV names the job's preemption signals.
PREEMPT_NOTICE_FILE = "preempt.json"
PREEMPT_SIGNALS_ENV = "PHALANX_PREEMPT_SIGNALS"
# Written by the agent before its own SIGTERM to a worker whose preemption signals include
# SIGTERM: that SIGTERM is a stop. A SIGTERM with neither file came from outside (Slurm and
# Kubernetes signal every process of a job, maybe before the agent has written its notice).
STOP_NOTICE_FILE = "stopping"
# The last step (``phalanx.checkpoint.LastStep``), three files in the rank's directory: the
# worker writes LAST_STEP_HELD (its pid) at its first ``update``; the agent, stopping the
# round after a failure, writes LAST_STEP_NOTICE; the worker's watch thread saves its copy and
# answers with LAST_STEP_DONE (JSON: "step" saved or already there, "written", "error").
LAST_STEP_HELD = "laststep.held"
LAST_STEP_NOTICE = "laststep.save"
LAST_STEP_DONE = "laststep.done"


def isolated_main(module: str) -> str:
    """The ``-c`` code that runs ``module.main(sys.argv[1:])`` with the working directory off
    ``sys.path``: how every python worker (``phalanx.worker.boot``) and the warm-start
    template start. ``python -m`` would put the working directory first on ``sys.path`` before
    phalanx's own imports, so a ``types.py`` there, or a script named ``signal.py``, would be
    imported in place of the standard library's (python's start-up imports are done before
    it adds the entry, so only phalanx's could be). ``-P`` would do it too, but from 3.11 only,
    and the script would see ``sys.flags.safe_path`` set; ``-I`` would also drop
    ``PYTHONPATH`` and the user site. The script's own ``sys.path[0]`` is set just before it
    runs (``phalanx.worker.become``)."""
    return (
        "import sys; getattr(sys.flags, 'safe_path', 0) or sys.path.pop(0); "
        f"from {module} import main; main(sys.argv[1:])"
    )


BOOT_SHIM = isolated_main("phalanx.worker.boot")
TEMPLATE_SHIM = isolated_main("phalanx.worker.template")


def rank_dir(environ: Mapping[str, str]) -> str | None:
    """The rank's log directory, which phalanx's error file lives in; None outside phalanx."""
    error_file = environ.get("TORCHELASTIC_ERROR_FILE", "")
    directory = os.path.dirname(error_file)
    return directory if error_file and os.path.isdir(directory) else None
