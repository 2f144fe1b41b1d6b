# usage: fail_rank.py RANK CODE -- that rank exits with CODE after a traceback-less message;
# the others block in a barrier until phalanx stops them.
import os
import sys
import time

rank, code = int(sys.argv[1]), int(sys.argv[2])
if int(os.environ["RANK"]) == rank:
    time.sleep(0.5)
    print(f"rank {rank} giving up with {code}", file=sys.stderr, flush=True)
    sys.exit(code)
time.sleep(300)
