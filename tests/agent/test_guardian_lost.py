"""A guardian that dies before its agent (the OOM killer, an admin's ``kill``, a crash): the
agent starts a new one, says so once (stderr and a ``guardian_lost`` event), and the job
goes on as if nothing happened (``phalanx.supervisor.guardian``).

Real agents, real workers; the fault is a SIGKILL of the real guardian process. One node:
the workers fail once after it and are restarted, the job exits 0 with its report. The replacement does the
first one's job: the agent SIGKILLed afterwards leaves no worker nor worker's child, and
its cgroup is removed. Two nodes (c10d on loopback): one node's guardian killed, then a
worker failure with ``--max-restarts 1``: the restart happens and the job finishes 0.
(``tests/agent/test_last_word.py`` shows the replacement also says the dead agent's last word.)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from phalanx.events import read_events
from phalanx.events.log import EVENTS_FILE
from phalanx.resources.ports import free_port
from phalanx.supervisor.cgroup import hierarchies
from support.hosts import Loopback, Node
from support.launch import PHALANX, alive, launched, read_pids, wait_for, worker

HANG = 90.0  # only catches a hang
GONE_WAIT = 10.0  # SIGKILL delivery takes milliseconds
REPLACED = "a new one (pid "


def guardians(agent: int) -> list[psutil.Process]:
    """The agent's live guardians (its children run as ``python -I -S -c``)."""
    found = []
    for child in psutil.Process(agent).children():
        try:
            if child.cmdline()[1:3] == ["-I", "-S"] and alive(child.pid):
                found.append(child)
        except psutil.Error:  # one that just died
            pass
    return found


def guardian_of(agent: int) -> psutil.Process:
    (guardian,) = guardians(agent)
    return guardian


def kill_guardian(agent: int) -> int:
    """SIGKILL the agent's guardian; its pid, once it is gone."""
    guardian = guardian_of(agent)
    guardian.kill()
    wait_for(lambda: not alive(guardian.pid), GONE_WAIT, "the guardian to die")
    return guardian.pid


def lost_events(run_dir: Path) -> list[dict[str, object]]:
    return [e for e in read_events(run_dir / EVENTS_FILE) if e["kind"] == "guardian_lost"]


