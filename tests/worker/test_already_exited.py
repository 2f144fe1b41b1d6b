"""A worker that died on its own before phalanx acted on an event is recorded as a failure
of its own, not as "stopped by phalanx": the supervisor looks for exits already pending
before it signals anyone. Driven through ``Supervisor.run`` with a real worker (warm:
forked by a real template; cold: exec'd), whose death the rendezvous poll itself waits for,
so the order is fixed: the worker dies first, the event is acted on after."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import psutil
import pytest

from phalanx.config import LaunchConfig, WorkersConfig
from phalanx.plan import WorkerPlan, build_plan
from phalanx.rendezvous.api import EventKind, JobEvent, NodeInfo, RendezvousResult
from phalanx.resources.ports import free_port
from phalanx.supervisor.group import Launch, Outcome, Supervisor
from phalanx.supervisor.guardian import Guardian
from phalanx.supervisor.process import exec_worker
from phalanx.supervisor.signals import SignalWatcher
from phalanx.supervisor.warm import Template, template_env
from support.launch import alive, wait_for, worker


@pytest.mark.parametrize("warm", [True, False], ids=["warm", "cold"])
def test_a_worker_dead_before_a_peer_failure_is_handled_failed_on_its_own(
    tmp_path: Path, warm: bool
) -> None:
    config = LaunchConfig(
        WorkersConfig(program=worker("exit_when_told.py"), program_args=(str(tmp_path),))
    )
    joined = RendezvousResult(
        run_id="exits", round=0, restart_count=0, node_rank=0,
        nodes=(NodeInfo(0, "localhost", "127.0.0.1", 1),),
        master_addr="127.0.0.1", master_port=free_port(),
    )  # fmt: skip
    plan = build_plan(config, joined, tmp_path / "run", dict(os.environ))
    template = (
        Template.start(template_env(config.workers, os.environ), (), tmp_path / "template.log")
        if warm
        else None
    )
    launch: Launch = template.launch if template else exec_worker
    pids: list[int] = []
    parents: list[int] = []

    def on_tick(running: Sequence[tuple[WorkerPlan, int]]) -> bool:
        pids[:] = [pid for _, pid in running]
        parents[:] = [psutil.Process(pid).ppid() for pid in pids]
        return False

    def poll() -> JobEvent:
        """The worker fails while the agent is busy here (zombie or reaped by the template),
        then another node's failure is heard."""
        (tmp_path / "go").touch()
        wait_for(lambda: not alive(pids[0]), 30, "the worker to exit")
        return JobEvent(EventKind.PEER_FAILED, node_rank=1)

    guardian = Guardian()
    try:
        supervisor = Supervisor(
            guardian, shutdown_timeout=5.0, monitor_interval=0.1, launch=launch,
            host="here",
        )  # fmt: skip
        with SignalWatcher(("SIGTERM",)) as signals:
            result = supervisor.run(plan, signals, poll, on_tick)
    finally:
        guardian.close()
        if template is not None:
            template.close()
    # Warm: forked by the template (which reaps it); cold: the agent's own child.
    assert parents == [template.pid if template else os.getpid()]
    assert result.outcome is Outcome.FAILED, result
    (exit_,) = result.exits
    assert (exit_.returncode, exit_.stopped_by_launcher, exit_.failed) == (3, False, True)
