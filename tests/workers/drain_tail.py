# usage: drain_tail.py partial | drain_tail.py child DIR
#
# partial: one line, then a last line without a newline, and exit 0, leaving a child (in
# its process group) asleep with stdout open: the pipe ends only when phalanx kills it.
# child: fork a child that shares stdout (and the process group) and ignores SIGTERM. It
# makes the pipe 1 MiB (F_SETPIPE_SZ), writes DIR/ready, waits for DIR/go, then writes
# "line NNNNNN" lines without blocking until the pipe is full, writes how many it wrote to
# DIR/written and sleeps until it is killed. The worker exits 3 once DIR/written exists.
import fcntl
import os
import signal
import sys
import time
from pathlib import Path

if sys.argv[1] == "partial":
    if os.fork() == 0:
        time.sleep(300)
        os._exit(0)
    print("a whole line", flush=True)
    sys.stdout.write("last words without a newline")
    sys.stdout.flush()
    sys.exit(0)

folder = Path(sys.argv[2])
(folder / "worker.pid").write_text(str(os.getpid()))
sys.stdout.flush()
if os.fork() == 0:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    fcntl.fcntl(1, fcntl.F_SETPIPE_SZ, 1 << 20)
    (folder / "ready").touch()
    while not (folder / "go").exists():
        time.sleep(0.01)
    fcntl.fcntl(1, fcntl.F_SETFL, fcntl.fcntl(1, fcntl.F_GETFL) | os.O_NONBLOCK)
    count = 0
    while True:
        try:
            os.write(1, b"line %06d\n" % count)  # 12 bytes: all or nothing (PIPE_BUF)
        except BlockingIOError:
            break
        count += 1
    (folder / "written.tmp").write_text(str(count))
    os.rename(folder / "written.tmp", folder / "written")
    while True:
        time.sleep(1)
while not (folder / "written").exists():
    time.sleep(0.01)
os._exit(3)
