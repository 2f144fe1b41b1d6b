# usage: straggler_train.py OUT_DIR STEPS -- ranks that step on their own (local SGD style),
# then meet in one all-reduce at the end. Each step: a little CPU work, a short sleep,
# phalanx.step(i). Rank 0 accumulates the result and checkpoints it every 100 steps
# (phalanx.checkpoint); a restarted rank 0 resumes from the newest one. Every rank writes its
# pid to OUT_DIR/pid.<rank> once its group is up, so a test can throttle it.
import json
import os
import sys
import time

import torch
import torch.distributed as dist

import phalanx

out_dir, steps = sys.argv[1], int(sys.argv[2])
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
ckpt_dir = os.path.join(out_dir, "ckpt")
start, value, resumed = 0, 0, None
if rank == 0:
    state = phalanx.checkpoint.load_latest(ckpt_dir)
    if state is not None:
        start, value, resumed = state["step"], state["value"], state["step"]
        print(f"resumed at step {start}", flush=True)
with open(os.path.join(out_dir, f"pid.{rank}"), "w") as handle:
    handle.write(str(os.getpid()))
for i in range(start, steps):
    sum(range(120_000))  # CPU work: slow under a CPU quota
    time.sleep(0.005)
    value += i * i % 7
    phalanx.step(i)
    if rank == 0 and (i + 1) % 100 == 0:
        phalanx.checkpoint.save({"step": i + 1, "value": value}, ckpt_dir, step=i + 1)
dist.all_reduce(torch.ones(1))
if rank == 0:
    with open(os.path.join(out_dir, "result.json"), "w") as handle:
        json.dump({"value": value, "resumed": resumed, "world": world}, handle)
dist.destroy_process_group()
