# usage: etcd_gate.py DIR -- joins Gloo, marks DIR/ready<rank>, waits (at most 120 s) for
# DIR/go, then all-reduces and prints what it saw.
import os
import sys
import time

import torch
import torch.distributed as dist

directory = sys.argv[1]
dist.init_process_group("gloo")
rank = dist.get_rank()
open(os.path.join(directory, f"ready{rank}"), "w").close()
deadline = time.monotonic() + 120
while not os.path.exists(os.path.join(directory, "go")):
    if time.monotonic() > deadline:
        sys.exit(3)
    time.sleep(0.1)
value = torch.tensor([float(rank + 1)])
dist.all_reduce(value)
print(
    f"world={dist.get_world_size()} sum={int(value.item())} restart="
    f"{os.environ['TORCHELASTIC_RESTART_COUNT']}",
    flush=True,
)
dist.destroy_process_group()
