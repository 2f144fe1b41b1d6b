# usage: flaky_dist.py [FAIL_RANK] -- joins Gloo; FAIL_RANK exits 5 on the first attempt;
# the others all-reduce and print what they saw.
import os
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, restart = dist.get_rank(), os.environ["TORCHELASTIC_RESTART_COUNT"]
if len(sys.argv) > 1 and rank == int(sys.argv[1]) and restart == "0":
    print(f"rank {rank} fails on purpose", file=sys.stderr, flush=True)
    sys.exit(5)
value = torch.tensor([float(rank + 1)])
dist.all_reduce(value)
print(
    f"world={dist.get_world_size()} sum={int(value.item())} restart={restart} "
    f"rank={rank} node={os.environ['GROUP_RANK']}",
    flush=True,
)
dist.destroy_process_group()
