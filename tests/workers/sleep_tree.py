# usage: sleep_tree.py DIR -- writes its pid and a child's pid into DIR, then sleeps.
import os
import subprocess
import sys
import time

directory = sys.argv[1]
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
rank = os.environ["RANK"]
for name, pid in ((f"worker{rank}", os.getpid()), (f"child{rank}", child.pid)):
    with open(os.path.join(directory, f"{name}.pid.tmp"), "w") as handle:
        handle.write(str(pid))
    os.replace(os.path.join(directory, f"{name}.pid.tmp"), os.path.join(directory, f"{name}.pid"))
print("ready", flush=True)
time.sleep(300)
