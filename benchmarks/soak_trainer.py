"""The bundled trainer (``examples/train.py``) as the soak runs it: the same numbers, plus
the handles the soak's faults need. Each worker writes its pid to ``$SOAK_PIDS/<node>.<rank>``
(so the harness can signal it), SIGUSR1 raises an exception in the training loop (a worker
exception), ``HANG_SIGNAL`` (SIGWINCH) makes it hang (a stall), ``COLLECTIVE_KILL_SIGNAL``
(SIGPWR) makes it SIGKILL itself while the other ranks wait for it in the next step's
all-reduce, and every optimizer step sleeps ``$SOAK_STEP_DELAY`` seconds after it (a step that
takes time; the numbers do not change).
With ``$SOAK_MARKS`` set, each worker process writes the time of its first optimizer step
(past the first all-reduce) to ``$SOAK_MARKS/<node>.<rank>.<pid>``: when the job was back.
With ``$SOAK_STEPS`` set, it keeps the step it has completed (Adam's own count, which a
resume restores) in ``$SOAK_STEPS/<restart>.<node>.<rank>.<pid>``, one ``pwrite`` per step:
what a killed worker had reached, for the steps each restart runs again."""

from __future__ import annotations

import os
import runpy
import signal
import sys
import time
from pathlib import Path
from types import FrameType

import torch

# Not SIGUSR2: that is phalanx's stack-dump signal (``STACK_SIGNAL``); a handler of the
# trainer's there would answer the hang analysis's dump request with no stack, and the agent
# would wait out the dump timeout (5 s) on every hang.
HANG_SIGNAL = signal.SIGWINCH
# A worker SIGKILLed in the middle of a collective (issue 41): told by this signal, the rank
# holds back after its optimizer step for COLLECTIVE_HOLD, long enough for the others to run
# their next forward and wait in the backward's all-reduce for it, then SIGKILLs itself.
COLLECTIVE_KILL_SIGNAL = signal.SIGPWR
COLLECTIVE_HOLD = 0.5
TRAINER = Path(__file__).resolve().parent.parent / "examples" / "train.py"


def _raise(signum: int, frame: FrameType | None) -> None:
    raise RuntimeError("soak: injected worker exception")


_doomed: list[bool] = []  # set by COLLECTIVE_KILL_SIGNAL; the step acts on it


def _doom(signum: int, frame: FrameType | None) -> None:
    _doomed.append(True)


def _hang(signum: int, frame: FrameType | None) -> None:
    while True:  # the hang watch ends it
        time.sleep(3600)


def main() -> None:
    pids, node = os.environ.get("SOAK_PIDS"), os.environ.get("SOAK_NODE", "0")
    if pids and "RANK" in os.environ:
        (Path(pids) / f"{node}.{os.environ['RANK']}").write_text(str(os.getpid()))
    signal.signal(signal.SIGUSR1, _raise)
    signal.signal(HANG_SIGNAL, _hang)
    signal.signal(COLLECTIVE_KILL_SIGNAL, _doom)
    delay = float(os.environ.get("SOAK_STEP_DELAY", "0"))
    marks = os.environ.get("SOAK_MARKS")
    mark = Path(marks) / f"{node}.{os.environ.get('RANK')}.{os.getpid()}" if marks else None
    plain = torch.optim.Adam.step
    steps = os.environ.get("SOAK_STEPS")
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    where = f"{restart}.{node}.{os.environ.get('RANK')}.{os.getpid()}"
    reached = os.open(Path(steps) / where, os.O_WRONLY | os.O_CREAT, 0o644) if steps else None

    def step(self: torch.optim.Adam, *args: object, **kwargs: object) -> object:
        done = plain(self, *args, **kwargs)
        if reached is not None:
            count = next(iter(self.state.values()))["step"]
            os.pwrite(reached, f"{int(count):12d}".encode(), 0)
        if mark is not None and not mark.exists():
            mark.write_text(repr(time.time()))
        time.sleep(delay)
        if _doomed:  # the others are in their next all-reduce once this hold is over
            time.sleep(COLLECTIVE_HOLD)
            os.kill(os.getpid(), signal.SIGKILL)
        return done

    torch.optim.Adam.step = step
    sys.argv = [str(TRAINER), *sys.argv[1:]]
    runpy.run_path(str(TRAINER), run_name="__main__")


if __name__ == "__main__":
    main()
