"""``python fork_stop.py N -- LAUNCHER_ARGV...``: the launcher's stop reaches its warm workers
at the moment they are forked, deterministically; print how the launcher ended (JSON).

The race this reproduces: the template ignores the stop signals (SIGTERM, SIGINT, ...) and a
worker it forks gets its own dispositions back only in ``become``; a SIGTERM that reaches
the worker in between -- the agent's, sent the moment it has the pid -- must not be lost.
To make it happen every time, this program runs the launcher under ``ptrace`` with fork
events on, so the template and every process it forks start traced:

1. each worker the template forks is held at its first stop, before it has run an
   instruction of its own (its disposition for SIGTERM is still the template's);
2. once ``N`` are held, the launcher gets SIGTERM (what ``phalanx stop`` or a scheduler
   sends) and stops its workers: its SIGTERM to each worker's process group stays queued
   while the worker is held (a traced process's signals are never dropped when sent);
3. once every held worker has it pending, they are let go (detached): each meets the
   SIGTERM with the disposition and signal mask the fork gave it.

Every other process (the guardian, anything exec'd but the template) is let go at its exec.
Prints ``{"launcher": exit code, "held": [pid, ...]}``. Every wait is bounded (``DEADLINE``).
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time

PTRACE_TRACEME, PTRACE_CONT, PTRACE_DETACH, PTRACE_SETOPTIONS = 0, 7, 17, 0x4200
PTRACE_O_TRACEFORK, PTRACE_O_TRACEVFORK, PTRACE_O_TRACEEXEC = 0x2, 0x4, 0x10
PTRACE_O_EXITKILL = 0x100000  # if this program dies, its tracees die with it
OPTIONS = PTRACE_O_TRACEFORK | PTRACE_O_TRACEVFORK | PTRACE_O_TRACEEXEC | PTRACE_O_EXITKILL
PTRACE_EVENT_EXEC = 4
WALL = 0x40000000
DEADLINE = 150  # seconds for the whole scenario: start-up, rendezvous, imports, the stop
TEMPLATE = b"phalanx.worker.template"
SIGTERM_BIT = 1 << (signal.SIGTERM - 1)

libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
libc.ptrace.restype = ctypes.c_long


def ptrace(request: int, pid: int, data: int = 0) -> None:
    if libc.ptrace(request, pid, None, ctypes.c_void_p(data)) == -1:
        err = ctypes.get_errno()
        raise OSError(err, f"ptrace({request}, {pid}): {os.strerror(err)}")


def traceme() -> None:
    ptrace(PTRACE_TRACEME, 0)


def status_fields(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as handle:
        return dict(line.split(":\t", 1) for line in handle.read().splitlines() if ":\t" in line)


def sigterm_pending(pid: int) -> bool:
    fields = status_fields(pid)
    return bool((int(fields["ShdPnd"], 16) | int(fields["SigPnd"], 16)) & SIGTERM_BIT)


def on_alarm(signum: int, frame: object) -> None:
    raise TimeoutError(f"the scenario did not end within {DEADLINE} s")


def run(count: int, argv: list[str]) -> dict[str, object]:
    launcher = subprocess.Popen(
        argv, preexec_fn=traceme, start_new_session=True, stdout=sys.stderr, stderr=sys.stderr
    )
    try:
        return follow(launcher, count)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)


def follow(launcher: subprocess.Popen[bytes], count: int) -> dict[str, object]:
    _, status = os.waitpid(launcher.pid, WALL)  # the SIGTRAP stop at its exec
    assert os.WIFSTOPPED(status), status
    ptrace(PTRACE_SETOPTIONS, launcher.pid, OPTIONS)
    ptrace(PTRACE_CONT, launcher.pid)
    template: int | None = None
    known = {launcher.pid}
    held: list[int] = []
    all_held: list[int] = []
    stopping = False
    while True:
        if len(all_held) == count and not stopping:
            stopping = True
            os.kill(launcher.pid, signal.SIGTERM)
        if stopping and held and all(sigterm_pending(pid) for pid in held):
            for pid in held:
                ptrace(PTRACE_DETACH, pid)  # the first stop's SIGSTOP is dropped
            held = []
        # While workers are held, poll: their pending signal is what is waited for.
        pid, status = os.waitpid(-1, WALL | (os.WNOHANG if stopping and held else 0))
        if pid == 0:
            time.sleep(0.01)
            continue
        if pid == launcher.pid and not os.WIFSTOPPED(status):
            launcher.returncode = os.waitstatus_to_exitcode(status)
            return {"launcher": launcher.returncode, "held": all_held}
        if not os.WIFSTOPPED(status):
            continue
        sig, event = os.WSTOPSIG(status), status >> 16
        if event == PTRACE_EVENT_EXEC:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                if TEMPLATE in handle.read():
                    template = pid
                    ptrace(PTRACE_CONT, pid)
                else:
                    ptrace(PTRACE_DETACH, pid)  # the guardian, a cold worker: not followed
        elif event:
            ptrace(PTRACE_CONT, pid)  # a fork event, in the parent
        elif pid not in known:  # a new child's first stop (SIGSTOP)
            known.add(pid)
            if template is not None and int(status_fields(pid)["PPid"]) == template:
                held.append(pid)
                all_held.append(pid)
            else:
                ptrace(PTRACE_CONT, pid)
        else:
            ptrace(PTRACE_CONT, pid, sig)  # a signal for the launcher or template: pass it on


if __name__ == "__main__":
    args = sys.argv[1:]
    signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(DEADLINE)
    print(json.dumps(run(int(args[0]), args[args.index("--") + 1 :])), flush=True)
