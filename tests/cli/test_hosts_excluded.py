"""A host excluded from a job under ``--hostfile`` that goes on without it (``--nnodes
MIN:MAX``): its agent exits 69 (``NodeExcluded``) and the controller counts it out, not
failed -- one line, the others go on, and the job's exit status is theirs. Before, 69 counted
as a failure: the controller stopped every host ``AFTER_FAILURE`` (60 s) later and exited 69
after the others had finished well. Real sshd hosts in network namespaces, workers that do
not import torch; host2's rank fails round 0, ``--exclude-after 1`` excludes its node."""

from __future__ import annotations

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


def test_an_excluded_host_is_out_and_the_job_goes_on_and_ends_with_the_others_code(
    netns: Callable[[int], NetNamespaces], tmp_path: Path
) -> None:
    hosts = SshHosts(netns(3), tmp_path, [1, 2])
    shared = tmp_path / "shared"
    shared.mkdir()
    proc: subprocess.Popen[str] | None = None
    try:
        hosts.start()
        hostfile = tmp_path / "hostfile"
        hostfile.write_text("".join(f"{name} slots=1\n" for name in hosts.names))
        argv = [sys.executable, "-m", "phalanx", "--hostfile", str(hostfile), "--nnodes", "1:2",
                "--max-restarts", "2", "--exclude-after", "1", "--ssh-config", str(hosts.config),
                "--log-dir", str(tmp_path / "logs"), "--rdzv-conf", "last_call_timeout=1",
                worker("fail_on_host.py"), str(shared), hosts.addr("host2")]  # fmt: skip
        proc = subprocess.Popen(
            hosts.spaces.command(0, argv), cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO / "src")),
            text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
        )  # fmt: skip
        try:
            out, err = proc.communicate(timeout=150)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            raise AssertionError(f"the controller did not finish:\n{out}\n{err}") from None
        assert "host2: " in err and "is excluded" in err, err  # the agent's own line
        excluded = [line for line in err.splitlines() if "agent was excluded from the job" in line]
        assert len(excluded) == 1 and excluded[0].startswith("phalanx: host2's agent"), err
        assert "stopping the job on every host" not in err, err
        assert proc.returncode == 0, f"{out}\n{err}"
        assert "host1: [rank0]: finished at world 1" in out, out
        for name in hosts.names:
            wait_for(lambda n=name: hosts.job_pids(n) == [], 15, f"nothing left on {name}")
    finally:
        end_controller_job(hosts, proc, tmp_path / "logs")
