"""phalanx.inscript.dist and phalanx.inscript.envs: flags, rank arithmetic, backend choice, launcher
environments (pure tables), and real two-process Gloo groups set up by setup_dist and init."""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import queue
import socket
import time
import traceback
from typing import Any

import pytest
import torch

from phalanx.environments.nodelist import first_host
from phalanx.errors import UsageError
from phalanx.inscript import dist
from phalanx.inscript.envs import LaunchEnv, read_launch_env

NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="asserts the CPU-only choice")


# --- rank arithmetic ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("num_nodes", "node_rank", "num_gpus", "ranks"),
    [
        (1, 0, 1, [0]),
        (1, 0, 4, [0, 1, 2, 3]),
        (2, 0, 2, [0, 1]),
        (2, 1, 2, [2, 3]),
        (2, 1, 4, [4, 5, 6, 7]),
        (3, 2, 2, [4, 5]),
        (4, 3, 8, list(range(24, 32))),
    ],
)
def test_global_ranks_of_a_node(
    num_nodes: int, node_rank: int, num_gpus: int, ranks: list[int]
) -> None:
    dist.check_node(num_nodes, node_rank, num_gpus)
    assert [dist.global_rank(node_rank, num_gpus, lr) for lr in range(num_gpus)] == ranks
    assert dist.world_size(num_nodes, num_gpus) == num_nodes * num_gpus


@pytest.mark.parametrize(("num_nodes", "num_gpus"), [(1, 1), (2, 3), (3, 2), (4, 8)])
def test_ranks_of_all_nodes_tile_the_world(num_nodes: int, num_gpus: int) -> None:
    every = [
        dist.global_rank(node, num_gpus, local)
        for node in range(num_nodes)
        for local in range(num_gpus)
    ]
    assert every == list(range(dist.world_size(num_nodes, num_gpus)))


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: dist.global_rank(-1, 2, 0), "node_rank must be >= 0, got -1"),
        (lambda: dist.global_rank(0, 2, -1), "local_rank must be >= 0, got -1"),
        (lambda: dist.global_rank(0, 2, 2), "local_rank must be < num_gpus (2), got 2"),
        (lambda: dist.global_rank(0, 0, 0), "num_gpus must be >= 1, got 0"),
        (lambda: dist.world_size(0, 2), "num_nodes must be >= 1, got 0"),
        (lambda: dist.world_size(2, -3), "num_gpus must be >= 1, got -3"),
        (lambda: dist.check_node(2, 2, 1), "node_rank must be < num_nodes (2), got 2"),
    ],
)
def test_bad_rank_inputs_say_what_was_given(call: Any, message: str) -> None:
    with pytest.raises(UsageError) as info:
        call()
    assert message in info.value.problems
    assert info.value.exit_code == 2


def test_all_problems_reported_at_once() -> None:
    with pytest.raises(UsageError) as info:
        dist.check_node(0, -1, 0)
    assert len(info.value.problems) == 3


# --- flags ----------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    dist.add_dist_args(parser)
    return parser


def test_flag_defaults_match_trellis() -> None:
    args = _parser().parse_args([])
    assert (args.num_nodes, args.node_rank, args.master_addr, args.master_port) == (
        1,
        0,
        "localhost",
        "12345",
    )
    assert args.num_gpus == (torch.cuda.device_count() or 1)
    assert args.backend == "auto"


def test_flags_parse() -> None:
    argv = "--num_nodes 2 --node_rank 1 --num_gpus 4 --master_addr 10.0.0.1 --master_port 29500"
    args = _parser().parse_args([*argv.split(), "--backend", "gloo"])
    assert vars(args) == {
        "num_nodes": 2,
        "node_rank": 1,
        "num_gpus": 4,
        "master_addr": "10.0.0.1",
        "master_port": "29500",
        "backend": "gloo",
    }


