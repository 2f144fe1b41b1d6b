"""What the Slurm preemption tests share: the training job step (phalanx, two workers of
``slurm_preempt_train.py``), a two-node requeued batch job, and how to read what they saved."""

from __future__ import annotations

import shlex
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from support.launch import wait_for, worker
from support.slurm import SlurmCluster, job_env

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 150  # two agents, four workers importing torch, on 2 shared cores
RANKS = range(4)
# Seconds between looks that start processes (scontrol): a wait of a minute at wait_for's
# default 0.05 s was 1200 of them, CPU the other tests of a 2-core machine wait for.
POLL = 0.5
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")


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

    # Every look asks slurmctld (``ip netns exec ... scontrol``): twice a second, not 20 times
    wait_for(training_or_ended, TIMEOUT, "training", every=POLL)
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


def requeued_once_and_completed(slurm: SlurmCluster, job_id: str, tmp_path: Path) -> dict[str, str]:
    """Preempt the batch job (USR1, its --preempt-signals) and wait for its end: it must have
    been requeued once and completed. Its fields, as ``scontrol show job`` gives them."""
    assert slurm.run(["scancel", "--signal=USR1", job_id]).returncode == 0
    wait_for(
        lambda: slurm.job_fields(job_id).get("JobState") in ENDED, 2 * TIMEOUT, "the end",
        every=POLL,
    )  # fmt: skip
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
