# usage: reform_then_fail.py DIR -- alone (world size 1) it marks DIR/alone and waits to be
# re-formed into a bigger round; in the first round of two, rank 1 exits 3 (rank 0 waits to
# be stopped); after the restart every rank exits 0. No torch.
import os
import sys
import time

if os.environ["WORLD_SIZE"] == "1":
    open(os.path.join(sys.argv[1], "alone"), "w").close()
    time.sleep(120)
    sys.exit(9)  # never reached when the scale-up works
if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
    if os.environ["RANK"] == "1":
        sys.exit(3)
    time.sleep(120)
    sys.exit(9)  # never reached: phalanx stops it after rank 1's failure
