# usage: guard_a_group.py -- a stand-in agent without a cgroup: starts a guardian and a
# sleeping child in a process group of its own, has the guardian watch that group, prints
# "GUARDIAN_PID CHILD_PID", then sleeps until killed (only the guardian can end the child).
import subprocess
import sys
import time

from phalanx.supervisor.guardian import Guardian

guardian = Guardian()
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], process_group=0)
guardian.watch(child.pid)
print(guardian.pid, child.pid, flush=True)
time.sleep(300)
