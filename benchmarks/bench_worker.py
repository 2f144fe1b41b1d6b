"""usage: bench_worker.py SCENARIO OUT_DIR [IDLE_SECONDS] -- the worker every benchmark runs.

Each rank writes ``OUT_DIR/start.<restart>.<rank>``, joins a Gloo group (``joined``), passes a
barrier and writes ``OUT_DIR/barrier.<restart>.<rank>``
(``time.time()``, its pid, ``time.monotonic()``: the clock the agents' events carry, and its
parent's pid). Then, by scenario: ``launch`` exits; ``kill`` (first attempt
only) has rank 1 write ``kill.0.1`` and SIGKILL itself while the others wait to be stopped;
``idle`` sleeps IDLE_SECONDS. ``left``: past ``destroy_process_group``, about to exit. The
round (``<restart>``) is ``TORCHELASTIC_RESTART_COUNT``, or 1 where ``kill.0.1`` is already
there (torchrun keeps that count per node).
"""

from __future__ import annotations

import os
import signal
import sys
import time

import torch.distributed as dist


def mark(out_dir: str, event: str, restart: int, rank: int) -> None:
    path = os.path.join(out_dir, f"{event}.{restart}.{rank}")
    with open(path + ".tmp", "w") as handle:
        handle.write(f"{time.time()!r} {os.getpid()} {time.monotonic()!r} {os.getppid()}")
    os.replace(path + ".tmp", path)  # readers never see a half-written file


def main() -> None:
    scenario, out_dir = sys.argv[1], sys.argv[2]
    rank = int(os.environ["RANK"])
    restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    if scenario == "kill" and os.path.exists(os.path.join(out_dir, "kill.0.1")):
        # torchrun counts restarts per agent: a node whose workers it restarts only because
        # another node failed (a membership change) hands them 0 again, and rank 0 would wait
        # for a kill that already happened (issue 41). The stamp is written after the first
        # barrier, so no rank of the first round can see it here: it means "the next round".
        restart = max(restart, 1)
    mark(out_dir, "start", restart, rank)
    dist.init_process_group("gloo")
    mark(out_dir, "joined", restart, rank)
    dist.barrier()
    mark(out_dir, "barrier", restart, rank)
    if scenario == "kill" and restart == 0:
        if rank == 1:
            mark(out_dir, "kill", restart, rank)
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(300)
    elif scenario == "idle":
        time.sleep(float(sys.argv[3]))
    dist.destroy_process_group()
    mark(out_dir, "left", restart, rank)


if __name__ == "__main__":
    main()