def test_unknown_backend_flag_is_rejected(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        _parser().parse_args(["--backend", "mpi"])
    assert info.value.code == 2
    assert "invalid choice: 'mpi'" in capsys.readouterr().err


# --- backend --------------------------------------------------------------------------------


@NO_CUDA
def test_auto_backend_is_gloo_without_cuda() -> None:
    assert dist.resolve_backend("auto") == "gloo"
    assert dist.resolve_backend("gloo") == "gloo"


@NO_CUDA
def test_nccl_without_cuda_is_a_usage_error_with_hint() -> None:
    with pytest.raises(UsageError, match=r"CUDA is not available.*use --backend gloo"):
        dist.resolve_backend("nccl")


def test_unknown_backend_lists_known_ones() -> None:
    with pytest.raises(UsageError, match=r"unknown backend 'mpi'; known: auto, nccl, gloo"):
        dist.resolve_backend("mpi")


# --- launcher environments (pure) -----------------------------------------------------------

TORCHRUN_ENV = {
    "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2",
    "GROUP_RANK": "1", "ROLE_RANK": "3", "MASTER_ADDR": "node0", "MASTER_PORT": "29500",
    "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_USE_AGENT_STORE": "False",
}  # fmt: skip
SLURM_STEP = {
    "SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_PROCID": "5", "SLURM_LOCALID": "1",
    "SLURM_NTASKS": "8", "SLURM_STEP_NODELIST": "gpu[07-09,12]", "SLURM_NODELIST": "x1",
}  # fmt: skip
OMPI = {
    "OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
    "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
}  # fmt: skip
MASTER = {"MASTER_ADDR": "10.1.1.1", "MASTER_PORT": "23456"}


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, None),
        ({"PATH": "/bin", "SLURM_JOB_ID": "7"}, None),
        # the batch script of an sbatch job: SLURM_PROCID=0 but no step -> not a worker
        ({k: v for k, v in SLURM_STEP.items() if k != "SLURM_STEP_ID"}, None),
        (TORCHRUN_ENV, LaunchEnv("env", 3, 1, 4, "node0", 29500)),
        (  # what phalanx.spawn / setup_dist export: the five standard variables only
            {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", **MASTER},
            LaunchEnv("env", 0, 0, 1, "10.1.1.1", 23456),
        ),
        (  # phalanx.spawn also passes the backend it resolved
            {
                "RANK": "1",
                "LOCAL_RANK": "1",
                "WORLD_SIZE": "2",
                "PHALANX_BACKEND": "gloo",
                **MASTER,
            },
            LaunchEnv("env", 1, 1, 2, "10.1.1.1", 23456, backend="gloo"),
        ),
        # torchrun started by srun: the workers are torchrun's, not srun's
        ({**SLURM_STEP, **TORCHRUN_ENV}, LaunchEnv("env", 3, 1, 4, "node0", 29500)),
        ({**SLURM_STEP, **MASTER}, LaunchEnv("slurm", 5, 1, 8, "10.1.1.1", 23456)),
        (
            SLURM_STEP,
            LaunchEnv(
                "slurm",
                5,
                1,
                8,
                "gpu07",
                19242,
                (
                    "MASTER_ADDR not set; derived gpu07 from the slurm environment",
                    "MASTER_PORT not set; derived 19242 from the slurm environment",
                ),
            ),
        ),
        ({**OMPI, **MASTER}, LaunchEnv("openmpi", 2, 0, 4, "10.1.1.1", 23456)),
        (
            {**OMPI, "OMPI_COMM_WORLD_LOCAL_SIZE": "4", "MASTER_PORT": "23456"},
            LaunchEnv(
                "openmpi",
                2,
                0,
                4,
                "localhost",
                23456,
                ("MASTER_ADDR not set; derived localhost from the openmpi environment",),
            ),
        ),
        (
            {"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", **MASTER},
            LaunchEnv("pmi", 1, 1, 2, "10.1.1.1", 23456),
        ),
    ],
)
def test_read_launch_env(env: dict[str, str], expected: LaunchEnv | None) -> None:
    assert read_launch_env(env) == expected


@pytest.mark.parametrize(
    ("env", "messages"),
    [
        ({"RANK": "0", **MASTER}, ["env launcher: LOCAL_RANK is not set",
                                   "env launcher: WORLD_SIZE is not set"]),
        ({**TORCHRUN_ENV, "RANK": "three"}, ["env launcher: RANK='three' is not an integer"]),
        ({**TORCHRUN_ENV, "RANK": "4"}, ["RANK must be < WORLD_SIZE (4), got 4"]),
        ({**TORCHRUN_ENV, "WORLD_SIZE": "0"}, ["WORLD_SIZE must be >= 1, got 0"]),
        ({**TORCHRUN_ENV, "MASTER_PORT": "70000"},
         ["MASTER_PORT must be a TCP port (1-65535), got '70000'"]),
        (
            {k: v for k, v in TORCHRUN_ENV.items() if not k.startswith("MASTER")},
            ["MASTER_ADDR is not set and cannot be derived; hint: phalanx, torchrun and "
             "phalanx.spawn always set them",
             "MASTER_PORT is not set and cannot be derived; hint: phalanx, torchrun and "
             "phalanx.spawn always set them"],
        ),
        (
            OMPI,  # two nodes, nothing exported
            ["MASTER_ADDR is not set and cannot be derived; hint: pass them with mpirun -x "
             "MASTER_ADDR=<host of rank 0> -x MASTER_PORT=<free port>",
             "MASTER_PORT is not set and cannot be derived; hint: pass them with mpirun -x "
             "MASTER_ADDR=<host of rank 0> -x MASTER_PORT=<free port>"],
        ),
        ({"PMI_RANK": "0", "PMI_SIZE": "2", **MASTER}, ["pmi launcher: MPI_LOCALRANKID is not set"]),
    ],
)  # fmt: skip
def test_bad_launch_env_reports_every_problem(env: dict[str, str], messages: list[str]) -> None:
    with pytest.raises(UsageError) as info:
        read_launch_env(env)
    assert info.value.problems == messages


