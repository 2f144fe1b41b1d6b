"""``python fork_race.py -- LAUNCHER_ARGV...``: kill the launcher between a worker's fork and
its ``prctl(PR_SET_PDEATHSIG)``, deterministically, and print what the child did (JSON).

The race ``die_with_parent`` closes: a launcher that dies after ``fork`` but before the child
asked for its death signal would leave a child that never gets one. To make it happen every
time, this program runs the launcher under ``ptrace`` (it is the tracer and, as
``PR_SET_CHILD_SUBREAPER``, the parent every orphan of the launcher is handed to):

1. the launcher starts traced (``PTRACE_TRACEME`` before its exec) with fork events on, so
   each child it forks starts traced and stopped;
2. each such child runs from syscall stop to syscall stop; one that execs (the guardian) is
   let go; the first that enters ``prctl(PR_SET_PDEATHSIG, ...)`` is held there;
3. the launcher is SIGKILLed and reaped (so the child has been reparented to us), then the
   child is let go: its ``prctl`` now runs after its parent died.

The child should then see that its parent is gone and exit 1 before it execs the worker.
Prints ``{"launcher": status, "child": pid, "child_exit": code or null, "why": ...}``;
a child still alive after ``CHILD_WAIT`` s is SIGKILLed (with its group) and reported as null.
Only x86_64 and aarch64 syscall numbers are known. Every wait is bounded.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import time

PTRACE_TRACEME, PTRACE_CONT, PTRACE_DETACH, PTRACE_SYSCALL = 0, 7, 17, 24
PTRACE_SETOPTIONS = 0x4200
PTRACE_O_TRACESYSGOOD, PTRACE_O_TRACEFORK, PTRACE_O_TRACEVFORK = 0x1, 0x2, 0x4
PTRACE_O_TRACEEXEC = 0x10
PTRACE_O_EXITKILL = 0x100000  # if this program dies, its tracees die with it
OPTIONS = (PTRACE_O_TRACESYSGOOD | PTRACE_O_TRACEFORK | PTRACE_O_TRACEVFORK | PTRACE_O_TRACEEXEC
           | PTRACE_O_EXITKILL)  # fmt: skip
WALL = 0x40000000
PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER = 1, 36
SYSCALLS = {
    "x86_64": {157: "prctl", 59: "execve", 110: "getppid", 231: "exit_group", 60: "exit"},
    "aarch64": {167: "prctl", 221: "execve", 173: "getppid", 94: "exit_group", 93: "exit"},
}
DEADLINE = 120  # seconds for the whole scenario: the launcher's start-up and rendezvous
TEMPLATE = b"phalanx.worker.template"  # traced on through its exec: it forks the warm workers

libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
libc.ptrace.restype = ctypes.c_long
NAMES = SYSCALLS[os.uname().machine]


def ptrace(request: int, pid: int, data: int = 0) -> None:
    if libc.ptrace(request, pid, None, ctypes.c_void_p(data)) == -1:
        err = ctypes.get_errno()
        raise OSError(err, f"ptrace({request}, {pid}): {os.strerror(err)}")


def syscall_of(pid: int) -> tuple[str, list[int]]:
    """The name (or number) and arguments of the syscall ``pid`` is stopped in."""
    with open(f"/proc/{pid}/syscall") as handle:
        fields = handle.read().split()
    return NAMES.get(int(fields[0]), fields[0]), [int(f, 16) for f in fields[1:7]]


def exec_argv(pid: int, argv_address: int) -> bytes:
    """The first arguments an ``execve`` entry passes (read from the tracee's memory)."""
    words = []
    mem = os.open(f"/proc/{pid}/mem", os.O_RDONLY)  # unbuffered: a read-ahead may hit a hole
    try:
        for i in range(8):
            pointer = int.from_bytes(os.pread(mem, 8, argv_address + 8 * i), sys.byteorder)
            if pointer == 0:
                break
            # One byte at a time up to the NUL: the string may end right before a hole.
            word = b""
            while len(word) < 256 and (byte := os.pread(mem, 1, pointer + len(word))) != b"\0":
                word += byte
            words.append(word)
    finally:
        os.close(mem)
    return b" ".join(words)


def traceme() -> None:
    ptrace(PTRACE_TRACEME, 0)


def on_alarm(signum: int, frame: object) -> None:
    raise TimeoutError(f"no prctl(PR_SET_PDEATHSIG) in a child within {DEADLINE} s")


def main(argv: list[str]) -> dict[str, object]:
    signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(DEADLINE)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    launcher = subprocess.Popen(argv, preexec_fn=traceme, start_new_session=True)
    _, status = os.waitpid(launcher.pid, WALL)  # the SIGTRAP stop at its exec
    assert os.WIFSTOPPED(status), status
    ptrace(PTRACE_SETOPTIONS, launcher.pid, OPTIONS)
    ptrace(PTRACE_CONT, launcher.pid)
    children: set[int] = set()
    inside: set[int] = set()  # children stopped at a syscall's entry, not yet at its exit
    while True:
        pid, status = os.waitpid(-1, WALL)
        if not os.WIFSTOPPED(status):
            if pid == launcher.pid:
                raise RuntimeError(f"the launcher ended (status {status}) before the race")
            continue
        sig, event = os.WSTOPSIG(status), status >> 16
        if pid == launcher.pid:
            # A fork event, or a signal for the launcher: pass the signal on.
            ptrace(PTRACE_CONT, pid, 0 if event or sig == signal.SIGTRAP else sig)
        elif sig == signal.SIGTRAP | 0x80 and pid in inside:
            inside.discard(pid)  # a syscall's exit: nothing to look at
            ptrace(PTRACE_SYSCALL, pid)
        elif sig == signal.SIGTRAP | 0x80:
            inside.add(pid)
            name, args = syscall_of(pid)
            if name == "prctl" and args[0] == PR_SET_PDEATHSIG:
                return _race(launcher, pid)
            if name == "execve" and TEMPLATE not in exec_argv(pid, args[1]):
                children.discard(pid)
                ptrace(PTRACE_DETACH, pid)  # not a worker nor the template (the guardian)
            else:
                ptrace(PTRACE_SYSCALL, pid)
        else:
            # A new child's first stop (SIGSTOP), an exec event, or a signal sent to it.
            first_stop = pid not in children
            children.add(pid)
            ptrace(PTRACE_SYSCALL, pid, 0 if first_stop or event else sig)


def _race(launcher: subprocess.Popen[bytes], child: int) -> dict[str, object]:
    """``child`` is stopped entering ``prctl(PR_SET_PDEATHSIG)``: kill its parent, the
    launcher, then follow the child's syscalls to its end."""
    with open(f"/proc/{child}/cmdline", "rb") as handle:
        cmdline = handle.read().replace(b"\0", b" ").decode(errors="replace").strip()
    # The guardian first: its cleanup (process groups, the job's cgroup) would end the held
    # child itself, and this checks the child's own race check alone.
    for other in _children(launcher.pid):
        with contextlib.suppress(OSError), open(f"/proc/{other}/cmdline", "rb") as handle:
            if handle.read().split(b"\0")[1:3] == [b"-I", b"-S"]:
                os.kill(other, signal.SIGKILL)
    os.kill(launcher.pid, signal.SIGKILL)
    while True:  # a stop reported before the kill may come first
        _, launcher_status = os.waitpid(launcher.pid, WALL)
        if not os.WIFSTOPPED(launcher_status):
            break  # reaped: the child has been handed to us
    launcher.returncode = -signal.SIGKILL  # reaped above; Popen must not wait for it again
    after: list[str] = []  # the syscalls the child enters after its prctl
    entering = False  # the next stop is prctl's own exit
    ptrace(PTRACE_SYSCALL, child)
    while True:
        pid, status = os.waitpid(-1, WALL)
        if pid != child:
            if os.WIFSTOPPED(status):  # another tracee (the guardian, exiting): let it go
                with contextlib.suppress(OSError):
                    ptrace(PTRACE_DETACH, pid)
            continue
        if not os.WIFSTOPPED(status):
            return {"launcher": launcher_status, "cmdline": cmdline, "syscalls": after,
                    "exit": os.waitstatus_to_exitcode(status)}  # fmt: skip
        if os.WSTOPSIG(status) == signal.SIGTRAP | 0x80:
            if entering:
                after.append(syscall_of(child)[0])
            entering = not entering
        if len(after) > 50 or "execve" in after:  # it went on to run the worker: stop it
            os.kill(child, signal.SIGKILL)  # (its death is the next status: the loop ends)
            continue
        ptrace(PTRACE_SYSCALL, child)


def _children(pid: int) -> list[int]:
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as handle:
                found += [int(c) for c in handle.read().split()]
    return found


def _reap_orphans() -> None:
    """Reap what the launcher left to us (the guardian exits once the launcher's pipe closes)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, WALL | os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            time.sleep(0.01)


if __name__ == "__main__":
    args = sys.argv[1:]
    result = main(args[args.index("--") + 1 :])
    _reap_orphans()
    print(json.dumps(result), flush=True)
