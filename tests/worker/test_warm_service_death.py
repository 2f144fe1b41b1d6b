"""The warm service's rest (docs/how-to/warm-service.md): ``phalanx.spawn(keep_warm=...)``
forks from the service as ``--keep-warm`` does, and a service SIGKILLed after its workers
forked takes them with it; the launch says so in one line, and the restart forks from a fresh
template. Real launches, real services (the suite's own directory: ``tests/conftest.py``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from phalanx.service.client import ask_all
from support.launch import alive, launched, wait_for
from support.services import end_services, service_pids

HANG = 120.0  # only catches a hang
# Each worker writes OUT/<restart>.<rank> (its pid, its parent); in the first attempt it then
# waits to be killed.
WORKER = """\
import json, os, signal
restart, rank = os.environ["TORCHELASTIC_RESTART_COUNT"], os.environ["RANK"]
with open(os.path.join(os.environ["OUT"], f"{restart}.{rank}.tmp"), "w") as out:
    json.dump({"pid": os.getpid(), "ppid": os.getppid()}, out)
os.replace(os.path.join(os.environ["OUT"], f"{restart}.{rank}.tmp"),
           os.path.join(os.environ["OUT"], f"{restart}.{rank}"))
if restart == "0":
    signal.pause()
"""
SPAWNING = """\
import json, os, sys
import phalanx

def work(local_rank, out):
    with open(os.path.join(out, f"{sys.argv[2]}.{local_rank}"), "w") as mark:
        json.dump({"pid": os.getpid(), "ppid": os.getppid()}, mark)

if __name__ == "__main__":
    phalanx.spawn(work, (sys.argv[1],), num_gpus=2, master_port=0, keep_warm=600,
                  log_dir=os.path.join(sys.argv[1], "logs" + sys.argv[2]))
"""


@pytest.fixture(autouse=True, scope="module")
def no_service_left() -> object:
    yield None
    assert end_services(os.environ) == [], "a service did not end when asked to stop"


def marks(out: Path, prefix: str) -> list[dict[str, int]]:
    return [
        json.loads(p.read_text()) for p in sorted(out.glob(f"{prefix}.*")) if p.suffix != ".tmp"
    ]


def test_spawn_keep_warm_forks_from_the_service(tmp_path: Path) -> None:
    script = tmp_path / "spawning.py"
    script.write_text(SPAWNING)
    out = tmp_path / "out"
    out.mkdir()
    said = []
    for call in ("1", "2"):
        done = subprocess.run([sys.executable, str(script), str(out), call], cwd=tmp_path,
                              capture_output=True, text=True, timeout=HANG)  # fmt: skip
        assert done.returncode == 0, done.stderr
        said.append(done.stderr)
    assert "warm service: workers fork from service pid" in said[0], said[0]
    assert "already warm" in said[1], said[1]
    first, second = marks(out, "1"), marks(out, "2")
    assert len(first) == len(second) == 2
    (service,) = {m["ppid"] for m in first + second}  # both calls' workers: one service
    assert service in service_pids(os.environ)


def test_spawn_refuses_a_bad_keep_warm() -> None:
    import phalanx

    for bad in (-1, float("nan"), float("inf")):
        with pytest.raises(phalanx.UsageError) as caught:
            phalanx.spawn(print, num_gpus=1, keep_warm=bad)
        assert caught.value.problems == [
            f"keep_warm: expected seconds >= 0 (0: no warm service), got {bad!r}"
        ]


def test_a_service_killed_after_its_workers_forked(tmp_path: Path) -> None:
    """Its workers die with it (``PR_SET_PDEATHSIG``); the agent says so once and restarts
    them, within --max-restarts, forked from a fresh template; nothing is left behind."""
    (tmp_path / "job.py").write_text(WORKER)
    out = tmp_path / "out"
    out.mkdir()
    args = ["--keep-warm", "600", "--standalone", "--nproc-per-node", "2", "--max-restarts", "1",
            "--log-dir", str(tmp_path / "logs"), "job.py"]  # fmt: skip
    with launched(args, cwd=tmp_path, env={**os.environ, "OUT": str(out)}) as agent:

        def forked() -> bool:
            assert agent.poll() is None, agent.communicate()
            return len(marks(out, "0")) == 2

        wait_for(forked, HANG, "both workers forked from the service")
        first = marks(out, "0")
        (service,) = {m["ppid"] for m in first}
        assert any(agent.pid in a["agents"] for a in ask_all(os.environ, {"status": 1}))
        os.kill(service, signal.SIGKILL)
        _, stderr = agent.communicate(timeout=HANG)
    assert agent.returncode == 0, stderr
    falls = [line for line in stderr.splitlines() if "warm service unavailable" in line]
    assert len(falls) == 1 and "workers fork from a fresh template" in falls[0], stderr
    assert "killed by SIGKILL (attempt 0)" in stderr, stderr  # the failure: the service's end
    assert "restarting the worker group (restart 1 of 1" in stderr, stderr
    again = marks(out, "1")
    assert len(again) == 2 and service not in {m["ppid"] for m in again}
    # the fresh template's workers (not exec'd by the agent), and it is gone with the run
    (template,) = {m["ppid"] for m in again}
    assert template != agent.pid
    gone = [m["pid"] for m in first + again] + [service, template]
    wait_for(lambda: not any(alive(pid) for pid in gone), HANG, "every process of the job gone")
