"""The launch configuration: plain, frozen, validated data. argparse never gets past ``cli``."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from phalanx.check_settings import CheckSettings
from phalanx.stragglers.settings import StragglerSettings


@dataclass(frozen=True)
class HostSlots:
    """One host of a host list (``hosts.hostfile`` reads them) and its worker count."""

    host: str  # the ssh destination, as written
    slots: int  # workers on that host

    @property
    def name(self) -> str:
        """The host without the user: what console lines and reports are labelled with."""
        return self.host.rpartition("@")[2]


DEFAULT_RDZV_ID = "none"  # torchrun's default --rdzv-id


def shown_run_id(run_id: str, quote: bool = True) -> str:
    """How messages name a run id (``quote``: in quotes), or, for the default one, that none
    was given: a user who gave no ``--rdzv-id`` never chose 'none'."""
    if run_id == DEFAULT_RDZV_ID:
        return "(no --rdzv-id given)"
    return repr(run_id) if quote else run_id


class LaunchMode(Enum):
    SCRIPT = "script"  # python -u script.py args
    MODULE = "module"  # python -u -m module args
    NO_PYTHON = "no_python"  # the program is executed directly
    RUN_PATH = "run_path"  # runpy.run_path(script) inside phalanx's worker bootstrap


@dataclass(frozen=True)
class LaunchConfig:
    program: str
    program_args: tuple[str, ...] = ()
    mode: LaunchMode = LaunchMode.SCRIPT
    nproc_per_node: int = 1
    min_nodes: int = 1
    max_nodes: int = 1
    standalone: bool = False
    rdzv_backend: str = "c10d"
    rdzv_endpoint: str = ""
    rdzv_id: str = DEFAULT_RDZV_ID
    rdzv_conf: tuple[tuple[str, str], ...] = ()
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    local_addr: str | None = None
    # The workers' MASTER_PORT in every round (phalanx.spawn: the port the program was given
    # and will use); None: a fresh free port per round.
    worker_port: int | None = None
    max_restarts: int = 0
    monitor_interval: float = 0.1
    shutdown_timeout: float = 5.0
    role: str = "default"
    log_dir: Path | None = None
    # Streams per local rank that go to the log file only, not to the console (torchrun's -r).
    redirects: dict[int, frozenset[str]] = field(default_factory=dict)
    local_ranks_filter: frozenset[int] | None = None
    # TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE: each console line's prefix, a string.Template of
    # ${role_name} ${rank} ${local_rank} (torchrun's); None: "[rankN]: " (plan.prefix).
    log_line_prefix_template: str | None = None
    # Lines containing any of these words are also copied to filtered_std{out,err}.log.
    duplicate_stdout_filters: tuple[str, ...] = ()
    duplicate_stderr_filters: tuple[str, ...] = ()
    signals_to_handle: tuple[str, ...] = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")
    # Signals that mean "you will be stopped" (a preemption, not an interrupt): forwarded to
    # every worker of every node, which then have ``preempt_grace`` seconds in all, counted
    # from the first node's signal; then the job exits REQUEUE_EXIT_CODE (75).
    preempt_signals: tuple[str, ...] = ()
    preempt_grace: float = 25.0
    requeue: bool = False  # under SLURM, node rank 0 runs ``scontrol requeue`` after one
    virtual_local_rank: bool = False
    start_method: str = "spawn"
    dry_run: bool = False
    # Fork workers from a per-node template that imported torch once (phalanx.supervisor.warm);
    # False (--cold-start) execs every worker. --no-python programs are always exec'd.
    warm_start: bool = True
    preload: tuple[str, ...] = ()  # modules the template imports besides torch (--preload)
    # One process per node that spawns its own workers (TRELLIS.2 style); phalanx appends
    # its node facts as flags, named by ``spawn_owner_flags`` (fact -> flag).
    spawn_owner: bool = False
    spawn_owner_flags: tuple[tuple[str, str], ...] = ()
    # Seconds without progress after which the ranks are declared hung (stacks dumped, a
    # hang report written, the round failed); None (the default, --stall-timeout 0) is off.
    stall_timeout: float | None = None
    # A node whose worker is the job's root cause this many failed rounds in a row is
    # excluded (0: never); exclusions go to the run directory's file and to exclude_file,
    # and a node listed in exclude_file is refused at start (phalanx.agent.exclusion).
    exclude_after: int = 0
    exclude_file: Path | None = None
    # Start even when the nodes' code or versions differ (a warning with the table instead
    # of stopping the job: phalanx.consistency).
    allow_mismatch: bool = False
    # --hosts/--hostfile: this process is the controller, starting an agent on every host
    # over ssh (phalanx.hosts); forward_env is what they are sent, beside the job's token.
    hosts: tuple[HostSlots, ...] = ()
    # With hosts: --nnodes MIN:MAX when given (the hosts started beyond MAX wait as spares);
    # None: every host started is a member (phalanx.hosts.plan).
    host_nodes: tuple[int, int] | None = None
    ssh_config: Path | None = None
    forward_env: tuple[tuple[str, str], ...] = ()
    # --metrics-port: serve this agent's events as Prometheus metrics on metrics_addr
    # (loopback by default: the numbers and host names are nobody else's business unless
    # asked; phalanx.events.metrics). None: not served.
    metrics_port: int | None = None
    metrics_addr: str = "127.0.0.1"
    # --node-check, --node-check-thresholds, --checkpoint-dir: the check before every round
    # of a multi-node job (phalanx.nodecheck); a single node skips it.
    node_check: CheckSettings = field(default_factory=CheckSettings)
    # --straggler-action/-fraction/-window: ranks whose step rate stays below their peers'
    # while training (phalanx.stragglers.watch).
    stragglers: StragglerSettings = field(default_factory=StragglerSettings)
    # torchrun flags accepted (so a torchrun command line keeps working) but not applied:
    # one line each, logged when the job starts.
    not_applied: tuple[str, ...] = ()
    # What the scheduler that started phalanx said (phalanx.environments, cli.scheduler): one
    # line per fact used, naming its variable; printed at start and by --dry-run.
    derived: tuple[str, ...] = ()

    @property
    def is_multi_node(self) -> bool:
        return self.max_nodes > 1

    @property
    def rdzv_conf_dict(self) -> dict[str, str]:
        return dict(self.rdzv_conf)
