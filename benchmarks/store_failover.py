"""Time from the loss of a node to training again, the c10d store's host beside a node that
does not host it (issue 40): three agents at ``--nnodes 2:3``, each in a network namespace
of its own (``tests/support/netns.py``), one worker each running the checkpointing trainer
of ``tests/workers/failover_train.py``; once all three train, one node's agent and every
process under it are SIGKILLed (node 0, the store's host: the others fail over; or node 2:
the others re-form on the same store), or node 0's are frozen (SIGSTOP; SIGCONT once the
others finished). A SIGKILLed host's kernel resets its connections: the loss is seen at once;
a frozen one is seen after ``heartbeat_timeout``; node 2's guardian is SIGKILLed with it, so
nobody says its last word and its loss also waits out ``heartbeat_timeout``. The figure: the kill -> the first step of the next
attempt (rank 0's wall-clock stamp; namespaces share the clock). Goal for the store's host:
at most ``heartbeat_timeout`` + 5 s.

    python benchmarks/store_failover.py [--reps 3] [--heartbeat-timeout 4]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.support
from tests.support.netns import NetNamespaces, unavailable_reason  # noqa: E402

TRAINER = ROOT / "tests" / "workers" / "failover_train.py"
STEPS = 60
PORT = 29400
TIMEOUT = 300.0


def _conf(heartbeat_timeout: float) -> str:
    return (
        f"heartbeat_interval=0.5,heartbeat_timeout={heartbeat_timeout:g},last_call_timeout=5,"
        "join_timeout=60,exit_barrier_timeout=30"
    )


def _steps(out: Path, restart: int) -> list[tuple[int, int, float]]:
    """Rank 0's lines for ``restart``: (step, world size, wall-clock time)."""
    path = out / f"steps-{restart}"
    found = []
    for line in path.read_text().splitlines() if path.exists() else []:
        step, world, when = line.split()
        found.append((int(step), int(world.split("=")[1]), float(when.split("=")[1])))
    return found


def _signal_tree(pid: int, signum: int) -> None:
    procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.send_signal(signum)


def once(spaces: NetNamespaces, victim: int, heartbeat_timeout: float, freeze: bool) -> float:
    """One run: the seconds from ``victim``'s SIGKILL (``freeze``: SIGSTOP, and SIGCONT once
    the others finished) to the first step after it."""
    scratch = Path(tempfile.mkdtemp(prefix=f"bench-failover-{victim}-"))
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "eth0"}
    procs = []
    try:
        for i in range(3):
            argv = [sys.executable, "-m", "phalanx", "--nnodes", "2:3", "--nproc-per-node", "1",
                    "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{spaces.addr(0)}:{PORT}",
                    "--rdzv-id", "bench", "--rdzv-conf", _conf(heartbeat_timeout),
                    "--max-restarts", "2", "--local-addr", spaces.addr(i),
                    "--log-dir", str(scratch / f"logs{i}"), str(TRAINER), str(scratch), str(STEPS)]  # fmt: skip
            with open(scratch / f"n{i}.err", "wb") as err:
                procs.append(subprocess.Popen(spaces.command(i, argv), stdout=subprocess.DEVNULL,
                                              stderr=err, env=env, start_new_session=True))  # fmt: skip
        deadline = time.monotonic() + TIMEOUT
        while sum(w == 3 for _, w, _ in _steps(scratch, 0)) < 6:
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                raise RuntimeError(f"the job did not train on 3 nodes; see {scratch}")
            time.sleep(0.1)
        killed = time.time()
        _signal_tree(procs[victim].pid, signal.SIGSTOP if freeze else signal.SIGKILL)
        codes = [p.wait(TIMEOUT) for i, p in enumerate(procs) if i != victim]
        if freeze:  # it comes back, finds the store moved, and stops
            _signal_tree(procs[victim].pid, signal.SIGCONT)
            procs[victim].wait(TIMEOUT)
        again = _steps(scratch, 1)
        if any(codes) or not again:
            raise RuntimeError(f"exit codes {codes}, no step after the kill; see {scratch}")
        seconds = again[0][2] - killed
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 9)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
    shutil.rmtree(scratch, ignore_errors=True)
    return seconds


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--heartbeat-timeout", type=float, default=4.0)
    args = parser.parse_args(argv)
    if (why := unavailable_reason()) is not None:
        print(f"not measured: {why}")
        return 1
    spaces = NetNamespaces(3)
    spaces.create()
    cases = {"store's host SIGKILLed": (0, False), "store's host frozen": (0, True),
             "another node SIGKILLed": (2, False)}  # fmt: skip
    samples: dict[str, list[float]] = {name: [] for name in cases}
    try:
        for _ in range(args.reps):
            for name, (victim, freeze) in cases.items():
                samples[name].append(once(spaces, victim, args.heartbeat_timeout, freeze))
                print(f"{name}: {samples[name][-1]:.2f} s", file=sys.stderr, flush=True)
    finally:
        spaces.destroy()
    goal = args.heartbeat_timeout + 5
    print(f"| node lost (heartbeat_timeout={args.heartbeat_timeout:g} s, {args.reps} runs) "
          "| median | max | runs (s) |")  # fmt: skip
    print("|---|---|---|---|")
    for name, got in samples.items():
        runs = ", ".join(f"{s:.2f}" for s in got)
        print(f"| {name} | {statistics.median(got):.2f} s | {max(got):.2f} s | {runs} |")
    print(f"goal for the store's host: at most {goal:g} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
