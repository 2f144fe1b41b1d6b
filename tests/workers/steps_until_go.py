# usage: steps_until_go.py DIR -- Gloo all-reduces and optimizer steps, each also reported
# with phalanx.step(i); after step 3 writes DIR/stepping.<RANK> (its pid), and once DIR/go
# exists (at most 120 s) takes 5 more steps and prints "rank R done at step N".
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

import phalanx

folder, rank = Path(sys.argv[1]), os.environ["RANK"]
dist.init_process_group("gloo")
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
deadline, left, i = time.monotonic() + 120, None, 0
while left != 0 and time.monotonic() < deadline:
    optimizer.zero_grad()
    model(torch.ones(2, 4)).sum().backward()
    dist.all_reduce(model.weight.grad)
    optimizer.step()
    phalanx.step(i)
    if i == 3:
        (folder / f"stepping.{rank}").write_text(str(os.getpid()))
    go = (folder / "go").exists()
    dist.all_reduce(t := torch.tensor([float(go)]))  # both ranks see go at the same step
    if left is None and t.item() == 2:
        left = 5
    elif left is not None:
        left -= 1
    i += 1
    time.sleep(0.02)
print(f"rank {rank} done at step {i - 1}", flush=True)
