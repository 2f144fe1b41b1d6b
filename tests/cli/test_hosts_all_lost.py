"""Every ssh session of a job with a spare host lost at once: the controller no longer says
the job "goes on without it" -- it has no session left -- but that the job ends here, with
its exit status, and what to do. Real sshd hosts in network namespaces (``support.sshd``),
three hosts at ``--nnodes 2`` (one spare), workers that do not import torch; every process
of the job on every host SIGKILLed (agents, workers, the sshd sessions: each ssh client ends
with 255, a lost session). The line's words for each case are ``tests/unit/test_lost_line.py``."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from support.launch import wait_for, worker
from support.netns import NetNamespaces
from support.sshd import SshHosts, end_controller_job, needs_sshd

pytestmark = needs_sshd
REPO = Path(__file__).parents[2]


def test_the_controller_says_the_job_has_no_session_left_when_every_one_is_lost(
    netns: Callable[[int], NetNamespaces], tmp_path: Path
) -> None:
    hosts = SshHosts(netns(4), tmp_path, [1, 2, 3])
    shared = tmp_path / "shared"
    shared.mkdir()
    proc: subprocess.Popen[str] | None = None
    try:
        hosts.start()
        hostfile = tmp_path / "hostfile"
        hostfile.write_text("".join(f"{name} slots=1\n" for name in hosts.names))
        argv = [sys.executable, "-m", "phalanx", "--hostfile", str(hostfile), "--nnodes", "2",
                "--ssh-config", str(hosts.config), "--log-dir", str(tmp_path / "logs"),
                "--cold-start", worker("resume_after_all_lost.py"), str(shared)]  # fmt: skip
        proc = subprocess.Popen(
            hosts.spaces.command(0, argv), cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO / "src")),
            text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
        )  # fmt: skip
        wait_for(lambda: (shared / "up.0").exists() and (shared / "up.1").exists(), 120, "round 0")
        for name in hosts.names:
            for pid in hosts.job_pids(name):
                # A worker may end with its agent between the listing and its own kill.
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            raise AssertionError(f"the controller did not finish:\n{out}\n{err}") from None
        lost = [line for line in err.splitlines() if "was lost" in line]
        assert len(lost) == 3, err  # one line per host
        assert proc.returncode == 1, err
        assert "and the job has no session left" in lost[-1], err
        assert "it ends here (exit 1)" in lost[-1] and "goes on without it" not in lost[-1], err
    finally:
        end_controller_job(hosts, proc, tmp_path / "logs")
