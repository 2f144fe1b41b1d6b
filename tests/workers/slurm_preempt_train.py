# usage: slurm_preempt_train.py OUT_DIR -- trains until phalanx.preempted() says the job is
# preempted (a collective: every rank asks after the same step and gets the same answer),
# then saves that step and the weights to OUT_DIR/saved_<RANK>.pt and exits 0; never
# preempted, it exits 3. OUT_DIR/step_<RANK> says how far it got. Run again with a saved
# checkpoint (a requeued job), it resumes after that step, writes it to resumed_<RANK>,
# trains 3 more steps and exits 0.
import os
import sys
import time

import torch
import torch.distributed as dist

import phalanx

out = sys.argv[1]
dist.init_process_group("gloo")
rank = dist.get_rank()
model = torch.nn.Linear(4, 1)
saved = os.path.join(out, f"saved_{rank}.pt")
start, stop = 0, 3000
if os.path.exists(saved):
    state = torch.load(saved)
    model.load_state_dict(state["model"])
    start, stop = state["step"] + 1, state["step"] + 4
    with open(os.path.join(out, f"resumed_{rank}"), "w") as handle:
        handle.write(str(state["step"]))
for step in range(start, stop):
    for param in model.parameters():  # the same weights on every rank, as DDP keeps them
        dist.all_reduce(param.data)
        param.data /= dist.get_world_size()
    with open(os.path.join(out, f"step_{rank}"), "w") as handle:
        handle.write(str(step))
    if phalanx.preempted():
        torch.save({"step": step, "model": model.state_dict()}, saved)
        dist.destroy_process_group()
        sys.exit(0)
    time.sleep(0.05)
dist.destroy_process_group()
sys.exit(0 if start else 3)
