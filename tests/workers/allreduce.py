# All-reduce over Gloo; rank r contributes r+1, so the sum is n(n+1)/2.
import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
value = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(value)
world = dist.get_world_size()
assert value.item() == world * (world + 1) / 2, value
print(f"sum={int(value.item())} rank={dist.get_rank()} local={os.environ['LOCAL_RANK']}")
dist.destroy_process_group()
