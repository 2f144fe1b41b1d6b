# usage: warm_wait.py DIR -- writes its parent pid to DIR/<restart>.<rank>; the first attempt
# then sleeps until stopped, later attempts exit 0.
import os
import sys
import time

restart, rank = os.environ["TORCHELASTIC_RESTART_COUNT"], os.environ["RANK"]
path = os.path.join(sys.argv[1], f"{restart}.{rank}")
with open(path + ".tmp", "w") as handle:
    handle.write(str(os.getppid()))
os.replace(path + ".tmp", path)
if restart == "0":
    time.sleep(300)
