# usage: escape_session.py PID_DIR [fail] -- starts a child that leaves its process group and
# session (setsid) and sleeps; records both pids; then sleeps, or with "fail" exits 3.
import os
import subprocess
import sys
import time

pid_dir = sys.argv[1]
child = subprocess.Popen(
    [sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True
)
for name, pid in (("worker", os.getpid()), ("escaped", child.pid)):
    with open(os.path.join(pid_dir, f"{name}.tmp"), "w") as handle:
        handle.write(str(pid))
    os.replace(os.path.join(pid_dir, f"{name}.tmp"), os.path.join(pid_dir, f"{name}.pid"))
if len(sys.argv) > 2 and sys.argv[2] == "fail":
    time.sleep(0.5)
    sys.exit(3)
time.sleep(300)
