"""The bundled trainer (``examples/train.py``) as the soak runs it: the same numbers, plus
the handles the soak's faults need. Each worker writes its pid to ``$SOAK_PIDS/<node>.<rank>``
(so the harness can signal it), SIGUSR1 raises an exception in the training loop (a worker
exception), SIGUSR2 makes it hang (a stall), and every optimizer step sleeps
``$SOAK_STEP_DELAY`` seconds after it (a step that takes time; the numbers do not change)."""

from __future__ import annotations

import os
import runpy
import signal
import sys
import time
from pathlib import Path
from types import FrameType

import torch

TRAINER = Path(__file__).resolve().parent.parent / "examples" / "train.py"


def _raise(signum: int, frame: FrameType | None) -> None:
    raise RuntimeError("soak: injected worker exception")


def _hang(signum: int, frame: FrameType | None) -> None:
    while True:  # the stall timeout ends it
        time.sleep(3600)


def main() -> None:
    pids, node = os.environ.get("SOAK_PIDS"), os.environ.get("SOAK_NODE", "0")
    if pids and "RANK" in os.environ:
        (Path(pids) / f"{node}.{os.environ['RANK']}").write_text(str(os.getpid()))
    signal.signal(signal.SIGUSR1, _raise)
    signal.signal(signal.SIGUSR2, _hang)
    delay = float(os.environ.get("SOAK_STEP_DELAY", "0"))
    if delay > 0:
        plain = torch.optim.Adam.step

        def step(self: torch.optim.Adam, *args: object, **kwargs: object) -> object:
            done = plain(self, *args, **kwargs)
            time.sleep(delay)
            return done

        torch.optim.Adam.step = step
    sys.argv = [str(TRAINER), *sys.argv[1:]]
    runpy.run_path(str(TRAINER), run_name="__main__")


if __name__ == "__main__":
    main()
