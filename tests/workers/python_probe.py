# usage: python_probe.py ARGS... -- prints, as JSON on one line, everything a script can observe
# of how it was started (tests/test_differential.py compares it with plain `python -u`).
import faulthandler
import gc
import json
import os
import resource
import signal
import sys
import threading

import torch


def open_fds() -> dict[int, str]:
    found = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except FileNotFoundError:  # the directory listdir itself had open
            continue
        found[int(name)] = (
            target.split(":")[0] if target.startswith(("pipe:", "socket:")) else target
        )
    return dict(sorted(found.items()))


def proc_status(*names: str) -> dict[str, str]:
    with open("/proc/self/status") as handle:
        fields = dict(line.rstrip("\n").split(":\t", 1) for line in handle if ":\t" in line)
    return {name: fields[name] for name in names}


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:  # a real-time signal
        return f"SIGRT{number - signal.SIGRTMIN}"


main = sys.modules["__main__"]
catchable = sorted(set(signal.valid_signals()) - {signal.SIGKILL, signal.SIGSTOP})
print(json.dumps({
    "argv": sys.argv, "path": sys.path, "file": __file__, "name": __name__, "cwd": os.getcwd(),
    "doc": __doc__, "main_keys": sorted(vars(main)), "main_is_globals": vars(main) is globals(),
    "builtins": type(__builtins__).__name__, "loader": type(__loader__).__name__,
    "spec": type(__spec__).__name__, "package": __package__, "cached": __cached__,
    "orig_argv_tail": sys.orig_argv[1:], "executable": sys.executable,
    "flags": {k: getattr(sys.flags, k) for k in dir(sys.flags) if not k.startswith("_") and k not in ("count", "index")},
    "warnoptions": sys.warnoptions, "xoptions": sys._xoptions,
    "signals": {signal_name(s): repr(signal.getsignal(s)) for s in catchable},
    "mask": sorted(signal.pthread_sigmask(signal.SIG_BLOCK, [])),
    "kernel_signals": proc_status("SigBlk", "SigIgn", "SigCgt", "NoNewPrivs"),
    "faulthandler": faulthandler.is_enabled(), "own_group": os.getpgid(0) == os.getpid(),
    "own_session": os.getsid(0) == os.getpid(),
    "stdio": [[s.line_buffering, s.write_through, s.encoding, s.errors, s.isatty()] for s in (sys.stdin, sys.stdout, sys.stderr)],
    "fds": open_fds(),
    "threads": [torch.get_num_threads(), torch.get_num_interop_threads()], "omp": os.environ.get("OMP_NUM_THREADS"),
    "py_threads": sorted(t.name for t in threading.enumerate()), "native_threads": len(os.listdir("/proc/self/task")),
    "umask": os.umask(0o022), "nice": os.nice(0), "affinity": sorted(os.sched_getaffinity(0)),
    "rlimits": {n: resource.getrlimit(getattr(resource, n)) for n in ("RLIMIT_NOFILE", "RLIMIT_CORE", "RLIMIT_STACK", "RLIMIT_AS")},
    "recursion": sys.getrecursionlimit(), "switch": sys.getswitchinterval(), "trace": repr(sys.gettrace()),
    "profile": repr(sys.getprofile()), "gc": [gc.isenabled(), gc.get_threshold()], "gc_frozen": gc.get_freeze_count() > 0,
    "excepthook": repr(sys.excepthook), "displayhook": repr(sys.displayhook),
    "unraisablehook": repr(sys.unraisablehook), "breakpointhook": repr(sys.breakpointhook),
    "modules_main": type(sys.modules["__main__"]).__name__, "torch_threads_env": os.environ.get("MKL_NUM_THREADS"),
    "env": dict(os.environ),
}))  # fmt: skip
