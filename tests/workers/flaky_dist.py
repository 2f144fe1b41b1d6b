# usage: flaky_dist.py [FAIL_RANK] -- FAIL_RANK exits 5 on the first attempt, before joining
# Gloo (so its peers wait in init_process_group until phalanx stops them, rather than racing
# phalanx with a Gloo "connection closed" error of their own); the others all-reduce and
# print what they saw.
import os
import sys

import torch
import torch.distributed as dist

rank, restart = int(os.environ["RANK"]), os.environ["TORCHELASTIC_RESTART_COUNT"]
if len(sys.argv) > 1 and rank == int(sys.argv[1]) and restart == "0":
    print(f"rank {rank} fails on purpose", file=sys.stderr, flush=True)
    sys.exit(5)
dist.init_process_group("gloo")
value = torch.tensor([float(rank + 1)])
dist.all_reduce(value)
print(
    f"world={dist.get_world_size()} sum={int(value.item())} restart={restart} "
    f"rank={rank} node={os.environ['GROUP_RANK']}",
    flush=True,
)
dist.destroy_process_group()
