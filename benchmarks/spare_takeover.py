"""A member node lost, and how soon the job is back: ``python benchmarks/spare_takeover.py``.

Three real agents on loopback (c10d, ``--nnodes 2:2``, one Gloo worker each). Once the first
round runs, the member agent that does not host the store is SIGKILLed with its worker. Two
variants, side by side in one run, alternating which goes first, ``--reps`` times:

- ``spare``: a third agent was started beforehand and waits beyond MAX (a hot spare);
- ``cold``: no spare; a replacement agent is started the moment the member is lost (what a
  job without spares needs: someone or something starts one).

Measured: from the SIGKILL to every rank of the next round past its first all-reduce (each
rank writes a file stamped with ``time.time()`` after it). The agents start workers as
phalanx does by default (forked from a warm template: a waiting spare has its template
ready, so its worker does not import torch after the loss); ``--cold-start`` passes the
flag on, and every worker of the new round then imports torch itself (about 2 s here). Goal: the spare variant within
the detection timeout (``heartbeat_timeout``) plus 2 s. Prints the medians and their ratio.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HEARTBEAT_TIMEOUT = 4.0
CONF = (
    f"heartbeat_interval=0.5,heartbeat_timeout={HEARTBEAT_TIMEOUT:g},last_call_timeout=1,"
    "join_timeout=120,exit_barrier_timeout=30"
)
WORKER = """
import os, sys, time
from pathlib import Path
out = Path(sys.argv[1])
if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
    (out / f"up.{os.environ['RANK']}").touch()
    time.sleep(600)
import torch, torch.distributed as dist
dist.init_process_group("gloo")
dist.all_reduce(torch.ones(1))
(out / f"past.{os.environ['RANK']}").write_text(repr(time.time()))
dist.destroy_process_group()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(predicate: object, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise TimeoutError("the job did not get there in time")
        time.sleep(0.02)


def _once(variant: str, folder: Path, cold: bool) -> float:
    folder.mkdir()
    script = folder / "worker.py"
    script.write_text(WORKER)
    port = _free_port()
    argv = [sys.executable, "-m", "phalanx", "--nnodes", "2:2", "--nproc-per-node", "1",
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id",
            variant, "--rdzv-conf", CONF, "--max-restarts", "1",
            *(["--cold-start"] if cold else []), str(script), str(folder)]  # fmt: skip
    procs: list[subprocess.Popen[bytes]] = []

    def start(name: str) -> None:
        with open(folder / f"{name}.err", "wb") as err:
            procs.append(
                subprocess.Popen(
                    [*argv[:3], "--log-dir", str(folder / name), *argv[3:]],
                    stdout=subprocess.DEVNULL, stderr=err, start_new_session=True,
                )
            )  # fmt: skip

    try:
        start("n0")
        start("n1")
        _wait(lambda: (folder / "up.0").exists() and (folder / "up.1").exists(), 120)
        if variant == "spare":
            start("spare")
            _wait(lambda: b"running without this node" in (folder / "spare.err").read_bytes(), 60)
        lost = time.time()
        # On loopback either agent may host the store: lose the other one (a client).
        client = b"connecting as a client" in (folder / "n1.err").read_bytes()
        os.killpg(procs[1 if client else 0].pid, signal.SIGKILL)
        if variant == "cold":
            start("replacement")
        _wait(lambda: (folder / "past.0").exists() and (folder / "past.1").exists(), 180)
        return max(float((folder / f"past.{r}").read_text()) for r in (0, 1)) - lost
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--cold-start", action="store_true", help="pass --cold-start to phalanx")
    args = parser.parse_args()
    reps = args.reps
    seconds: dict[str, list[float]] = {"spare": [], "cold": []}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(reps):
            order = ["spare", "cold"] if rep % 2 == 0 else ["cold", "spare"]
            for variant in order:
                took = _once(variant, Path(tmp) / f"{variant}{rep}", args.cold_start)
                seconds[variant].append(took)
                print(
                    f"{variant}: {took:.2f} s from the loss to every rank past the first collective"
                )
    spare, cold = (statistics.median(seconds[v]) for v in ("spare", "cold"))
    goal = HEARTBEAT_TIMEOUT + 2
    print(f"median: spare {spare:.2f} s, cold {cold:.2f} s, spare/cold {spare / cold:.2f}")
    print(
        f"goal: spare <= heartbeat_timeout + 2 s = {goal:g} s: {'met' if spare <= goal else 'NOT met'}"
    )


if __name__ == "__main__":
    main()
