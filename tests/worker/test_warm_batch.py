"""A round's workers are forked from one request (``phalanx.worker.batch``), by the per-run
template and by the warm service alike: each rank still gets its own environment, its own
output pipes and nothing of its siblings'; a fork that fails in the middle of a batch (a real
``pids.max``) fails that rank, and the ranks forked before it are stopped with the round."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
from collections.abc import Iterator, Sequence
from pathlib import Path

import psutil
import pytest

from phalanx.config import LaunchConfig, WorkersConfig
from phalanx.plan import WorkerPlan, build_plan
from phalanx.rendezvous.api import NodeInfo, RendezvousResult
from phalanx.resources.limits import StartFailed
from phalanx.resources.ports import free_port
from phalanx.supervisor import warm
from phalanx.supervisor.group import Supervisor
from phalanx.supervisor.guardian import Guardian
from phalanx.supervisor.signals import SignalWatcher
from phalanx.supervisor.start import Started
from phalanx.supervisor.warm import Template, template_env
from support.launch import alive, run_phalanx, wait_for, worker
from support.services import end_services

HANG = 120.0  # only catches a hang
RANKS = 3
PIDS_ROOT = Path("/sys/fs/cgroup/pids")


@pytest.fixture(autouse=True, scope="module")
def no_service_left() -> Iterator[None]:
    yield None
    assert end_services(os.environ) == [], "a service did not end when asked to stop"


@pytest.mark.parametrize("where", ["template", "service"])
def test_each_rank_of_a_batch_has_its_own_env_and_pipes_and_none_of_its_siblings(
    tmp_path: Path, where: str
) -> None:
    args = ["--keep-warm", "600"] if where == "service" else []
    result = run_phalanx(
        [*args, "--nproc-per-node", str(RANKS), "--log-dir", str(tmp_path / "logs"),
         worker("batch_probe.py")],
        cwd=tmp_path, env={**os.environ, "PROBE_MARK": where}, timeout=HANG,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "warm start unavailable" not in result.stderr, result.stderr
    seen = [json.loads(line.split("]: ", 1)[1]) for line in result.stdout.splitlines()]
    assert sorted(w["local_rank"] for w in seen) == [str(r) for r in range(RANKS)]
    assert all(w["rank"] == w["local_rank"] for w in seen)
    assert {w["mark"] for w in seen} == {where} and {w["cwd"] for w in seen} == {str(tmp_path)}
    (parent,) = {w["ppid"] for w in seen}  # all forked by one template (or service)
    assert parent not in (w["pid"] for w in seen)
    # The same descriptors in every rank: stdin, its own two output pipes, and no sibling's
    # pipe end or pidfd (python's own, if any, are the same in each).
    assert len({tuple(sorted(w["fds"])) for w in seen}) == 1, [w["fds"] for w in seen]
    for w in seen:
        pipes = sorted(fd for fd, what in w["fds"].items() if what.startswith("pipe:"))
        assert pipes == ["1", "2"], w["fds"]
        assert not any("pidfd" in what for what in w["fds"].values()), w["fds"]
    outputs = [w["fds"][fd] for w in seen for fd in ("1", "2")]
    assert len(set(outputs)) == 2 * RANKS  # no two ranks share an output pipe


@contextlib.contextmanager
def _pids_cgroup(limit: int) -> Iterator[Path]:
    """A v1 ``pids`` cgroup of this test's own with ``pids.max`` = ``limit``, removed after."""
    if not os.access(PIDS_ROOT, os.W_OK):
        pytest.skip(f"no writable v1 pids hierarchy at {PIDS_ROOT}")
    group = PIDS_ROOT / f"phalanx-test-batch-{os.getpid()}"
    group.mkdir()
    try:
        (group / "pids.max").write_text(f"{limit}\n")
        yield group
    finally:
        wait_for(lambda: not (group / "cgroup.procs").read_text().split(), HANG, "it emptied")
        group.rmdir()


