# usage: fail_after_others.py DIR -- rank 0 finishes at once (exit 0, after writing
# DIR/done.0); rank 1 waits for that file, then a second more, then exits 5.
import os
import sys
import time

rank = int(os.environ["RANK"])
done = os.path.join(sys.argv[1], "done.0")
if rank == 0:
    open(done, "w").close()
    print("rank 0 finished", flush=True)
    sys.exit(0)
while not os.path.exists(done):
    time.sleep(0.05)
time.sleep(1)  # let node 0's agent see its workers finish (the other order is covered too)
sys.exit(5)
