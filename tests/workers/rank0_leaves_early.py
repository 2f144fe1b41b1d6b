# usage: rank0_leaves_early.py -- on the first attempt rank 0 leaves right after joining Gloo
# (exit 0), so the others, in an all-reduce with it, fail with "Connection closed by peer"
# (a peer error, with no other failure to explain it); later attempts all-reduce and print
# "ok world=W restart=R".
import os

import torch
import torch.distributed as dist

restart = os.environ["TORCHELASTIC_RESTART_COUNT"]
dist.init_process_group("gloo")
if restart == "0" and dist.get_rank() == 0:
    os._exit(0)
value = torch.tensor([1.0])
dist.all_reduce(value)
print(f"ok world={dist.get_world_size()} restart={restart}", flush=True)
dist.destroy_process_group()
