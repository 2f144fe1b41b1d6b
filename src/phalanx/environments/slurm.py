"""Slurm: ``srun phalanx train.py`` (one task per node) and ``phalanx`` in the batch script;
the ranks of an ``srun`` step (``phalanx.init()`` under ``srun python train.py``); its
preemption signals and ``scontrol requeue``.

In an ``srun`` step (``SLURM_STEP_ID`` a number) each task is one node of the job: the node
count is the step's, the node rank ``SLURM_NODEID``, the static store is hosted by the first
host of the step's nodelist on ``15000 + SLURM_JOB_ID % 10000``.

The batch script (or an ``salloc`` shell) is no step: it runs once, on the first node of
the allocation. There a one-node job is what it looks like; a job of N > 1 nodes is refused
(the other N-1 nodes would idle) with the ``srun`` line to use, unless ``--nnodes`` says
what is meant.
"""

from __future__ import annotations

import contextlib
import logging
import re
import shutil
import signal
import subprocess
import threading
from collections.abc import Iterator, Mapping, Sequence

from phalanx.environments.facts import Detected, Fact, LauncherVars, Problem, slurm_port

log = logging.getLogger("phalanx")

MARKERS = ("SLURM_JOB_ID",)
NODELISTS = ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
STEP_NODE_COUNTS = ("SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES")
JOB_NODE_COUNTS = ("SLURM_JOB_NUM_NODES", "SLURM_NNODES")
ONE_TASK_HINT = "srun --ntasks-per-node=1 phalanx ..."
# SIGUSR1: sbatch --signal=USR1@90, scancel --signal=USR1; SIGTERM: the end of a time limit,
# a preemption with GraceTime.
PREEMPT_SIGNALS = ("SIGUSR1", "SIGTERM")
_SCONTROL_TIMEOUT = 30.0


def _first(env: Mapping[str, str], names: tuple[str, ...]) -> str | None:
    return next((name for name in names if env.get(name, "").strip()), None)


def _count(env: Mapping[str, str], var: str, problems: list[Problem], unless: str) -> int | None:
    raw = env[var].strip()
    if raw.isascii() and raw.isdigit():
        return int(raw)
    problems.append(Problem(f"slurm: {var}={raw!r} is not a number", (unless,)))
    return None


def gpus_on_node(env: Mapping[str, str]) -> tuple[int, str]:
    """GPUs Slurm gave this node, and the variable that said so (0: none given)."""
    if (raw := env.get("SLURM_GPUS_ON_NODE", "").strip()).isdigit():
        return int(raw), "SLURM_GPUS_ON_NODE"
    # --gpus-per-node: "2", "a100:2", or one entry per type "a100:2,v100:1(S:0)"
    if raw := env.get("SLURM_GPUS_PER_NODE", "").strip():
        counts = [re.sub(r"\(.*\)$", "", part).rsplit(":", 1)[-1] for part in raw.split(",")]
        if all(count.isdigit() for count in counts):
            return sum(int(count) for count in counts), "SLURM_GPUS_PER_NODE"
    if raw := env.get("SLURM_JOB_GPUS", "").strip():  # the indices: "0,1"
        return len(raw.split(",")), "SLURM_JOB_GPUS"
    return 0, ""


def tasks_per_node(env: Mapping[str, str]) -> tuple[int, str] | None:
    """The most tasks of this step on one node (``2(x3),1`` -> 2) and its variable."""
    for var in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE"):
        if raw := env.get(var, "").strip():
            counts = re.findall(r"(\d+)(?:\(x\d+\))?(?:,|$)", raw)
            return (max(int(c) for c in counts) if counts else 0), var
    return None


