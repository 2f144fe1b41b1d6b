# Prints, as JSON on one line, what a worker can see of how it was started.
import json
import os
import signal
import sys

import torch

sigs = ("SIGINT", "SIGTERM", "SIGPIPE", "SIGXFSZ", "SIGCHLD", "SIGHUP", "SIGUSR1")
main = sys.modules["__main__"]
print(json.dumps({
    "argv": sys.argv, "path0": sys.path[0], "file": __file__, "name": __name__, "cwd": os.getcwd(),
    "main_keys": sorted(k for k in vars(main) if k.startswith("__")), "main_is_globals": vars(main) is globals(),
    "loader": type(__loader__).__name__, "spec": getattr(__spec__, "name", None), "package": __package__,
    "orig_argv_tail": sys.orig_argv[1:], "signals": {s: repr(signal.getsignal(getattr(signal, s))) for s in sigs},
    "mask": sorted(signal.pthread_sigmask(signal.SIG_BLOCK, [])), "own_group": os.getpgid(0) == os.getpid(),
    "stdio": [sys.stdout.line_buffering, sys.stdout.write_through, os.readlink("/proc/self/fd/0")],
    "threads": [torch.get_num_threads(), torch.get_num_interop_threads()], "omp": os.environ.get("OMP_NUM_THREADS"),
    "parallel": [line for line in torch.__config__.parallel_info().splitlines() if "max_threads" in line],
    "seed": torch.initial_seed(), "matmul": float((torch.ones(300, 300) @ torch.ones(300, 300))[0, 0]),
}))  # fmt: skip
