# usage: stubborn_sleep.py DIR [beat] -- every rank ignores SIGTERM, writes DIR/worker<RANK>.pid
# and sleeps: only a SIGKILL ends it. With "beat", one phalanx.heartbeat() first: each attempt
# shows progress, so the same SIGKILL again is no crash loop.
import os
import signal
import sys
import time

signal.signal(signal.SIGTERM, signal.SIG_IGN)
if sys.argv[2:] == ["beat"]:
    import phalanx

    phalanx.heartbeat()
path = os.path.join(sys.argv[1], f"worker{os.environ['RANK']}.pid")
with open(path + ".tmp", "w") as handle:
    handle.write(str(os.getpid()))
os.replace(path + ".tmp", path)
time.sleep(300)
