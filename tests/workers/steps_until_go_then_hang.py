# usage: steps_until_go_then_hang.py GO RANK -- every rank steps (an optimizer step, an all-reduce, 0.05 s)
# until the file GO exists (rank 0 looks; the all-reduce carries its word, so every rank leaves
# at the same step); then RANK sleeps (the hang) while the others wait for it in an all-reduce.
import os
import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
weight = torch.nn.Parameter(torch.ones(2))
optimizer = torch.optim.SGD([weight], lr=0.1)
go = torch.zeros(1)
while go.item() == 0:
    optimizer.zero_grad()
    (weight**2).sum().backward()
    optimizer.step()
    go.fill_(1.0 if dist.get_rank() == 0 and os.path.exists(sys.argv[1]) else 0.0)
    dist.all_reduce(go)
    time.sleep(0.05)
if dist.get_rank() == int(sys.argv[2]):
    time.sleep(3600)  # the hang
dist.all_reduce(torch.ones(1))
