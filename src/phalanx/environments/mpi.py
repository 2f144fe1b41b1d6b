"""``mpirun -np K --map-by ppr:1:node phalanx ...``: one MPI rank per node is one node.

Open MPI and PMI (MPICH's and Intel MPI's Hydra) only rename the same three numbers, so
they are rows of ``MPI_VARS``. MPI does not say which host rank 0 is on, so the static
store's address comes from ``MASTER_ADDR``/``MASTER_PORT`` (``mpirun -x``), or from
``--master-addr``/``--master-port`` or ``--rdzv-endpoint``; a job of one rank needs none.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from phalanx.environments.facts import Derive, Detected, Fact, LauncherVars, Problem, no_default


@dataclass(frozen=True)
class MpiVars:
    name: str
    size: str
    rank: str
    local_size: str
    local_rank: str  # a worker's rank on its node (when the ranks are workers: phalanx.init)
    pass_env: str  # how this launcher passes a variable to every rank


MPI_VARS = {
    "openmpi": MpiVars(
        "openmpi", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
        "mpirun -x MASTER_ADDR=<host of rank 0> -x MASTER_PORT=<port>",
    ),
    "pmi": MpiVars(
        "pmi", "PMI_SIZE", "PMI_RANK", "MPI_LOCALNRANKS", "MPI_LOCALRANKID",
        "mpiexec -genv MASTER_ADDR <host of rank 0> -genv MASTER_PORT <port>",
    ),
}  # fmt: skip
ONE_PER_NODE_HINT = "--map-by ppr:1:node (mpiexec: -ppn 1)"


def markers(name: str) -> tuple[str, ...]:
    mv = MPI_VARS[name]
    return (mv.size, mv.rank, mv.local_size)


def read(name: str, env: Mapping[str, str]) -> Detected:
    mv = MPI_VARS[name]
    problems: list[Problem] = []
    numbers: dict[str, int] = {}
    for var, unless in ((mv.size, "nnodes"), (mv.rank, "node_rank"), (mv.local_size, "")):
        raw = env[var].strip()
        if raw.isascii() and raw.isdigit():
            numbers[var] = int(raw)
        else:
            problems.append(
                Problem(f"{name}: {var}={raw!r} is not a number", (unless,) if unless else ())
            )
    if problems:
        return Detected(name, (), tuple(problems))
    if numbers[mv.local_size] > 1:
        problems.append(Problem(
            f"{name}: {mv.local_size}={numbers[mv.local_size]}: that many phalanx on one node; "
            f"phalanx starts the node's workers itself: one MPI rank per node, {ONE_PER_NODE_HINT}"
        ))  # fmt: skip
    size = numbers[mv.size]
    facts = [Fact("nnodes", str(size), f"{mv.size}, one rank per node")]
    if size > 1:
        facts += [
            Fact("rdzv_backend", "static", f"{mv.size} and {mv.rank}: fixed node ranks"),
            Fact("node_rank", str(numbers[mv.rank]), mv.rank),
        ]
        for var, dest in (("MASTER_ADDR", "master_addr"), ("MASTER_PORT", "master_port")):
            if env.get(var, "").strip():
                facts.append(Fact(dest, env[var].strip(), f"{var}, passed by the launcher"))
            else:
                problems.append(Problem(
                    f"{name}: MPI does not say which host rank 0 is on and {var} is not set: "
                    f"pass it ({mv.pass_env}), or give --{dest.replace('_', '-')} or --rdzv-endpoint",
                    (dest, "rdzv_endpoint"),
                ))  # fmt: skip
    return Detected(name, tuple(facts), tuple(problems))


def _localhost_if_one_node(mv: MpiVars) -> Derive:
    def derive(env: Mapping[str, str]) -> str | None:
        one_node = mv.local_size in env and env.get(mv.local_size) == env.get(mv.size)
        return "localhost" if one_node else None

    return derive


def _launcher(mv: MpiVars) -> LauncherVars:
    """The ranks ``mpirun``/``mpiexec`` start as workers: each rank is one worker."""
    hint = "pass them with " + mv.pass_env.replace("MASTER_PORT=<port>", "MASTER_PORT=<free port>")
    return LauncherVars(
        mv.name, mv.rank, mv.rank, mv.local_rank, mv.size,
        _localhost_if_one_node(mv), no_default, hint,
    )  # fmt: skip


LAUNCHERS = tuple(_launcher(mv) for mv in MPI_VARS.values())
