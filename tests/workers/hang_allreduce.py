# usage: hang_allreduce.py [once] -- rank 1 sleeps (in every attempt, or only the first with
# "once") while the other ranks wait for it in an all-reduce; then all print the sum.
import os
import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
value = torch.ones(1)
first = os.environ["TORCHELASTIC_RESTART_COUNT"] == "0"
if dist.get_rank() == 1 and (first or sys.argv[1:] != ["once"]):
    time.sleep(3600)  # the hang
dist.all_reduce(value)
print(f"sum={int(value.item())}", flush=True)
dist.destroy_process_group()
