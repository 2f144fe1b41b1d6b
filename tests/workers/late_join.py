# usage: late_join.py DIR -- alone (world size 1) it marks DIR/alone and waits to be
# restarted into a bigger round; with company it all-reduces and prints what it saw.
import os
import sys
import time

if os.environ["WORLD_SIZE"] == "1":
    open(os.path.join(sys.argv[1], "alone"), "w").close()
    time.sleep(120)
    sys.exit(9)  # never reached when the scale-up works
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
value = torch.tensor([1.0])
dist.all_reduce(value)
print(
    f"world={dist.get_world_size()} sum={int(value.item())} restart={os.environ['TORCHELASTIC_RESTART_COUNT']}",
    flush=True,
)
dist.destroy_process_group()
