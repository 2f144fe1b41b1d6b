# usage: stubborn_sleep.py DIR -- every rank ignores SIGTERM, writes DIR/worker<RANK>.pid and
# sleeps: only a SIGKILL ends it.
import os
import signal
import sys
import time

signal.signal(signal.SIGTERM, signal.SIG_IGN)
path = os.path.join(sys.argv[1], f"worker{os.environ['RANK']}.pid")
with open(path + ".tmp", "w") as handle:
    handle.write(str(os.getpid()))
os.replace(path + ".tmp", path)
time.sleep(300)
