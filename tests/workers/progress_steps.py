# usage: progress_steps.py STEPS [SPIN] -- STEPS optimizer steps, each also reported with
# phalanx.step(i); with SPIN, rank 1 then busy-loops while the others wait in an all-reduce.
import sys

import torch
import torch.distributed as dist

import phalanx

dist.init_process_group("gloo")
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for i in range(int(sys.argv[1])):
    optimizer.zero_grad()
    model(torch.ones(2, 4)).sum().backward()
    optimizer.step()
    phalanx.step(i)
if sys.argv[2:] == ["spin"] and dist.get_rank() == 1:
    while True:  # busy: its CPU time grows, its progress does not
        pass
dist.all_reduce(torch.ones(1))
print("finished", flush=True)
dist.destroy_process_group()  # a group left to interpreter exit can abort in Gloo teardown
