# usage: stacks_wait.py DIR -- each rank writes DIR/ready.RANK, waits for DIR/go, exits 0.
import os
import sys
import time


def wait_for_go(directory):
    while not os.path.exists(os.path.join(directory, "go")):
        time.sleep(0.05)


rank = os.environ["RANK"]
open(os.path.join(sys.argv[1], f"ready.{rank}"), "w").close()
wait_for_go(sys.argv[1])
print(f"done {rank}", flush=True)