def _one_node(run_id: str, workers: int) -> RendezvousResult:
    """Round 0 of a job of this node alone, with ``workers`` local ranks."""
    return RendezvousResult(
        run_id=run_id, round=0, restart_count=0, node_rank=0,
        nodes=(NodeInfo(0, "localhost", "127.0.0.1", workers),),
        master_addr="127.0.0.1", master_port=free_port(),
    )  # fmt: skip


def test_a_fork_failing_in_a_batch_fails_that_rank_and_the_ranks_before_it_are_stopped(
    tmp_path: Path,
) -> None:
    config = LaunchConfig(WorkersConfig(program=worker("batch_probe.py"), nproc_per_node=4))
    joined = _one_node("batch", 4)
    env = {**os.environ, "PROBE_WAIT": "1"}  # the ranks forked stay until stopped
    plan = build_plan(config, joined, tmp_path / "run", env)
    started: Started = []
    with _pids_cgroup(3) as group:  # the template and 2 workers: rank 2's fork fails
        template = Template.start(
            template_env(config.workers, env), (), tmp_path / "template.log", imports=()
        )
        guardian = Guardian()
        try:
            (group / "cgroup.procs").write_text(f"{template.pid}\n")

            def launch_all(workers: Sequence[WorkerPlan]) -> Started:
                started.extend(template.launch_all(workers))
                return started

            supervisor = Supervisor(
                guardian, shutdown_timeout=5.0, monitor_interval=0.1, launch_all=launch_all
            )
            with SignalWatcher(("SIGTERM",)) as signals, pytest.raises(StartFailed) as failed:
                supervisor.run(plan, signals)
            forked = [s for s in started if not isinstance(s, BaseException)]
            # Stopped as the round ended, while the template (whose death would end them
            # too) still runs.
            assert forked and not any(alive(w.pid) for w in forked)
        finally:
            guardian.close()
            template.close()
    assert str(failed.value).startswith("cannot start rank 2: cannot create another process")
    assert len(forked) == 2 and len(started) == 3, started  # rank 3 was not tried


def test_a_single_fork_that_fails_raises_the_limit(tmp_path: Path) -> None:
    """``Template.launch`` (one worker: one request of one) names the limit as the batch does."""
    config = LaunchConfig(WorkersConfig(program=worker("batch_probe.py")))
    joined = _one_node("one", 1)
    plan = build_plan(config, joined, tmp_path / "run", dict(os.environ))
    with _pids_cgroup(1) as group:  # the template alone: no fork fits
        template = Template.start(
            template_env(config.workers, os.environ), (), tmp_path / "template.log", imports=()
        )
        try:
            (group / "cgroup.procs").write_text(f"{template.pid}\n")
            with pytest.raises(OSError) as failed:
                template.launch(plan.workers[0])
        finally:
            template.close()
    assert failed.value.errno == errno.EAGAIN


def test_a_template_that_does_not_answer_is_ended_and_the_workers_start_cold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stalled template (SIGSTOP, after it said ready) gets the round's request and never
    answers: the launch says so, starts the workers cold, and the template is killed, so
    nothing it might still fork runs beside them."""
    monkeypatch.setattr(warm, "REPLY_TIMEOUT", 1.0)  # 30 s in a launch
    config = LaunchConfig(WorkersConfig(program=worker("batch_probe.py"), nproc_per_node=2))
    joined = _one_node("stalled", 2)
    env = {**os.environ, "PROBE_WAIT": "1"}
    plan = build_plan(config, joined, tmp_path / "run", env)
    log_path = tmp_path / "template.log"
    template = Template.start(template_env(config.workers, env), (), log_path, imports=())
    started: Started = []
    try:
        wait_for(lambda: "imported" in log_path.read_text(), HANG, "the template's ready")
        os.kill(template.pid, signal.SIGSTOP)
        started = template.launch_all(plan.workers)
        assert len(started) == 2 and not any(isinstance(s, BaseException) for s in started)
        assert all(psutil.Process(s.pid).ppid() == os.getpid() for s in started)  # cold
        wait_for(lambda: not alive(template.pid), HANG, "the stalled template to be killed")
    finally:
        for each in started:
            if not isinstance(each, BaseException):
                os.killpg(each.pid, signal.SIGKILL)
                each.reap()
                each.close()
        template.close()
