# usage: fail_how.py HOW -- rank 1 fails the way HOW says (exception, exit7, segv, sigkill,
# oom); the other ranks sleep until phalanx stops them.
import ctypes
import os
import signal
import sys
import time

if os.environ["RANK"] != "1":
    time.sleep(300)
how = sys.argv[1]
time.sleep(0.5)  # the others are up and asleep
if how == "exception":
    raise RuntimeError("corpus: the loss is nan")
if how == "exit7":
    sys.exit(7)
if how == "segv":
    ctypes.string_at(0)  # a real segmentation fault, inside Python code
if how == "sigkill":
    os.kill(os.getpid(), signal.SIGKILL)
if how == "oom":
    hoard = []
    while True:
        hoard.append(bytearray(16 * 1024 * 1024))