def read(env: Mapping[str, str]) -> Detected:
    """The facts of a Slurm job for the phalanx started here (pure)."""
    job = env["SLURM_JOB_ID"].strip()
    step = env.get("SLURM_STEP_ID", "").strip()
    in_step = step.isdigit()
    facts: list[Fact] = []
    problems: list[Problem] = []
    gpus, gpu_var = gpus_on_node(env)
    facts.append(
        Fact("nproc_per_node", str(gpus), gpu_var)
        if gpus
        else Fact("nproc_per_node", "1", "SLURM_GPUS_ON_NODE unset: no GPUs")
    )
    facts.append(
        Fact(
            "rdzv_id", f"slurm-{job}.{step if in_step else 'batch'}", "SLURM_JOB_ID, SLURM_STEP_ID"
        )
    )
    nodes_var = _first(env, STEP_NODE_COUNTS if in_step else JOB_NODE_COUNTS)
    nodes = _count(env, nodes_var, problems, "nnodes") if nodes_var else 1
    if nodes is None:
        return Detected("slurm", tuple(facts), tuple(problems))
    facts.append(Fact("nnodes", "1" if not in_step else str(nodes), nodes_var or "no node count"))
    if not in_step:
        if nodes > 1:
            problems.append(Problem(
                f"slurm: this is the batch script (no SLURM_STEP_ID), which runs on the first "
                f"of the job's {nodes} nodes ({nodes_var}) only; start phalanx on every node "
                f"with '{ONE_TASK_HINT}', or pass --nnodes 1 to use this node alone",
                ("nnodes",),
            ))  # fmt: skip
        return Detected("slurm", tuple(facts), tuple(problems))
    if (per_node := tasks_per_node(env)) is not None and per_node[0] > 1:
        problems.append(Problem(
            f"slurm: {per_node[1]}={env[per_node[1]]} starts {per_node[0]} phalanx on one "
            f"node; phalanx starts the node's workers itself: run one task per node, "
            f"'{ONE_TASK_HINT}' (--ntasks-per-node=1)"
        ))  # fmt: skip
    if nodes > 1:
        facts += _static_facts(env, job, problems)
    return Detected("slurm", tuple(facts), tuple(problems))


def _static_facts(env: Mapping[str, str], job: str, problems: list[Problem]) -> list[Fact]:
    """Node rank, and where node 0 hosts the static store (first host, derived port)."""
    facts = [Fact("rdzv_backend", "static", "a fixed node count and SLURM_NODEID")]
    if "SLURM_NODEID" not in env:
        problems.append(Problem("slurm: SLURM_NODEID is not set", ("node_rank",)))
    elif (rank := _count(env, "SLURM_NODEID", problems, "node_rank")) is not None:
        facts.append(Fact("node_rank", str(rank), "SLURM_NODEID"))
    if (var := _first(env, NODELISTS)) is None:
        problems.append(
            Problem(
                "slurm: no nodelist (SLURM_STEP_NODELIST, SLURM_JOB_NODELIST)", ("master_addr",)
            )
        )
    else:
        try:
            facts.append(Fact("master_addr", first_host(env[var], var), f"first host of {var}"))
        except ValueError as exc:
            problems.append(Problem(f"slurm: {exc}", ("master_addr",)))
    port = slurm_port(job)
    if port is None:
        problems.append(Problem(f"slurm: SLURM_JOB_ID={job!r} is not a number", ("master_port",)))
    else:
        facts.append(Fact("master_port", str(port), "15000 + SLURM_JOB_ID % 10000"))
    return facts


def first_host(nodelist: str, what: str) -> str:
    """``nodelist.first_host``, imported only here: it imports python-hostlist, which no
    launch outside a Slurm allocation needs."""
    from phalanx.environments import nodelist as hostlists

    return hostlists.first_host(nodelist, what)


def _step_addr(env: Mapping[str, str]) -> str | None:
    for var in NODELISTS:
        if env.get(var):
            try:
                return first_host(env[var], var)
            except ValueError:
                return None  # reported as "cannot be derived", with the hint
    return None


