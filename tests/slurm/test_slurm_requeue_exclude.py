"""``--requeue`` keeps excluded nodes out of the requeued job, under a real Slurm of three
nodes (``tests/support/slurm.py``): a batch job on two of them trains, one of its nodes is
written into the shared ``--exclude-file`` (as its agent writes itself under Slurm: its
``SLURMD_NODENAME``), the job is preempted and requeued, and Slurm runs it again on the
other two nodes (node rank 0's ``scontrol requeuehold``, ``update ExcNodeList``, ``release``)."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.launch import wait_for
from support.slurm import SlurmCluster, needs_slurm, running
from support.slurm_jobs import (
    RANKS,
    assert_one_step_saved,
    batch_ended,
    batch_output,
    requeued_once_and_completed,
    step,
    submit_two_node_batch,
    wait_until_training,
)

pytestmark = needs_slurm


@pytest.fixture(scope="module")
def slurm3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    with running(tmp_path_factory.mktemp("slurm3"), nodes=3) as cluster:
        yield cluster


def test_a_requeued_job_does_not_run_on_an_excluded_node(
    slurm3: SlurmCluster, tmp_path: Path
) -> None:
    slurm = slurm3
    out = tmp_path / "out"
    out.mkdir()
    excluded = tmp_path / "excluded.jsonl"
    flags = ("--requeue", "--exclude-file", str(excluded))
    job_id = submit_two_node_batch(
        slurm, tmp_path, out, flags, "--job-name=exclude", "--open-mode=append"
    )
    try:
        wait_until_training(out, lambda: batch_ended(slurm, job_id, tmp_path))
        first = slurm.job_fields(job_id)["NodeList"]
        shown = slurm.run(["scontrol", "show", "hostnames", first]).stdout.split()
        assert len(shown) == 2, first
        bad = shown[1]
        # What the node's agent writes when it is excluded there (no --local-addr: every node
        # of this test cluster has the same host name; its Slurm name tells them apart).
        excluded.write_text(json.dumps({"node": socket.gethostname(), "addr": None,
                                        "slurm": bad, "reason": "test"}) + "\n")  # fmt: skip
        fields = requeued_once_and_completed(slurm, job_id, tmp_path)
    finally:
        slurm.run(["scancel", job_id])
    assert fields["ExcNodeList"] == bad, fields
    again = slurm.run(["scontrol", "show", "hostnames", fields["NodeList"]]).stdout.split()
    assert len(again) == 2 and bad not in again, (first, fields["NodeList"])
    saved = assert_one_step_saved(out)
    assert [step(out / f"resumed_{rank}") for rank in RANKS] == [saved] * 4
    assert "without the excluded node(s)" in batch_output(tmp_path)
    wait_for(lambda: slurm.job_pids() == [], 30, "the job's processes to go")
