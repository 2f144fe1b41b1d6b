"""phalanx under a real Slurm: Debian's Slurm 22.05, a ``slurmctld`` and two ``slurmd`` nodes
in network namespaces, MUNGE of their own (``tests/support/slurm.py``), one cluster for the
module. Jobs are started with ``srun`` from the controller's namespace like a user would."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.slurm import SlurmCluster, needs_slurm

pytestmark = needs_slurm
REPO = Path(__file__).parents[1]
STEP_TIMEOUT = 150  # srun of a phalanx job: two agents, four workers importing torch, 2 cores


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()
        assert cluster.spaces.leftovers() == []
        assert not any(Path("/etc/netns", name).exists() for name in cluster.spaces.names)


def srun(
    cluster: SlurmCluster, *argv: str, timeout: float = STEP_TIMEOUT
) -> subprocess.CompletedProcess[str]:
    """``srun argv`` on the controller's namespace, from the repository, with Gloo on eth0."""
    env = cluster.env({"PYTHONPATH": str(REPO / "src"), "GLOO_SOCKET_IFNAME": "eth0"})
    return subprocess.run(
        cluster.command(["srun", *argv]), cwd=REPO, env=env, capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip


def test_a_step_runs_one_task_on_each_node(slurm: SlurmCluster) -> None:
    """The cluster itself: two nodes run one step, each task in its own node's namespace,
    and the nodes' names resolve there."""
    done = srun(slurm, "-N2", "--ntasks-per-node=1", "bash", "-c",
                'echo "$SLURM_NODEID $SLURMD_NODENAME $(hostname -I) $(getent hosts node2)"')  # fmt: skip
    assert done.returncode == 0, done.stderr + slurm.log_tails()
    n1, n2 = slurm.addr("node1"), slurm.addr("node2")
    assert sorted(line.split() for line in done.stdout.splitlines()) == [
        ["0", "node1", n1, n2, "node2"],
        ["1", "node2", n2, n2, "node2"],
    ]
