# usage: lossy_steps.py DIR [beat] -- Gloo all-reduce steps until DIR/stop exists (rank 0
# looks, and the stop rides in the all-reduce, so every rank stops at the same step). Each step
# checks the sum (rank r gives r + 1) and writes its count to DIR/r<rank>-<restart>.steps; at
# the end: "ok world=W steps=S restart=R". "beat": each step is also a phalanx.heartbeat()
# (without it the workers report no progress). A step then sleeps PACE: a rank that all-reduces
# flat out burns a core for nothing the tests look at (their faults are on the store's traffic
# and on a peer going away, not on the step rate), and the suite shares two cores.
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

import phalanx

out = Path(sys.argv[1])
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
progress = out / f"r{rank}-{restart}.steps"
expected = world * (world + 1) / 2
PACE = 0.01
steps = 0
while True:
    stop = 1.0 if rank == 0 and (out / "stop").exists() else 0.0
    value = torch.tensor([float(rank + 1), stop])
    dist.all_reduce(value)
    assert value[0].item() == expected, value
    steps += 1
    if sys.argv[2:] == ["beat"]:
        phalanx.heartbeat()
    partial = progress.with_suffix(".partial")
    partial.write_text(str(steps))
    partial.replace(progress)  # whole: the test reads it while this writes
    if value[1].item() > 0:
        break
    time.sleep(PACE)
dist.barrier()
print(f"ok world={world} steps={steps} restart={restart}", flush=True)
dist.destroy_process_group()
