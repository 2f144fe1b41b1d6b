# Prints its parent pid; rank 0 fails on the first attempt, so the group restarts once.
import json
import os
import sys
import time

restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
rank = int(os.environ["RANK"])
print(json.dumps({"ppid": os.getppid(), "restart": restart, "rank": rank}), flush=True)
if rank == 0 and restart == 0:
    time.sleep(0.5)
    sys.exit(3)
