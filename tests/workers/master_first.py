# usage: master_first.py -- rank 0 waits a moment before its store listens (a slow start);
# every other rank says, at its first line, whether rank 0's store already listens, then
# all meet in an all-reduce.
import os
import socket
import time

if os.environ["RANK"] == "0":
    time.sleep(0.4)
else:
    try:
        with socket.create_connection(
            (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])), 1
        ):
            print("listening at my start: yes", flush=True)
    except OSError:
        print("listening at my start: no", flush=True)
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
total = torch.ones(1)
dist.all_reduce(total)
print(f"sum={int(total.item())}", flush=True)
dist.destroy_process_group()
