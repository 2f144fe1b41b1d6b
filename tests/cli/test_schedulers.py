"""phalanx under a scheduler without multi-node flags (phalanx.environments, cli.scheduler).

Pure tables first: each environment written out as its scheduler sets it. Then real runs:
two agents, each with its node's exact variables, form one Gloo world of 4 with no
rendezvous flag. Both agents run on this machine over loopback, so the first host of the
Slurm nodelist (where node 0 hosts the static store) is ``localhost``: the name must resolve
on both "nodes", and here both share one /etc/hosts. (A Slurm cluster in network namespaces
is another test's subject.)
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from types import MappingProxyType

import pytest

from phalanx.cli.argv import parse_config
from phalanx.environments import detect
from phalanx.errors import UsageError
from phalanx.resources.ports import free_port
from support.launch import PHALANX, launched, worker
from support.schedulers import scheduler_env, slurm_job_id_with_free_port

SCRIPT = worker("echo_args.py")
TOKEN = {"PHALANX_RDZV_TOKEN": "0123456789abcdef0123456789abcdef"}


def srun_step(job: str, node: int, nodelist: str = "node[01-02]", gpus: str = "") -> dict[str, str]:
    """What ``srun -N2 --ntasks-per-node=1`` sets for its task on node ``node``."""
    host = f"node0{node + 1}"
    env = {
        "SLURM_JOB_ID": job, "SLURM_JOBID": job, "SLURM_JOB_NAME": "train",
        "SLURM_JOB_NUM_NODES": "2", "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": nodelist,
        "SLURM_NODELIST": nodelist, "SLURM_JOB_CPUS_PER_NODE": "8(x2)",
        "SLURM_TASKS_PER_NODE": "1(x2)", "SLURM_NTASKS": "2", "SLURM_NPROCS": "2",
        "SLURM_NTASKS_PER_NODE": "1", "SLURM_STEP_ID": "0", "SLURM_STEPID": "0",
        "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_NUM_TASKS": "2",
        "SLURM_STEP_NODELIST": nodelist, "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
        "SLURM_NODEID": str(node), "SLURM_PROCID": str(node), "SLURM_LOCALID": "0",
        "SLURM_GTIDS": str(node), "SLURMD_NODENAME": host, "SLURM_TOPOLOGY_ADDR": host,
        "SLURM_CPUS_ON_NODE": "8", "SLURM_DISTRIBUTION": "cyclic", "SLURM_CLUSTER_NAME": "c1",
        "SLURM_SUBMIT_HOST": "login1", "SLURM_SUBMIT_DIR": "/home/u",
        "SLURM_SRUN_COMM_HOST": "10.0.0.1", "SLURM_STEP_LAUNCHER_PORT": "40000",
    }  # fmt: skip
    if gpus:
        env |= {"SLURM_GPUS_ON_NODE": gpus, "SLURM_GPUS_PER_NODE": f"a100:{gpus}"}
    return env


def pytorchjob(replica: int, port: str = "23456", addr: str = "train-master-0") -> dict[str, str]:
    """A 2-replica PyTorchJob (training-operator v1): the master is replica 0."""
    return {
        "KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443",
        "PYTHONUNBUFFERED": "0", "MASTER_ADDR": addr, "MASTER_PORT": port,
        "WORLD_SIZE": "2", "RANK": str(replica), "PET_NPROC_PER_NODE": "2",
    }  # fmt: skip


TRAINER_POD = {  # Kubeflow Trainer's torch plugin, node 1 of a 2-node TrainJob (a JobSet)
    "KUBERNETES_SERVICE_HOST": "10.96.0.1", "JOB_COMPLETION_INDEX": "1",
    "PET_NNODES": "2", "PET_NPROC_PER_NODE": "auto", "PET_NODE_RANK": "1",
    "PET_MASTER_ADDR": "t-node-0-0.t", "PET_MASTER_PORT": "29400",
}  # fmt: skip


def mpirun(rank: int, port: str = "29511", addr: str | None = "host0") -> dict[str, str]:
    """``mpirun -np 2 --map-by ppr:1:node -x MASTER_ADDR -x MASTER_PORT`` (Open MPI 4)."""
    env = {
        "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": str(rank),
        "OMPI_COMM_WORLD_LOCAL_SIZE": "1", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
        "OMPI_COMM_WORLD_NODE_RANK": "0", "OMPI_UNIVERSE_SIZE": "2",
        "OMPI_MCA_orte_ess_num_procs": "2", "PMIX_RANK": str(rank),
    }  # fmt: skip
    if addr is not None:
        env |= {"MASTER_ADDR": addr, "MASTER_PORT": port}
    return env


def facts(env: dict[str, str]) -> tuple[str, dict[str, str]]:
    detected = detect(MappingProxyType(env))  # read-only: detect writes nothing
    assert detected is not None and detected.problems == ()
    return detected.scheduler, {f.dest: f.value for f in detected.facts}


STATIC = {"rdzv_backend": "static"}


@pytest.mark.parametrize(
    ("env", "scheduler", "expected"),
    [
        (srun_step("123456", 0, gpus="4"), "slurm", {**STATIC, "nnodes": "2", "node_rank": "0",
         "master_addr": "node01", "master_port": "18456", "rdzv_id": "slurm-123456.0",
         "nproc_per_node": "4"}),
        (srun_step("123456", 1), "slurm", {**STATIC, "nnodes": "2", "node_rank": "1",
         "master_addr": "node01", "master_port": "18456", "rdzv_id": "slurm-123456.0",
         "nproc_per_node": "1"}),
        (pytorchjob(0), "kubeflow-pytorchjob", {**STATIC, "nnodes": "2", "node_rank": "0",
         "master_addr": "train-master-0", "master_port": "23456"}),
        (pytorchjob(1), "kubeflow-pytorchjob", {**STATIC, "nnodes": "2", "node_rank": "1",
         "master_addr": "train-master-0", "master_port": "23456"}),
        (TRAINER_POD, "kubeflow-trainer", STATIC),  # the rest are PET_*, read by the parser
        (mpirun(1), "openmpi", {**STATIC, "nnodes": "2", "node_rank": "1",
         "master_addr": "host0", "master_port": "29511"}),
        ({"PMI_SIZE": "2", "PMI_RANK": "0", "MPI_LOCALNRANKS": "1", "MASTER_ADDR": "h0",
          "MASTER_PORT": "1234"}, "pmi", {**STATIC, "nnodes": "2", "node_rank": "0",
         "master_addr": "h0", "master_port": "1234"}),
        # the first match wins: mpirun inside an sbatch script is mpirun's...
        ({**srun_step("5", 0), **mpirun(1)}, "openmpi", {**STATIC, "nnodes": "2",
         "node_rank": "1", "master_addr": "host0", "master_port": "29511"}),
        # ...and srun --mpi=pmi2 (PMI_RANK/PMI_SIZE, no Hydra MPI_LOCALNRANKS) stays Slurm's
        ({**srun_step("5", 1), "PMI_RANK": "1", "PMI_SIZE": "2"}, "slurm", {**STATIC,
         "nnodes": "2", "node_rank": "1", "master_addr": "node01", "master_port": "15005",
         "rdzv_id": "slurm-5.0", "nproc_per_node": "1"}),
    ],
)  # fmt: skip
def test_detection_table(env: dict[str, str], scheduler: str, expected: dict[str, str]) -> None:
    assert facts(env) == (scheduler, expected)


def test_no_scheduler_and_a_shell_with_rank_are_not_detected() -> None:
    assert detect({}) is None
    assert detect({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "x"}) is None  # no pod


def test_gpus_per_node_with_a_type() -> None:
    env = {**srun_step("9", 0), "SLURM_GPUS_PER_NODE": "a100:2,v100:1(S:0)"}
    assert facts(env)[1]["nproc_per_node"] == "3"


def test_trainer_pod_is_a_static_job_from_pet_variables() -> None:
    config = parse_config([SCRIPT], {**TRAINER_POD, "PET_NPROC_PER_NODE": "2"})
    assert (
        config.rendezvous.rdzv_backend,
        config.rendezvous.max_nodes,
        config.rendezvous.node_rank,
    ) == ("static", 2, 1)
    assert (
        config.rendezvous.master_addr,
        config.rendezvous.master_port,
        config.workers.nproc_per_node,
    ) == (
        "t-node-0-0.t",
        29400,
        2,
    )
    assert config.derived == (
        "kubeflow-trainer: --rdzv-backend static (from PET_MASTER_ADDR and a node rank: "
        "torchrun's static)",
    )


def test_elastic_pytorchjob_keeps_its_backend_and_drops_the_static_facts() -> None:
    env = {**pytorchjob(1), "PET_RDZV_BACKEND": "c10d", "PET_NNODES": "1:3",
           "PET_RDZV_ENDPOINT": "train-worker-0:29400"}  # fmt: skip
    config = parse_config([SCRIPT], env)
    assert (
        config.rendezvous.rdzv_backend,
        config.rendezvous.min_nodes,
        config.rendezvous.max_nodes,
    ) == ("c10d", 1, 3)
    assert config.rendezvous.rdzv_endpoint == "train-worker-0:29400"
    assert config.derived == ()  # every fact came from PET_*, one source each


def test_explicit_flags_and_pet_variables_win() -> None:
    env = {**srun_step("123456", 1), "PET_MASTER_PORT": "4444"}
    config = parse_config(["--node-rank", "0", "--master-addr", "localhost", SCRIPT], env)
    assert (
        config.rendezvous.node_rank,
        config.rendezvous.master_addr,
        config.rendezvous.master_port,
    ) == (0, "localhost", 4444)
    assert (
        config.rendezvous.max_nodes,
        config.rendezvous.rdzv_backend,
        config.rendezvous.rdzv_id,
    ) == (
        2,
        "static",
        "slurm-123456.0",
    )
    assert not any("--node-rank" in line or "--master" in line for line in config.derived)
    # --nnodes 1 makes it a one-node job: no static facts are used
    one = parse_config(["--nnodes", "1", SCRIPT], env)
    assert one.rendezvous.max_nodes == 1 and not any("--node-rank" in line for line in one.derived)
    assert parse_config(["--scheduler", "none", SCRIPT], env).derived == ()
    assert parse_config(["--standalone", SCRIPT], env).derived == ()
    assert parse_config(["--scheduler", "slurm", SCRIPT], env).rendezvous.max_nodes == 2


def test_trainer_node_rank_from_the_completion_index() -> None:
    pod = {k: v for k, v in TRAINER_POD.items() if k != "PET_NODE_RANK"}
    assert parse_config(["--nproc-per-node", "1", SCRIPT], pod).rendezvous.node_rank == 1


def test_batch_script_one_node_runs_and_many_nodes_are_refused() -> None:
    batch = {"SLURM_JOB_ID": "31", "SLURM_JOB_NUM_NODES": "1", "SLURM_NNODES": "1",
             "SLURM_JOB_NODELIST": "node07", "SLURM_NODEID": "0", "SLURM_PROCID": "0",
             "SLURM_GPUS_ON_NODE": "2"}  # fmt: skip
    config = parse_config([SCRIPT], batch)
    assert (
        config.rendezvous.max_nodes,
        config.workers.nproc_per_node,
        config.rendezvous.rdzv_id,
    ) == (1, 2, "slurm-31.batch")
    many = {**batch, "SLURM_JOB_NUM_NODES": "4", "SLURM_NNODES": "4"}
    with pytest.raises(UsageError, match="srun --ntasks-per-node=1 phalanx"):
        parse_config([SCRIPT], many)
    assert parse_config(["--nnodes", "1", SCRIPT], many).rendezvous.max_nodes == 1


def test_mpi_rdzv_endpoint_names_the_store() -> None:
    config = parse_config(["--rdzv-endpoint", "host7:2345", SCRIPT], mpirun(1, addr=None))
    assert (
        config.rendezvous.rdzv_backend,
        config.rendezvous.master_addr,
        config.rendezvous.master_port,
    ) == (
        "static",
        "host7",
        2345,
    )
    assert (config.rendezvous.node_rank, config.rendezvous.max_nodes) == (1, 2)
    one = {
        "OMPI_COMM_WORLD_SIZE": "1",
        "OMPI_COMM_WORLD_RANK": "0",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "1",
    }
    assert parse_config([SCRIPT], one).rendezvous.max_nodes == 1  # one rank: no endpoint needed


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({**srun_step("8", 0), "SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURM_NTASKS_PER_NODE": "2"},
         "slurm: SLURM_STEP_TASKS_PER_NODE=2(x2) starts 2 phalanx on one node; phalanx starts the "
         "node's workers itself: run one task per node, 'srun --ntasks-per-node=1 phalanx ...'"),
        ({**mpirun(0), "OMPI_COMM_WORLD_LOCAL_SIZE": "2"},
         "openmpi: OMPI_COMM_WORLD_LOCAL_SIZE=2: that many phalanx on one node; phalanx starts "
         "the node's workers itself: one MPI rank per node, --map-by ppr:1:node"),
        (mpirun(0, addr=None),
         "openmpi: MPI does not say which host rank 0 is on and MASTER_ADDR is not set: pass it "
         "(mpirun -x MASTER_ADDR=<host of rank 0> -x MASTER_PORT=<port>), or give --master-addr "
         "or --rdzv-endpoint"),
    ],
)  # fmt: skip
def test_refusals_are_one_line_exit_2(env: dict[str, str], message: str) -> None:
    done = subprocess.run([*PHALANX, SCRIPT], capture_output=True, text=True, timeout=60,
                          env=scheduler_env(**env))  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.splitlines()[0].startswith(f"phalanx: error: {message}")
    assert len(done.stderr.splitlines()) == (2 if "MASTER_ADDR" in message else 1), done.stderr


def test_dry_run_under_slurm_shows_the_derived_facts() -> None:
    env = scheduler_env(**srun_step("123456", 1, gpus="2"))
    done = subprocess.run([*PHALANX, "--dry-run", SCRIPT], capture_output=True, text=True,
                          timeout=60, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[:7] == [
        "slurm: --nproc-per-node 2 (from SLURM_GPUS_ON_NODE)",
        "slurm: --rdzv-id slurm-123456.0 (from SLURM_JOB_ID, SLURM_STEP_ID)",
        "slurm: --nnodes 2 (from SLURM_STEP_NUM_NODES)",
        "slurm: --rdzv-backend static (from a fixed node count and SLURM_NODEID)",
        "slurm: --node-rank 1 (from SLURM_NODEID)",
        "slurm: --master-addr node01 (from first host of SLURM_STEP_NODELIST)",
        "slurm: --master-port 18456 (from 15000 + SLURM_JOB_ID % 10000)",
    ]
    assert "run id slurm-123456.0, node 1 of 2, world size 4" in lines
    assert "local rank 1 -> global rank 3 (rank3)" in lines


def _two_nodes(
    envs: list[dict[str, str]], tmp_path: Path, *flags: str, said: str = ""
) -> list[dict[str, object]]:
    """Start one agent per environment (no rendezvous flag), wait, return every rank's dump;
    ``said``: a line node 1's agent prints at start."""
    out = tmp_path / "out"
    out.mkdir()
    args = [*flags, "--log-dir", str(tmp_path / "logs"), worker("world_env.py"), str(out)]
    with (
        launched(args, env=scheduler_env(**TOKEN, **envs[0])) as node0,
        launched(args, env=scheduler_env(**TOKEN, **envs[1])) as node1,
    ):
        results = [(node.wait(180), *node.communicate(timeout=30)) for node in (node0, node1)]
    assert [code for code, _, _ in results] == [0, 0], results
    assert not said or said in results[1][2].splitlines(), results[1][2]
    dumps = [json.loads((out / f"rank_{rank}.json").read_text()) for rank in range(4)]
    for rank, dump in enumerate(dumps):
        assert dump["seen"] == {"rank": rank, "world": 4, "sum": 10.0}
        env = dump["env"]
        assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"]) == (
            str(rank),
            "4",
            str(rank % 2),
        )
        assert env["GROUP_RANK"] == str(rank // 2)
    return [dict(d) for d in dumps]


@pytest.mark.slow
def test_srun_two_nodes_form_one_world(tmp_path: Path) -> None:
    job = slurm_job_id_with_free_port()
    nodelist = "localhost,node02"
    envs = [srun_step(job, node, nodelist, gpus="2") for node in (0, 1)]
    dumps = _two_nodes(envs, tmp_path, said="phalanx: slurm: --node-rank 1 (from SLURM_NODEID)")
    assert {d["env"]["TORCHELASTIC_RUN_ID"] for d in dumps} == {f"slurm-{job}.0"}  # type: ignore[index]


@pytest.mark.slow
def test_pytorchjob_two_replicas_form_one_world(tmp_path: Path) -> None:
    port = str(free_port())
    dumps = _two_nodes(
        [pytorchjob(0, port, "localhost"), pytorchjob(1, port, "localhost")], tmp_path
    )
    # The node-level RANK (the replica) and WORLD_SIZE (the replicas) never reach a worker:
    # node 1's first worker is rank 2, not 1.
    assert dumps[2]["env"]["RANK"] == "2" and dumps[2]["env"]["WORLD_SIZE"] == "4"  # type: ignore[index]


@pytest.mark.slow
def test_mpirun_two_ranks_form_one_world(tmp_path: Path) -> None:
    port = str(free_port())
    _two_nodes([mpirun(0, port, "localhost"), mpirun(1, port, "localhost")], tmp_path,
               "--nproc-per-node", "2")  # fmt: skip


def test_hosts_refusing_a_flag_names_the_variable_it_came_from() -> None:
    with pytest.raises(UsageError) as caught:
        parse_config(["--hosts", "h1:1,h2:1", SCRIPT], {"PET_NODE_RANK": "1"})
    assert caught.value.problems == [
        "--node-rank cannot be used with --hosts/--hostfile: the host list sets it "
        "(it came from PET_NODE_RANK=1)"
    ]
    with pytest.raises(UsageError, match=r"the host list sets it$"):
        parse_config(["--hosts", "h1:1,h2:1", "--node-rank", "1", SCRIPT], {})
    # --nnodes is taken with a host list (a host beyond it waits as a spare)
    parse_config(["--hosts", "h1:1,h2:1,h3:1", "--nnodes", "2", SCRIPT], {})
    # under a scheduler, a host list reads no scheduler: its own list says it all
    assert parse_config(["--hosts", "h1:1", SCRIPT], srun_step("3", 1)).derived == ()
