# usage: first_attempt_waits.py DIR -- writes its pid and a child's into DIR/<TAG>-<restart>-*.pid
# (TAG: the agent's LASTWORD_TAG, one per node). On the first attempt it then sleeps (until it
# is stopped); on a restart it prints its world and exits 0 at once.
import os
import subprocess
import sys
import time

directory, tag = sys.argv[1], os.environ["LASTWORD_TAG"]
restart = os.environ["TORCHELASTIC_RESTART_COUNT"]
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
for name, pid in (("worker", os.getpid()), ("child", child.pid)):
    path = os.path.join(directory, f"{tag}-{restart}-{name}.pid")
    with open(path + ".tmp", "w") as handle:
        handle.write(str(pid))
    os.replace(path + ".tmp", path)
if restart == "0":
    time.sleep(300)
child.kill()
print(f"world={os.environ['WORLD_SIZE']} restart={restart}", flush=True)