def _step_port(env: Mapping[str, str]) -> str | None:
    # Every task of the job derives the same port (the CLI's static store uses the same one).
    port = slurm_port(env.get("SLURM_JOB_ID", ""))
    return None if port is None else str(port)


# Only inside an ``srun`` step (SLURM_STEP_ID set): the batch script itself also has
# SLURM_PROCID=0 but is not a worker.
LAUNCHER = LauncherVars(
    "slurm", "SLURM_STEP_ID", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS",
    _step_addr, _step_port, "export MASTER_ADDR and MASTER_PORT before srun",
)  # fmt: skip


def requeue(environ: Mapping[str, str], exclude: Sequence[str] = ()) -> None:
    """``scontrol requeue $SLURM_JOB_ID`` (``scontrol`` from PATH); any trouble is one
    warning: the job's own exit code (75) still tells a wrapper what happened.

    ``exclude``: Slurm node names kept out of the requeued job. Slurm changes a job's
    ``ExcNodeList`` only while it is pending, and a requeued job may start again at once, so
    then it is ``requeuehold``, ``update ExcNodeList=`` (the job's own list and these), then
    ``release``; the hold is released whatever the update did."""
    job_id = environ.get("SLURM_JOB_ID", "").strip()
    if not job_id:
        log.warning("--requeue: not under SLURM (no SLURM_JOB_ID); nothing requeued")
        return
    scontrol = shutil.which("scontrol", path=environ.get("PATH"))
    if scontrol is None:
        log.warning("--requeue: scontrol is not on PATH; job %s not requeued", job_id)
        return
    if not exclude:
        if _scontrol(scontrol, "requeue", job_id) is not None:
            log.info("requeued SLURM job %s (scontrol requeue)", job_id)
        return
    with _deaf_to_sigterm():
        if _scontrol(scontrol, "requeuehold", job_id) is None:
            return
        kept = _excluded_now(scontrol, job_id)
        nodes = ",".join(dict.fromkeys([*kept, *exclude]))
        updated = _scontrol(scontrol, "update", f"JobId={job_id}", f"ExcNodeList={nodes}")
        released = _scontrol(scontrol, "release", job_id)
    if updated is not None and released is not None:
        log.info(
            "requeued SLURM job %s without the excluded node(s) %s (ExcNodeList=%s)",
            job_id, ", ".join(exclude), nodes,
        )  # fmt: skip


@contextlib.contextmanager
def _deaf_to_sigterm() -> Iterator[None]:
    """SIGTERM ignored here and in the ``scontrol`` children (an ignored signal stays ignored
    across ``exec``): ``requeuehold`` ends the running job, and Slurm's SIGTERM to every
    process of the step would otherwise kill the ``update`` and ``release`` after it (SIGKILL
    comes only ``KillWait`` seconds later; these take milliseconds). Only the main thread
    may change a handler; elsewhere it is left as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def _excluded_now(scontrol: str, job_id: str) -> list[str]:
    """The job's own ``ExcNodeList`` (``sbatch --exclude``), kept beside the new ones."""
    shown = _scontrol(scontrol, "show", "job", "-o", job_id) or ""
    for word in shown.split():
        if word.startswith("ExcNodeList="):
            value = word.split("=", 1)[1]
            return [] if value in ("", "(null)") else [value]
    return []


def _scontrol(scontrol: str, *args: str) -> str | None:
    """``scontrol ARGS``' output, or None after one warning (it failed)."""
    what = f"scontrol {' '.join(args)}"
    try:
        done = subprocess.run(
            [scontrol, *args],
            capture_output=True,
            text=True,
            timeout=_SCONTROL_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("--requeue: %s failed: %s", what, exc)
        return None
    if done.returncode != 0:
        said = (done.stderr.strip().splitlines() or ["no message"])[-1]
        log.warning("--requeue: %s exited %d: %s", what, done.returncode, said)
        return None
    return done.stdout
