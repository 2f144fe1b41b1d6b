# usage: deathsig_tree.py DIR CHILD CLEAR -- records in DIR the death signal phalanx gave it
# (PR_GET_PDEATHSIG), then with CLEAR=clear drops it (PR_SET_PDEATHSIG 0), so that only the
# guardian can end it; with CHILD=child starts a child (which has none: fork clears it).
# Writes DIR/worker<RANK>.pid (and child<RANK>.pid), then sleeps.
import ctypes
import os
import subprocess
import sys
import time

PR_SET_PDEATHSIG, PR_GET_PDEATHSIG = 1, 2
libc = ctypes.CDLL(None, use_errno=True)
directory, with_child, clear = sys.argv[1], sys.argv[2] == "child", sys.argv[3] == "clear"
rank = os.environ["RANK"]
given = ctypes.c_int(-1)
libc.prctl(PR_GET_PDEATHSIG, ctypes.byref(given), 0, 0, 0)
if clear:
    libc.prctl(PR_SET_PDEATHSIG, 0, 0, 0, 0)
left = ctypes.c_int(-1)
libc.prctl(PR_GET_PDEATHSIG, ctypes.byref(left), 0, 0, 0)
with open(os.path.join(directory, f"deathsig{rank}"), "w") as handle:
    handle.write(f"{given.value} {left.value}")
pids = {f"worker{rank}": os.getpid()}
if with_child:
    pids[f"child{rank}"] = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(300)"]
    ).pid
for name, pid in pids.items():
    path = os.path.join(directory, f"{name}.pid")
    with open(path + ".tmp", "w") as handle:
        handle.write(str(pid))
    os.replace(path + ".tmp", path)
time.sleep(300)
