# usage: slow_peer_init.py sleep|SECONDS -- rank 1 is slow before init_process_group: asleep
# (for an hour), or busy for SECONDS as a long import is (its main thread's CPU time moves);
# rank 0 meanwhile waits for it inside init_process_group. Then both meet and print "met".
import os
import sys
import time

import torch.distributed as dist

if os.environ["RANK"] == "1":
    if sys.argv[1] == "sleep":
        time.sleep(3600)  # the slow peer
    deadline = time.monotonic() + float(sys.argv[1])
    while time.monotonic() < deadline:
        sum(range(10_000))  # the slow peer, busy
dist.init_process_group("gloo")
# Rank 0 hosts the store and may return from init while rank 1 still reads it to connect:
# it must not exit (taking the store down) before rank 1 is connected too.
dist.barrier()
print("met", flush=True)
dist.destroy_process_group()