@pytest.mark.parametrize(
    ("nodelist", "host"),
    [
        ("node1", "node1"),
        ("node1,node2", "node1"),
        ("gpu[07-09,12]", "gpu07"),
        ("gpu[12,07-09],cpu1", "gpu12"),
        ("rack[1-2]-n[003-004]", "rack1-n003"),
        ("a-b.example.org", "a-b.example.org"),
    ],
)
def test_first_host_of_slurm_nodelist(nodelist: str, host: str) -> None:
    assert first_host(nodelist) == host


def test_init_without_a_launcher_is_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("RANK", "SLURM_STEP_ID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(UsageError, match=r"no launcher environment found.*RANK, SLURM_STEP_ID"):
        dist.init()


# --- real process groups --------------------------------------------------------------------


def _free_port(low: int = 0, high: int = 0) -> int:
    for port in range(low, high) if low else [0]:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return int(s.getsockname()[1])
    raise RuntimeError(f"no free port in {low}..{high}")


def _report(results: Any, rank: int, info: dist.DistInfo) -> None:
    import torch.distributed as tdist

    t = torch.tensor([float(info.rank + 1)])
    tdist.all_reduce(t)
    names = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK")
    env = {k: os.environ.get(k) for k in names}
    again = dist.init() if "RANK" in os.environ else None  # already initialised: no new group
    results.put((rank, "ok", (info, t.item(), env, again)))
    tdist.destroy_process_group()


def _setup_dist_worker(rank: int, port: int, results: Any) -> None:
    try:
        info = dist.setup_dist(rank, rank, 2, "127.0.0.1", str(port), timeout=_TIMEOUT)
        _report(results, rank, info)
    except BaseException:
        results.put((rank, "error", traceback.format_exc()))


def _init_worker(rank: int, env: dict[str, str], results: Any) -> None:
    try:
        os.environ.update(env)
        _report(results, rank, dist.init(timeout=_TIMEOUT))
    except BaseException:
        results.put((rank, "error", traceback.format_exc()))


_TIMEOUT = dist.DEFAULT_TIMEOUT / 10  # a hang fails in a minute, not ten


def _run_pair(target: Any, args_of: Any) -> dict[int, Any]:
    """Run ``target(*args_of(rank), results)`` in two spawned processes; their reports."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args_of(r), results)) for r in range(2)]
    out: dict[int, Any] = {}
    deadline = time.monotonic() + 120
    try:
        for p in procs:
            p.start()
        while len(out) < len(procs):
            if time.monotonic() > deadline:
                pytest.fail(f"workers did not report within 120 s; got {sorted(out)}")
            try:
                rank, status, value = results.get(timeout=1)
            except queue.Empty:
                dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                assert not dead, f"a worker died without reporting: exit codes {dead}"
                continue
            assert status == "ok", value
            out[rank] = value
        for p in procs:
            p.join(timeout=60)
            assert p.exitcode == 0
        return out
    finally:
        started = [p for p in procs if p.pid is not None]
        for p in started:
            if p.is_alive():
                p.kill()
            p.join(timeout=10)
        assert not any(p.is_alive() for p in started)


def test_setup_dist_initialises_a_real_gloo_group() -> None:
    port = _free_port()
    out = _run_pair(_setup_dist_worker, lambda r: (r, port))
    for rank in (0, 1):
        info, total, env, _ = out[rank]
        assert info == dist.DistInfo(rank, rank, 2, torch.device("cpu"), "gloo")
        assert total == 3.0  # 1 + 2: the all-reduce crossed processes
        assert env == {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "WORLD_SIZE": "2",
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
        }


def test_init_reads_a_torchrun_style_environment() -> None:
    port = _free_port()
    base = {"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    out = _run_pair(_init_worker, lambda r: (r, {**base, "RANK": str(r), "LOCAL_RANK": str(r)}))
    for rank in (0, 1):
        info, total, _, again = out[rank]
        assert info == dist.DistInfo(rank, rank, 2, torch.device("cpu"), "gloo")
        assert total == 3.0
        assert again == info  # a second init() reuses the group


def test_init_under_srun_derives_master_from_the_job() -> None:
    port = _free_port(15000, 25000)  # the derived port is 15000 + job id mod 10000
    base = {"SLURM_JOB_ID": str(port - 15000), "SLURM_STEP_ID": "0", "SLURM_NTASKS": "2",
            "SLURM_STEP_NODELIST": "127.0.0.1"}  # fmt: skip
    for var in ("RANK", "MASTER_ADDR", "MASTER_PORT"):
        assert var not in os.environ, f"{var} leaked into the test environment"
    out = _run_pair(
        _init_worker, lambda r: (r, {**base, "SLURM_PROCID": str(r), "SLURM_LOCALID": str(r)})
    )
    for rank in (0, 1):
        info, total, env, _ = out[rank]
        assert info == dist.DistInfo(rank, rank, 2, torch.device("cpu"), "gloo")
        assert total == 3.0
        assert env["MASTER_PORT"] is None  # init() reads the environment, never writes it
