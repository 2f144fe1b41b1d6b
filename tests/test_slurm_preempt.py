"""Preemption under a real Slurm (the cluster of ``tests/support/slurm.py``): ``scancel
--signal`` on a running phalanx job step, and a batch job that phalanx requeues.

Slurm delivers a step's signal to every process of the step (proctrack: the agents, their
helper processes, the workers and their children alike), not to the agents alone; these
tests are what shows phalanx copes with that delivery, which a test sending the signal to
one agent cannot."""

from __future__ import annotations

import shlex
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from phalanx.errors import REQUEUE_EXIT_CODE
from support.launch import wait_for, worker
from support.slurm import SlurmCluster, job_env, needs_slurm, running

pytestmark = needs_slurm
REPO = Path(__file__).parents[1]
TIMEOUT = 150  # two agents, four workers importing torch, on 2 shared cores
RANKS = range(4)
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    with running(tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster


def training_step(tmp_path: Path, out: Path, *flags: str) -> list[str]:
    """The job step's command: phalanx on this node, its rendezvous and its preemption
    signals from SLURM's variables, two workers of slurm_preempt_train.py."""
    return [sys.executable, "-m", "phalanx", "--nproc-per-node", "2",
            "--log-dir", str(tmp_path / "logs"), *flags, worker("slurm_preempt_train.py"), str(out)]  # fmt: skip


def step(path: Path) -> int:
    try:
        return int(path.read_text() or -1)
    except (OSError, ValueError):
        return -1


def wait_until_training(out: Path, ended: Callable[[], str | None]) -> None:
    """Until every rank has done 3 steps (the workers are past torch's import and Gloo's
    setup, in the loop that asks ``phalanx.preempted()``); ``ended`` says what became of a
    job that ended first (None while it runs)."""
    seen: dict[str, str | None] = {}

    def training_or_ended() -> bool:
        # Decided once: a worker rewrites its step file (truncated, then written), so a second
        # look can find it empty while the job trains on.
        if all(step(out / f"step_{rank}") >= 3 for rank in RANKS):
            return True
        seen["ended"] = ended()
        return seen["ended"] is not None

    wait_for(training_or_ended, TIMEOUT, "training")
    if seen.get("ended") is not None:
        raise AssertionError(f"the job ended before training: {seen['ended']}")


def assert_one_step_saved(out: Path) -> int:
    """Every rank saved, the same step and the same weights; that step."""
    saved = [torch.load(out / f"saved_{rank}.pt") for rank in RANKS]
    steps = {checkpoint["step"] for checkpoint in saved}
    assert len(steps) == 1, steps
    weights = [checkpoint["model"]["weight"] for checkpoint in saved]
    assert all(torch.equal(weights[0], other) for other in weights[1:])
    return int(steps.pop())


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


def submit_two_node_batch(
    slurm: SlurmCluster, tmp_path: Path, out: Path, flags: tuple[str, ...], *sbatch: str
) -> str:
    """``sbatch --requeue -N2`` of a script whose one ``srun`` step runs the training step
    with phalanx ``flags`` on each node; its job id."""
    script = tmp_path / "job.sh"
    script.write_text(f"#!/bin/bash\nsrun {shlex.join(training_step(tmp_path, out, *flags))}\n")
    submitted = slurm.run(
        ["sbatch", "--parsable", "--requeue", "-N2", "--ntasks-per-node=1", *sbatch,
         f"--output={tmp_path}/slurm-%j.out", f"--chdir={REPO}", str(script)],
        env=job_env(),
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    return submitted.stdout.strip().split(";")[0]


def requeued_once_and_completed(
    slurm: SlurmCluster, job_id: str, tmp_path: Path
) -> dict[str, str]:
    """Preempt the batch job (USR1, its --preempt-signals) and wait for its end: it must have
    been requeued once and completed. Its fields, as ``scontrol show job`` gives them."""
    assert slurm.run(["scancel", "--signal=USR1", job_id]).returncode == 0
    wait_for(lambda: slurm.job_fields(job_id).get("JobState") in ENDED, 2 * TIMEOUT, "the end")
    fields = slurm.job_fields(job_id)
    assert (fields["JobState"], fields["Restarts"], fields["ExitCode"]) == (
        "COMPLETED", "1", "0:0"
    ), f"{fields}\n{batch_output(tmp_path)}{slurm.log_tails()}"  # fmt: skip
    return fields


def batch_ended(slurm: SlurmCluster, job_id: str, tmp_path: Path) -> str | None:
    fields = slurm.job_fields(job_id)
    return f"{fields}\n{batch_output(tmp_path)}" if fields.get("JobState") in ENDED else None


def batch_output(tmp_path: Path) -> str:
    return "".join(path.read_text(errors="replace") for path in tmp_path.glob("slurm-*.out"))
