"""The argparse parser: torchrun 2.13's flags in both spellings, ``PET_*`` fallbacks, and
phalanx's own additions. Values stay strings here; ``cli.convert`` validates and types them.
Long on purpose: ``build_parser`` is the flag table in ``--help``'s order (help prose: usage)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any, NoReturn

from phalanx.cli.usage import DESCRIPTION, EPILOG, KEEP_WARM_HELP, USAGE, HelpFormatter
from phalanx.errors import UsageError
from phalanx.version import __version__


class _Parser(argparse.ArgumentParser):
    """Reports usage errors as a ``UsageError`` (one line, exit 2) instead of printing usage."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def _spellings(flag: str) -> list[str]:
    dashed = f"--{flag}"
    underscored = f"--{flag.replace('-', '_')}"
    return [dashed] if dashed == underscored else [dashed, underscored]


def build_parser(environ: Mapping[str, str], given_only: bool = False) -> argparse.ArgumentParser:
    """Build the parser; ``PET_<DEST>`` in ``environ`` supplies a flag's default where torchrun
    reads one (and for phalanx's own flags). ``given_only``: no defaults at all, so a parse
    holds only the flags the command line gave (``cli.scheduler``: explicit flags win)."""
    parser = _Parser(
        prog="phalanx",
        usage=USAGE,
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=HelpFormatter,
        allow_abbrev=False,  # torchrun's abbreviations: cli.abbrev, before the script only
    )
    parser.add_argument("--version", action="version", version=f"phalanx {__version__}")

    def option(
        flag: str, default: Any, help: str, *names: str, pet: bool = True, **kwargs: Any
    ) -> None:
        dest = flag.replace("-", "_")
        env_default = environ.get(f"PET_{dest.upper()}") if pet else None
        parser.add_argument(
            *names,
            *_spellings(flag),
            dest=dest,
            default=argparse.SUPPRESS
            if given_only
            else (env_default if env_default is not None else default),
            help=help,
            **kwargs,
        )

    def switch(flag: str, help: str, *names: str) -> None:
        dest = flag.replace("-", "_")
        env_value = environ.get(f"PET_{dest.upper()}", "")
        parser.add_argument(
            *names,
            *_spellings(flag),
            dest=dest,
            action="store_true",
            default=argparse.SUPPRESS
            if given_only
            else env_value.strip().lower() in {"1", "true", "yes"},
            help=help,
        )

    option(
        "nnodes",
        "1",
        "Number of nodes, or MIN:MAX for an elastic job. Agents beyond MAX wait as hot "
        "spares: a lost or excluded member's place goes to one in the next round (a restart "
        "and the heartbeat timeout; a spare waits as long as the job runs, then exits 0).",
    )
    option("nproc-per-node", "1", "Workers per node: an integer, auto, cpu, gpu or xpu.")
    option(
        "rdzv-backend",
        "static",
        "Rendezvous backend: static (node 0 hosts the store at --master-addr:--master-port, "
        "or at --rdzv-endpoint if given), c10d, etcd or etcd-v2. As in torchrun, one node "
        "without --master-port or --rdzv-endpoint meets on a free port instead.",
    )
    option(
        "rdzv-endpoint",
        "",
        "Rendezvous endpoint, host[:port] ([ipv6]:port for IPv6); c10d: localhost:29400 if empty, "
        "or host:port,host:port,...: where the store serves, in order, if its host is lost.",
    )
    option("rdzv-id", "none", "Job id; jobs with different ids never mix on one endpoint.")
    option(
        "rdzv-conf",
        "",
        "Rendezvous settings, key=value[,key=value...]. etcd's password: password_file=PATH "
        "or the PHALANX_ETCD_PASSWORD variable (password=... works but ps shows it).",
    )
    switch("standalone", "Single node: a local rendezvous on a free port (rdzv flags are ignored).")
    option("max-restarts", "0", "Restarts of the whole worker group before the job fails.")
    option(
        "monitor-interval",
        "0.1",
        "Seconds between rendezvous checks. Local worker exits are noticed as events, not by polling.",
    )
    option(
        "start-method",
        "spawn",
        "Accepted for torchrun compatibility; workers are forked from the warm-start template, or exec'd with --cold-start.",
        choices=["spawn", "fork", "forkserver"],
    )
    option("event-log-handler", "null", "Accepted for torchrun compatibility (null or console).")
    option("role", "default", "Role name of the workers (ROLE_NAME).")
    switch("module", "Run the program as a module, like python -m.", "-m")
    switch("no-python", "Execute the program directly instead of with python.")
    switch("run-path", "Run the script with runpy.run_path inside phalanx's worker bootstrap.")
    option(
        "log-dir",
        None,
        "Base directory for run directories (default: $TMPDIR/phalanx-<uid>, yours only, "
        "mode 0700; refused if someone else owns it, it is a symlink, or others may write "
        "to it). An explicit directory is followed as given, refused only if anyone may "
        "write to it without the sticky bit; what phalanx makes below it is mode 0700 and "
        "never reached through a symlink. Each run's directory is printed at start.",
    )
    option(
        "redirects",
        "0",
        "Streams to keep out of the console (log file only): 0-3 or RANK:N,...",
        "-r",
    )
    option(
        "tee",
        "0",
        "Streams that go to the console as well as the log file, as --redirects; a stream "
        "both redirected and teed is shown (torchrun's rule).",
        "-t",
    )
    option("local-ranks-filter", "", "Show only these local ranks on the console, e.g. 0,1.")
    option(
        "duplicate-stdout-filters",
        "",
        "Also copy stdout lines containing any of these words to a file.",
    )
    option(
        "duplicate-stderr-filters",
        "",
        "Also copy stderr lines containing any of these words to a file.",
    )
    option("node-rank", "0", "Rank of this node (static rendezvous).")
    option("master-addr", "127.0.0.1", "Address of node 0 (static rendezvous).")
    option(
        "master-port",
        None,
        "Port of node 0's rendezvous store (static rendezvous; default: 29500, or a free "
        "port on one node without --rdzv-endpoint, as torchrun).",
    )
    option(
        "worker-port",
        None,
        "The workers' MASTER_PORT, the same in every round, restarts included (global rank "
        "0's store listens there). Default: a free port on rank 0's node each round, shown "
        "in the round's line. torchrun's static form gives the workers --master-port; on "
        "several nodes phalanx's node 0 holds that port for the agents' store all along, so "
        "a site that opens only known ports gives this one too and opens both (Gloo and "
        "NCCL still pick ports of their own).",
    )
    option("local-addr", None, "Address other nodes reach this node at (default: its hostname).")
    # torchrun reads no PET_LOGS_SPECS or PET_NUMA_BINDING (plain argparse options there), so
    # a variable left in the environment must not refuse or change a job here either.
    option(
        "logs-specs",
        None,
        "torchrun's torchrun.logs_specs entry point name: 'default' (phalanx's own logging) "
        "or another registered one (accepted, not applied: a warning says so).",
        pet=False,
    )
    option(
        "numa-binding",
        None,
        "Accepted for torchrun compatibility; not applied (a warning at start says so).",
        pet=False,
        choices=["node", "socket", "exclusive", "core-complex"],
    )
    option(
        "signals-to-handle", "SIGTERM,SIGINT,SIGHUP,SIGQUIT", "Signals forwarded to the workers."
    )
    option(
        "preempt-signals",
        None,
        "Signals that mean the job is preempted, SIG[,SIG...] or none (default: SIGUSR1,SIGTERM "
        "under SLURM, SIGTERM under Kubernetes, none elsewhere). Forwarded to every worker of "
        "every node, where phalanx.preempted() turns True; the job then has --preempt-grace "
        "seconds to save and exit, and exits 75 (preempted: run it again). Not an interrupt: "
        "a second signal during the grace stops it at once.",
    )
    option(
        "preempt-grace",
        "25",
        "Seconds from the first node's preemption signal until every worker of the job is "
        "stopped (SIGTERM, then SIGKILL, from 5 s before). Default 25: within Kubernetes' "
        "default 30 s grace; under sbatch --signal=USR1@90 raise it to about 80.",
    )
    switch(
        "requeue",
        "After a preemption under SLURM, node rank 0 runs 'scontrol requeue $SLURM_JOB_ID'; "
        "nodes the --exclude-file lists are kept out of the requeued job (ExcNodeList).",
    )
    option(
        "shutdown-timeout",
        None,
        "Seconds between SIGTERM and SIGKILL when stopping workers (default: "
        "$TORCH_ELASTIC_SHUTDOWN_TIMEOUT, else 5; torchrun's fallback is 30).",
    )
    switch("virtual-local-rank", "LOCAL_RANK=0 for every worker, each seeing only its GPU.")
    switch("dry-run", "Print the plan (ranks, argv, environment per worker) and exit.")
    switch(
        "cold-start",
        "Start every worker as a new python process, as torchrun does. By default phalanx imports "
        "torch once per node in a template and forks the workers from it (else starts cold).",
    )
    option(
        "preload",
        "",
        "Modules the warm-start template imports besides torch, MOD[,MOD...] (e.g. numpy): once "
        "per node before the ranks are known, so they must not read RANK/LOCAL_RANK or start "
        "threads. torch.use_deterministic_algorithms imports torch._inductor.config: preload it. "
        "Without --preload the template imports torch only if the program's source (its own "
        "modules followed) may import it; any --preload (torch too) makes it import torch.",
    )
    option("keep-warm", "0", KEEP_WARM_HELP, metavar="SECONDS")
    switch(
        "spawn-owner",
        "The script spawns its own workers (TRELLIS.2 style, torch.multiprocessing.spawn): start ONE "
        "process per node and append --num_nodes --node_rank --num_gpus --master_addr --master_port "
        "(values from this node's rendezvous; --nproc-per-node is --num_gpus).",
    )
    option(
        "spawn-owner-flags",
        "",
        "Rename the appended flags, e.g. num_gpus=--gpus,master_port=--port "
        "(facts: num_nodes, node_rank, num_gpus, master_addr, master_port).",
    )
    option(
        "hang-watch",
        "on",
        "Name a rank silent past max(floor, factor x p99 of its step gaps), or grace before its "
        "3rd beat and in phalanx.pause(): a line, every rank's stack; the job goes on, the round "
        "fails at 10x. on (floor=60,factor=5,grace=300), off, or key=value[,...].",
    )
    option(
        "stall-timeout",
        "0",
        "Seconds without progress after which the round fails as a hang at once, in place of "
        "--hang-watch (0, the default: off): a fixed bound; every rank's stack, a hang report.",
    )
    option(
        "exclude-after",
        "0",
        "Exclude a node whose worker is the job's root cause K failed rounds in a row (0, the "
        "default: never). Its agent leaves (exit 69) and is written to excluded.jsonl in the "
        "run directory (and to --exclude-file); an elastic job (--nnodes MIN:MAX) re-forms "
        "without it, at the cost of one restart and the heartbeat timeout.",
    )
    option(
        "exclude-file",
        None,
        "A file of excluded nodes shared across runs: exclusions are added to it, and an "
        "agent on a node it lists leaves at start (exit 69) before joining. With --hosts/"
        "--hostfile a host it lists is not started; the next host takes its place.",
    )
    switch(
        "allow-mismatch",
        "Multi-node: start even when the nodes differ in Python, phalanx, torch, CUDA or "
        "NCCL version, or in the content of the script or of a file named on its command "
        "line (compared at the rendezvous, as sha256 hashes). Without it such a job stops "
        "on every node before any worker starts, with a table of the nodes that differ "
        "(exit 2); with it the table is a warning.",
    )
    switch(
        "allow-per-node-args",
        "Accepted and does nothing (kept for command lines written for earlier phalanx "
        "versions): script arguments may differ between nodes, as under torchrun; each round "
        "whose nodes differ in them names the arguments in one line and a "
        "script_args_differ event. The code, the files they name and the versions are "
        "still compared (--allow-mismatch).",
    )
    option(
        "metrics-port",
        None,
        "Serve this node's restarts, failures by kind, rendezvous seconds, time to first "
        "step and each rank's steps/s as Prometheus metrics on this port (/metrics; needs "
        "phalanx[metrics]). A port in use stops the launch before anything starts.",
    )
    option(
        "metrics-addr",
        "127.0.0.1",
        "Address the metrics listen on (default 127.0.0.1, this host only: anyone who can "
        "reach the port reads them; give 0.0.0.0 for a Prometheus on another host).",
    )
    option(
        "node-check",
        "warn",
        "Multi-node: check every node before a round whose agents changed (the first round, "
        "a node that joined, left or came back; a restart with the same agents, which "
        "passed it, does not repeat it; single-node jobs skip it): a "
        "fixed matmul on the workers' device, a TCP test of each node's link to the next "
        "(latency, 4 MiB each way), the run and checkpoint directories writable and not "
        "full, on GPUs the device count. A node far below the round's median is named in one "
        "line (log, events, phalanx status, report.json). warn (the default): name it and "
        "start (after the first round, beside the workers); exclude: a named node leaves the "
        'job (exit 69); off: no check (see docs/how-to/nodes.md, "Node check").',
        choices=["off", "warn", "exclude"],
    )
    option(
        "node-check-thresholds",
        "",
        "When the node check names a node, key=value[,...]: compute=3 (its matmul under "
        "1/3 of the median), throughput=10 (its best link under 1/10 of the median), "
        "latency=10,latency_ms=20 (its best link's round trip over 10x the median and 20 ms "
        "above it), min_free_mb=100 (free space in the run/checkpoint directory).",
    )
    option(
        "checkpoint-dir",
        None,
        "The job's checkpoint directory: the node check also makes sure it is writable and "
        "not full on every node (nothing else reads it).",
    )
    option(
        "straggler-action",
        "warn",
        "While training, a rank whose step rate (optimizer steps, phalanx.step()) stays below "
        "--straggler-fraction of the other ranks' median for --straggler-window seconds is a "
        "straggler: named in one line with its rate and the median (log, events, phalanx "
        "status, metrics, timeline). warn (the default): name it; exclude: its node leaves the "
        "job (exit 69) and an elastic job (--nnodes MIN:MAX) re-forms without it from the last "
        "checkpoint; off: not watched. Ranks that all-reduce every step move together: there "
        "the rates cannot tell who is slow.",
        choices=["off", "warn", "exclude"],
    )
    option(
        "straggler-fraction",
        "0.5",
        "A straggler's step rate is below this fraction of the others' median (0..1, default 0.5).",
    )
    option(
        "straggler-window",
        "60",
        "Seconds over which a straggler's step rate stays low before it is named (default 60: "
        "a checkpoint or a slow batch names nobody).",
    )
    option(
        "hostfile",
        None,
        "Start the job on every host listed, over ssh: DeepSpeed's format, one 'host slots=N' "
        "per line, '#' comments (a host without slots gets --nproc-per-node). The first host "
        "hosts the rendezvous; every host runs this Python in this directory. With --nnodes, "
        "hosts beyond MAX wait as spares.",
        pet=False,
    )
    option("hosts", None, "Like --hostfile, inline in Horovod's form: h1:8,h2:8.", pet=False)
    option(
        "ssh-config",
        None,
        "With --hosts/--hostfile: ssh's config file (ssh -F); ports, users and keys come from it.",
        pet=False,
    )
    parser.add_argument(
        "--env",
        dest="env",
        action="append",
        default=[],
        metavar="NAME",
        help="With --hosts/--hostfile: also forward this variable (repeatable). Forwarded "
        "always: NCCL_*, PYTHON*, CUDA_*, PET_*, OMP_*; the list is printed at start.",
    )
    option(
        "env-file",
        None,
        "With --hosts/--hostfile: more variables to forward, a NAME or NAME=VALUE per line.",
        pet=False,
    )
    option(
        "scheduler",
        "auto",
        "Read the node count, node rank and rendezvous from the scheduler that started "
        "phalanx: auto (the default: detect SLURM, Kubeflow, Open MPI or PMI), none, or one "
        "of their names. What is derived is printed at start, one line per fact, naming its "
        "variable; flags given (or PET_<FLAG> variables) win.",
        pet=False,
    )
    parser.add_argument("training_script", help="The script (or module, or program) to run.")
    parser.add_argument(
        "training_script_args",
        nargs=argparse.REMAINDER,
        help="Arguments for the script, passed through untouched.",
    )
    return parser
