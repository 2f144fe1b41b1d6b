"""Two launches on one c10d endpoint, for real: agents, their store, their workers.

A second job with another ``--rdzv-id`` is refused in one line naming both ids while the
first runs on undisturbed; a second launch with the same id but another script
(``--nnodes 1:4``, so it could have been let in) is refused before the running job hears of
it, and one with only other script arguments joins and forms one world with it, as under
torchrun (``--allow-per-node-args``, a no-op now, changes nothing). (The warning of an agent
started without a token: ``test_rdzv_auth``.)
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from phalanx.resources.ports import free_port
from support.launch import PHALANX, wait_for, worker

HANG = 120.0
CONF = "join_timeout=60,last_call_timeout=1"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PHALANX_RDZV_TOKEN"}
    return {**env, **extra}


class Jobs:
    """Launches in the background; each one's session is killed at the end if still running."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.procs: list[subprocess.Popen[str]] = []

    def start(self, name: str, *args: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [*PHALANX, "--log-dir", str(self.tmp / f"{name}.logs"), *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
            start_new_session=True,
        )  # fmt: skip
        self.procs.append(proc)
        return proc

    def rounds(self, name: str) -> list[dict[str, object]]:
        """The ``rdzv_done`` events of launch ``name``."""
        found = []
        for log in (self.tmp / f"{name}.logs").rglob("events.jsonl"):
            for line in log.read_text().splitlines():
                event = json.loads(line)
                if event.get("kind") == "rdzv_done":
                    found.append(event)
        return found

    def kill_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.communicate()


@pytest.fixture
def jobs(tmp_path: Path) -> Iterator[Jobs]:
    started = Jobs(tmp_path)
    try:
        yield started
    finally:
        started.kill_all()


def _c10d(port: int, run_id: str, nnodes: str = "1:2") -> list[str]:
    return ["--nnodes", nnodes, "--nproc-per-node", "1", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", run_id, "--rdzv-conf", CONF]  # fmt: skip


def _work(tmp_path: Path, name: str) -> Path:
    work = tmp_path / name
    work.mkdir()
    return work


def _finish(proc: subprocess.Popen[str]) -> tuple[int, str]:
    _, err = proc.communicate(timeout=HANG)
    return proc.returncode, err


def test_another_run_id_on_a_running_jobs_endpoint_is_refused_and_the_job_finishes(
    jobs: Jobs, tmp_path: Path
) -> None:
    port = free_port()
    first_work, second_work = _work(tmp_path, "x"), _work(tmp_path, "y")
    first = jobs.start("x", *_c10d(port, "job-x"), worker("hold_until_go.py"), str(first_work))
    wait_for(lambda: (first_work / "ready0").exists(), HANG, "job x's worker")
    second = jobs.start("y", *_c10d(port, "job-y"), worker("hold_until_go.py"), str(second_work))
    code, err = _finish(second)
    assert code == 2, err
    last = err.strip().splitlines()[-1]
    assert "'job-x'" in last and "'job-y'" in last and "another job uses this endpoint" in last
    assert not list(second_work.iterdir())  # no worker of job y ever ran
    assert first.poll() is None
    (first_work / "go").touch()
    code, err = _finish(first)
    assert code == 0, err
    assert [event["num_nodes"] for event in jobs.rounds("x")] == [1]  # never re-formed


def test_the_same_run_id_with_another_script_is_refused_before_the_job_hears_of_it(
    jobs: Jobs, tmp_path: Path
) -> None:
    port = free_port()
    first_work, second_work = _work(tmp_path, "x"), _work(tmp_path, "y")
    other = tmp_path / "hold_until_go.py"
    other.write_text(Path(worker("hold_until_go.py")).read_text() + "#\n")  # one byte more
    flags = _c10d(port, "shared", "1:4")
    first = jobs.start("x", *flags, worker("hold_until_go.py"), str(first_work))
    wait_for(lambda: (first_work / "ready0").exists(), HANG, "job x's worker")
    second = jobs.start("y", *flags, str(other), str(second_work))
    code, err = _finish(second)
    assert code == 2, err
    last = err.strip().splitlines()[-1]
    assert "rendezvous 'shared': not joining the running job" in last, err
    assert "this node differs in script: here " in last and "--allow-mismatch" in last, err
    assert not list(second_work.iterdir())
    (first_work / "go").touch()
    code, err = _finish(first)
    assert code == 0, err
    assert [event["num_nodes"] for event in jobs.rounds("x")] == [1]  # never stopped to let it in


@pytest.mark.parametrize("flag", [[], ["--allow-per-node-args"]], ids=["default", "no_op_flag"])
def test_two_launches_with_other_script_arguments_form_one_world(
    jobs: Jobs, tmp_path: Path, flag: list[str]
) -> None:
    port = free_port()
    first_work, second_work = _work(tmp_path, "x"), _work(tmp_path, "y")
    flags = [*_c10d(port, "shared", "1:4"), *flag]
    first = jobs.start("x", *flags, worker("hold_until_go.py"), str(first_work))
    wait_for(lambda: (first_work / "ready0").exists(), HANG, "job x's worker")
    second = jobs.start("y", *flags, worker("hold_until_go.py"), str(second_work))
    wait_for(lambda: (second_work / "ready1").exists(), HANG, "the second node as rank 1")
    (first_work / "go").touch()
    (second_work / "go").touch()
    for proc in (first, second):
        code, err = _finish(proc)
        assert code == 0, err
    assert [event["num_nodes"] for event in jobs.rounds("y")] == [2]
