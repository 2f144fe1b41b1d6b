# usage: preempt_train.py OUT_DIR STEPS [HOLD_AT [SAVE_SECONDS]] -- deterministic training (a
# seeded linear model, gradients all-reduced over Gloo) that calls phalanx.preempted() before
# every step.
# On True every rank writes OUT_DIR/saved_rank<R>.json with its step and rank 0 saves a
# checkpoint (phalanx.checkpoint) of that step; then all exit 0. It resumes from the newest
# checkpoint. With HOLD_AT it stops advancing at that step (asking preempted() each time)
# until preempted, so the test knows the step; OUT_DIR/ready_rank<R> says it got there.
# SAVE_SECONDS: the save takes that long (a big checkpoint) before the saved file is written.
import json
import os
import sys
import time

import torch
import torch.distributed as dist

import phalanx

out, steps = sys.argv[1], int(sys.argv[2])
hold_at = int(sys.argv[3]) if len(sys.argv) > 3 else None
save_seconds = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0
torch.manual_seed(0)
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
ckdir, step = os.path.join(out, "ck"), 0
state = phalanx.checkpoint.load_latest(ckdir)
if state is not None:
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    step = state["step"]
    print(f"rank {rank} resumed at step {step}", flush=True)
while step < steps:
    if phalanx.preempted():
        time.sleep(save_seconds)  # the save's own duration, not a synchronisation
        with open(os.path.join(out, f"saved_rank{rank}.json"), "w") as handle:
            json.dump({"step": step}, handle)
        if rank == 0:
            saved = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
            phalanx.checkpoint.save(saved, ckdir, step)
        dist.barrier()
        sys.exit(0)
    if step == hold_at:
        open(os.path.join(out, f"ready_rank{rank}"), "w").close()
        time.sleep(0.05)
        continue
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(step * world + rank))
    loss = ((model(x) - x.sum(1, keepdim=True)) ** 2).mean()
    optimizer.zero_grad()
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= world
    optimizer.step()
    step += 1
    phalanx.step(step)
if rank == 0:
    torch.save(model.state_dict(), os.path.join(out, "final.pt"))
dist.destroy_process_group()
