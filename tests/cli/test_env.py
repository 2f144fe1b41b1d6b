"""The worker environment: one function, asserted exactly, and compared with torchrun's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from phalanx.config import LaunchConfig, RecoveryConfig, WorkersConfig
from phalanx.plan import WORKER_BOOT, WORKER_ENV_KEYS, build_plan, worker_env
from phalanx.rendezvous.api import NodeInfo, RendezvousResult
from support.launch import run_phalanx, worker
from support.tools import TORCHRUN

RDZV = RendezvousResult(
    run_id="job7",
    round=2,
    restart_count=2,
    node_rank=1,
    nodes=(NodeInfo(0, "a", "10.0.0.1", 4), NodeInfo(1, "b", "10.0.0.2", 4)),
    master_addr="10.0.0.1",
    master_port=40001,
)


def test_worker_env_exact() -> None:
    config = LaunchConfig(
        WorkersConfig(program="train.py", nproc_per_node=4, role="trainer"),
        recovery=RecoveryConfig(max_restarts=3),
    )
    env = worker_env(config, RDZV, local_rank=2, run_dir=Path("/runs/r"), base_env={"PATH": "/bin"})
    assert env == {
        "PATH": "/bin",
        "RANK": "6",
        "LOCAL_RANK": "2",
        "GROUP_RANK": "1",
        "ROLE_RANK": "6",
        "ROLE_NAME": "trainer",
        "LOCAL_WORLD_SIZE": "4",
        "WORLD_SIZE": "8",
        "GROUP_WORLD_SIZE": "2",
        "ROLE_WORLD_SIZE": "8",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "40001",
        "TORCHELASTIC_RESTART_COUNT": "2",
        "TORCHELASTIC_MAX_RESTARTS": "3",
        "TORCHELASTIC_RUN_ID": "job7",
        "TORCHELASTIC_USE_AGENT_STORE": "False",
        "TORCHELASTIC_ERROR_FILE": "/runs/r/attempt_2/rank_6/error.json",
        "TORCHELASTIC_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "OMP_NUM_THREADS": "1",
        "PHALANX_CHECKPOINT_LOG": "/runs/r/checkpoints.jsonl",
    }


@pytest.mark.parametrize(
    ("base", "nproc", "expected"),
    [({}, 1, None), ({}, 2, "1"), ({"OMP_NUM_THREADS": "4"}, 2, "4")],
)
def test_omp_num_threads_like_torchrun(
    base: dict[str, str], nproc: int, expected: str | None
) -> None:
    config = LaunchConfig(WorkersConfig(program="t.py", nproc_per_node=nproc))
    env = worker_env(config, RDZV, 0, Path("/r"), base)
    assert env.get("OMP_NUM_THREADS") == expected


def test_virtual_local_rank_maps_visible_devices() -> None:
    config = LaunchConfig(WorkersConfig(program="t.py", nproc_per_node=2, virtual_local_rank=True))
    env = worker_env(config, RDZV, 1, Path("/r"), {"CUDA_VISIBLE_DEVICES": "4,5"})
    assert (env["LOCAL_RANK"], env["CUDA_VISIBLE_DEVICES"]) == ("0", "5")


def test_plan_ranks_and_log_paths() -> None:
    config = LaunchConfig(WorkersConfig(program="t.py", nproc_per_node=4))
    plan = build_plan(config, RDZV, Path("/runs/r"), {})
    assert [w.global_rank for w in plan.workers] == [4, 5, 6, 7]
    assert plan.workers[0].stdout_path == Path("/runs/r/attempt_2/rank_4/stdout.log")
    # phalanx's worker-side code (phalanx.worker.boot, started by -c with the working
    # directory off sys.path) runs first, then t.py as python would.
    assert WORKER_BOOT[0] == "-c" and "from phalanx.worker.boot import main" in WORKER_BOOT[1]
    assert all(w.argv == (sys.executable, "-u", *WORKER_BOOT, "t.py") for w in plan.workers)


# Values that differ by design between two launches of the same job.
RUN_SPECIFIC = {"MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE"}


def test_environment_matches_torchrun(tmp_path: Path) -> None:
    """Run the same job under torchrun and phalanx; the workers must see the same variables."""
    seen = {}
    for launcher in ("torchrun", "phalanx"):
        out = tmp_path / launcher
        out.mkdir()
        args = [
            "--standalone",
            "--nproc-per-node",
            "2",
            "--max-restarts",
            "1",
            worker("dump_env.py"),
            str(out),
        ]
        if launcher == "torchrun":
            reference = [*TORCHRUN, *args]  # its module: see support.tools
            done = subprocess.run(reference, capture_output=True, text=True, timeout=120)
        else:
            done = run_phalanx(["--log-dir", str(tmp_path / "logs"), *args])
        assert done.returncode == 0, done.stderr
        seen[launcher] = {
            rank: json.loads((out / f"env_{rank}.json").read_text()) for rank in (0, 1)
        }
    for rank in (0, 1):
        theirs, ours = seen["torchrun"][rank], seen["phalanx"][rank]
        # phalanx adds exactly torchrun's variables, plus its checkpoint log.
        assert set(ours) ^ set(theirs) == {"PHALANX_CHECKPOINT_LOG"}
        assert set(WORKER_ENV_KEYS) <= set(theirs)
        for key in sorted(set(theirs) - RUN_SPECIFIC):
            if key == "TORCHELASTIC_USE_AGENT_STORE":
                # The deliberate difference: rank 0 hosts the workers' store (see plan.worker_env).
                assert (theirs[key], ours[key]) == ("True", "False")
            else:
                assert theirs[key] == ours[key], key
        assert (
            ours["MASTER_PORT"].isdigit()
            and Path(ours["TORCHELASTIC_ERROR_FILE"]).name == "error.json"
        )
