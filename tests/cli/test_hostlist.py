"""Slurm nodelists, expanded by python-hostlist (phalanx.environments.nodelist): the table, the
malformed lists, and a malformed list met by the command line (one line, exit 2)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from phalanx.environments.nodelist import expand, first_host
from support.launch import PHALANX, worker
from support.schedulers import scheduler_env


@pytest.mark.parametrize(
    ("nodelist", "hosts"),
    [
        ("node[01-04,07],gpu-a[1-2]",
         ["node01", "node02", "node03", "node04", "node07", "gpu-a1", "gpu-a2"]),
        ("a,b", ["a", "b"]),
        ("n[1-3]-ib", ["n1-ib", "n2-ib", "n3-ib"]),
        ("gpu[007-010]", ["gpu007", "gpu008", "gpu009", "gpu010"]),  # padding kept
        ("rack[1-2]-n[03-04]", ["rack1-n03", "rack1-n04", "rack2-n03", "rack2-n04"]),
        ("gpu[12,07-08],cpu1", ["gpu12", "gpu07", "gpu08", "cpu1"]),  # commas inside brackets
        ("node1", ["node1"]),
        ("a-b.example.org", ["a-b.example.org"]),
    ],
)  # fmt: skip
def test_expands(nodelist: str, hosts: list[str]) -> None:
    assert expand(nodelist) == hosts
    assert first_host(nodelist) == hosts[0]


@pytest.mark.parametrize(
    ("nodelist", "why"),
    [
        ("node[1-", "unbalanced brackets"),
        ("node[3-1]", "start > stop"),
        ("[]", "bad range"),
        ("", "it names no host"),
        ("a, b", "an empty or spaced name"),
    ],
)
def test_malformed_is_one_line(nodelist: str, why: str) -> None:
    with pytest.raises(ValueError) as caught:
        expand(nodelist, "SLURM_NODELIST")
    assert str(caught.value) == f"SLURM_NODELIST={nodelist!r} is not a Slurm host list: {why}"


def test_malformed_nodelist_from_the_cli_is_one_line_exit_2(tmp_path: Path) -> None:
    """An srun step of 2 nodes whose only nodelist variable is malformed: the host of the
    static store cannot be known, so phalanx stops before anything starts."""
    env = scheduler_env(SLURM_JOB_ID="77", SLURM_STEP_ID="0", SLURM_NNODES="2",
                        SLURM_NODEID="0", SLURM_NODELIST="node[1-")  # fmt: skip
    done = subprocess.run([*PHALANX, "--log-dir", str(tmp_path), worker("echo_args.py")],
                          capture_output=True, text=True, timeout=60, env=env)  # fmt: skip
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert done.stderr.splitlines() == [
        "phalanx: error: slurm: SLURM_NODELIST='node[1-' is not a Slurm host list: "
        "unbalanced brackets"
    ]
    # --master-addr makes the nodelist moot (an explicit flag wins): the dry run works.
    done = subprocess.run([*PHALANX, "--master-addr", "localhost", "--dry-run",
                           worker("echo_args.py")], capture_output=True, text=True,
                          timeout=60, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "slurm: --master-addr" not in done.stdout
