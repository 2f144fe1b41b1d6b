"""Preemption under a real Slurm (the cluster of ``tests/support/slurm.py``): ``scancel
--signal`` on a running phalanx job step, and a batch job that phalanx requeues.

Slurm delivers a step's signal to every process of the step (proctrack: the agents, their
helper processes, the workers and their children alike), not to the agents alone; these
tests are what shows phalanx copes with that delivery, which a test sending the signal to
one agent cannot."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from phalanx.errors import REQUEUE_EXIT_CODE
from support.launch import wait_for
from support.slurm import SlurmCluster, needs_slurm, running
from support.slurm_jobs import (
    RANKS,
    REPO,
    TIMEOUT,
    assert_one_step_saved,
    batch_ended,
    requeued_once_and_completed,
    step,
    submit_two_node_batch,
    training_step,
    wait_until_training,
)

pytestmark = needs_slurm


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    with running(tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster


@pytest.mark.parametrize("sig", ["USR1", "TERM"])
def test_scancel_signal_saves_one_step_on_every_rank_and_the_step_exits_75(
    slurm: SlurmCluster, tmp_path: Path, sig: str
) -> None:
    """``scancel --signal=SIG JOB`` (both are phalanx's default preemption signals under
    SLURM) while the job trains: every rank's ``phalanx.preempted()`` turns true after the
    same step, each saves it, both agents exit 75, and srun passes 75 on."""
    out = tmp_path / "out"
    out.mkdir()
    name = f"preempt-{sig}"
    job = slurm.popen(["srun", f"--job-name={name}", "-N2", "--ntasks-per-node=1",
                       *training_step(tmp_path, out)], cwd=REPO)  # fmt: skip
    try:
        wait_until_training(out, lambda: None if job.poll() is None else "".join(job.communicate()))
        cancelled = slurm.run(["scancel", f"--signal={sig}", slurm.job_id(name)])
        assert cancelled.returncode == 0, cancelled.stderr
        stdout, stderr = job.communicate(timeout=TIMEOUT)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait(10)
    assert job.returncode == REQUEUE_EXIT_CODE, stdout + stderr + slurm.log_tails()
    assert_one_step_saved(out)
    wait_for(lambda: slurm.job_pids() == [], 30, "the step's processes to go")


def test_a_requeued_batch_job_resumes_from_the_step_every_rank_saved(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    """``sbatch --requeue`` of a script whose step runs ``phalanx --requeue``; ``scancel
    --signal=USR1`` (the job's steps, not its batch shell): phalanx saves, exits 75 and
    requeues the job (node rank 0's ``scontrol requeue``); Slurm starts the script again
    (Restarts=1), its workers resume after the saved step, and the job completes."""
    out = tmp_path / "out"
    out.mkdir()
    job_id = submit_two_node_batch(slurm, tmp_path, out, ("--requeue",), "--job-name=requeue")
    try:
        wait_until_training(out, lambda: batch_ended(slurm, job_id, tmp_path))
        requeued_once_and_completed(slurm, job_id, tmp_path)
    finally:
        slurm.run(["scancel", job_id])  # a job that went wrong must not hold the nodes
    saved = assert_one_step_saved(out)
    assert [step(out / f"resumed_{rank}") for rank in RANKS] == [saved] * 4
    wait_for(lambda: slurm.job_pids() == [], 30, "the job's processes to go")