@pytest.fixture
def leftovers() -> Iterator[list[int]]:
    """Pids a test started indirectly; any still alive afterwards is SIGKILLed."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_one_node_finishes_after_its_guardian_is_killed(tmp_path: Path) -> None:
    """The guardian killed, then the workers fail once and are restarted (the agent forgets
    their groups, then watches the new ones): today, ``BrokenPipeError`` at the first of
    these, exit 1, no report. Now the restart runs and the job ends 0 with its report."""
    marks, logs = tmp_path / "marks", tmp_path / "logs"
    marks.mkdir()
    args = ["--nproc-per-node", "2", "--max-restarts", "1", "--log-dir", str(logs),
            worker("fail_once_when_told.py"), str(marks)]  # fmt: skip
    with launched(args) as launcher:
        wait_for((marks / "ready.0.0").exists, HANG, "the workers")
        killed = kill_guardian(launcher.pid)
        (marks / "go").touch()  # the workers fail now
        out, err = launcher.communicate(timeout=HANG)
    assert launcher.returncode == 0, err
    assert out.count("world=2 restart=1") == 2, out
    assert "Traceback" not in err, err
    said = [line for line in err.splitlines() if f"the guardian (pid {killed})" in line]
    assert len(said) == 1, err
    (run_dir,) = logs.iterdir()
    report = json.loads((run_dir / "report.json").read_text())
    assert (report["outcome"], report["attempts"]) == ("succeeded", 2), report
    (event,) = lost_events(run_dir)
    assert (event["pid"], event["ended"]) == (killed, "killed by SIGKILL")
    assert isinstance(event["replacement"], int) and f"{REPLACED}{event['replacement']})" in err


def test_the_new_guardian_ends_the_workers_when_the_agent_is_killed(
    tmp_path: Path, leftovers: list[int]
) -> None:
    """As ``test_teardown``'s guardian-alone test, after a replacement: the workers clear
    their death signal and each starts a child, the template is frozen so its own cleanup
    cannot do the work -- only the new guardian can end them, and remove the cgroup."""
    out, logs, err_path = tmp_path / "out", tmp_path / "logs", tmp_path / "launcher.err"
    out.mkdir()
    argv = [*PHALANX, "--nproc-per-node", "2", "--log-dir", str(logs),
            worker("deathsig_tree.py"), str(out), "child", "clear"]  # fmt: skip
    with open(err_path, "wb") as stderr:
        launcher = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True
        )
    try:
        wait_for(lambda: len(read_pids(out)) == 4, HANG, "2 workers and their 2 children")
        pids = read_pids(out)
        leftovers.extend(pids)
        killed = kill_guardian(launcher.pid)
        wait_for(lambda: REPLACED in err_path.read_text(), HANG, "the guardian's replacement")
        new = guardian_of(launcher.pid)
        leftovers.append(new.pid)
        assert new.pid != killed
        children = psutil.Process(launcher.pid).children()
        for template in [c for c in children if "phalanx.worker.template" in c.cmdline()]:
            leftovers.append(template.pid)
            template.suspend()  # its own cleanup on the agent's EOF must not do the work
        (run_dir,) = logs.iterdir()
        cgroups = [root / f"phalanx-{run_dir.name}" for root in hierarchies()]
        contained = [path for path in cgroups if path.exists()]
        launcher.kill()
        launcher.wait(10)
        wait_for(lambda: not any(alive(p) for p in pids), GONE_WAIT, "the new guardian's SIGKILL")
        wait_for(lambda: not any(p.exists() for p in contained), GONE_WAIT, "the cgroup removed")
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait(10)


def test_the_new_guardian_kills_the_groups_it_was_told_of(leftovers: list[int]) -> None:
    """Without a cgroup (``phalanx.spawn``, or where none can be made) the process groups
    are all the guardian knows: a stand-in agent's watched group, its guardian SIGKILLed
    and replaced, then the stand-in SIGKILLed -- the group's process must die."""
    stand_in = subprocess.Popen(
        [sys.executable, worker("guard_a_group.py")], stdout=subprocess.PIPE, text=True
    )
    try:
        assert stand_in.stdout is not None
        first, child = map(int, stand_in.stdout.readline().split())
        leftovers.append(child)
        os.kill(first, signal.SIGKILL)
        wait_for(lambda: [g.pid for g in guardians(stand_in.pid)] not in ([], [first]),
                 GONE_WAIT, "a new guardian")  # fmt: skip
        leftovers.append(guardian_of(stand_in.pid).pid)
        stand_in.kill()
        stand_in.wait(10)
        wait_for(lambda: not alive(child), GONE_WAIT, "the new guardian's SIGKILL")
    finally:
        stand_in.kill()
        stand_in.wait(10)


FAST = (
    "heartbeat_interval=0.5,heartbeat_timeout=10,last_call_timeout=1,join_timeout=60,"
    "exit_barrier_timeout=30"
)


def test_two_nodes_restart_after_one_lost_its_guardian(nodes: list[Node], tmp_path: Path) -> None:
    """Node 1's guardian is killed, then node 0's worker fails: both nodes stop their
    workers (node 1's agent forgets their groups: today, ``BrokenPipeError`` and the agent
    dies), the restart forms with both nodes and the job finishes 0."""
    marks = tmp_path / "marks"
    marks.mkdir()
    net, port = Loopback(), free_port()
    for i in (0, 1):
        args = [
            "--nnodes", "2", "--nproc-per-node", "1", "--max-restarts", "1",
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
            "--rdzv-id", "guardian", "--cold-start",
            "--rdzv-conf", f"{FAST},is_host={'true' if i == 0 else 'false'}",
            worker("fail_once_when_told.py"), str(marks),
        ]  # fmt: skip
        nodes.append(Node(net, i, args, tmp_path, f"n{i}"))
        if i == 0:  # the store's host first
            wait_for(lambda: "rendezvous" in nodes[0].stderr, HANG, "node 0 to host the store")
    first = [marks / "ready.0.0", marks / "ready.1.0"]
    wait_for(lambda: all(p.exists() for p in first), HANG, "both nodes' workers")
    killed = kill_guardian(nodes[1].proc.pid)
    (marks / "go").touch()
    for node in nodes:
        assert node.finish(HANG) == 0, node.stderr
        assert node.stdout.strip().endswith("world=2 restart=1"), node.stdout
    assert "Traceback" not in nodes[1].stderr, nodes[1].stderr
    (run_dir,) = nodes[1].logs.iterdir()
    assert [e["pid"] for e in lost_events(run_dir)] == [killed]
