"""phalanx under a real Slurm: Debian's Slurm 22.05, a ``slurmctld`` and two ``slurmd`` nodes
in network namespaces, MUNGE of their own (``tests/support/slurm.py``), one cluster for the
module. Jobs are started with ``srun`` from the controller's namespace like a user would."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.launch import wait_for, worker
from support.slurm import SlurmCluster, needs_slurm, running, static_flags

pytestmark = needs_slurm
REPO = Path(__file__).parents[2]
STEP_TIMEOUT = 150  # srun of a phalanx job: two agents, four workers importing torch, 2 cores
WORLD_OF_FOUR = [
    f"[rank{rank}]: world=4 sum=10 restart=0 rank={rank} node={rank // 2}" for rank in range(4)
]


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    with running(tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster


def srun(cluster: SlurmCluster, *argv: str) -> subprocess.CompletedProcess[str]:
    """``srun argv`` from the controller's namespace, in the repository, to its end."""
    job = cluster.popen(["srun", *argv], cwd=REPO)
    try:
        out, err = job.communicate(timeout=STEP_TIMEOUT)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait(10)
    # nothing of the step is left on the nodes (slurmstepd reaps, then goes, soon after srun)
    wait_for(
        lambda: cluster.job_pids() == [], 30, f"the step's processes to go: {cluster.job_pids()}"
    )
    return subprocess.CompletedProcess(job.args, job.returncode, out, err)


def test_a_step_runs_one_task_on_each_node(slurm: SlurmCluster) -> None:
    """The cluster itself: two nodes run one step, each task in its own node's namespace
    under its node's hostname, and the nodes' names resolve there."""
    done = srun(slurm, "-N2", "--ntasks-per-node=1", "bash", "-c",
                'echo "$SLURM_NODEID $(hostname) $(hostname -I) $(getent hosts node2)"')  # fmt: skip
    assert done.returncode == 0, done.stderr + slurm.log_tails()
    n1, n2 = slurm.addr("node1"), slurm.addr("node2")
    assert sorted(line.split() for line in done.stdout.splitlines()) == [
        ["0", "node1", n1, n2, "node2"],
        ["1", "node2", n2, n2, "node2"],
    ]


def test_two_nodes_of_two_workers_form_one_world_of_four_with_explicit_flags(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    """One agent per node (srun's one task per node), two workers each, one Gloo all-reduce
    over the four, with the rendezvous flags written by hand (they win over SLURM's)."""
    phalanx = f"{sys.executable} -m phalanx {static_flags(tmp_path)} --nproc-per-node 2"
    done = srun(slurm, "-N2", "--ntasks-per-node=1", "bash", "-c",
                f"exec {phalanx} {worker('flaky_dist.py')}")  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr + slurm.log_tails()
    assert sorted(line for line in done.stdout.splitlines() if "world=" in line) == WORLD_OF_FOUR


def test_srun_of_phalanx_needs_no_rendezvous_flags(slurm: SlurmCluster, tmp_path: Path) -> None:
    """``srun -N2 --ntasks-per-node=1 phalanx --nproc-per-node 2 train.py``: node count, node
    rank, the store's host and port and the run id come from SLURM's variables (``srun``
    runs the command itself: no shell, no flag from the user but the worker count)."""
    done = srun(slurm, "-N2", "--ntasks-per-node=1", sys.executable, "-m", "phalanx",
                "--nproc-per-node", "2", "--log-dir", str(tmp_path), worker("flaky_dist.py"))  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr + slurm.log_tails()
    assert sorted(line for line in done.stdout.splitlines() if "world=" in line) == WORLD_OF_FOUR
