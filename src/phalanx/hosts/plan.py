"""The multi-host plan, as plain data: every host's address, agent argv and ssh command, the
rendezvous they meet at and what they are sent on stdin. ``--dry-run`` prints it; the
controller only carries it out.

The agents form one job with the existing c10d rendezvous: the first host hosts the store
(``is_host=true``; the others connect), at the first host's ssh address and port 29400 unless
``--rdzv-endpoint`` says otherwise, under a run id generated per job (or ``--rdzv-id``).
A per-job secret travels in ``PHALANX_RDZV_TOKEN`` on stdin; the agents' store
authenticates every connection with it (``rendezvous.stores.agentstore``).
"""

from __future__ import annotations

import os
import secrets
import shlex
import sys
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from phalanx import parsing
from phalanx.config import HostSlots, LaunchConfig
from phalanx.hosts.remote_env import TOKEN_VAR, shown
from phalanx.hosts.skipped import Skipped, members_text, split_excluded
from phalanx.hosts.ssh import remote_command, resolve_address, ssh_argv

DEFAULT_RDZV_PORT = 29400
REMOTE_MODULE = "phalanx.cli.remote"
# Controller-only flags, never passed to the agents: name -> takes a value.
CONTROLLER_FLAGS = {"hosts": True, "hostfile": True, "ssh-config": True, "env": True,
                    "env-file": True, "dry-run": False}  # fmt: skip


@dataclass(frozen=True)
class HostPlan:
    entry: HostSlots
    addr: str  # where ssh reaches it (``ssh -G``); also its --local-addr
    agent_args: tuple[str, ...]  # after ``python -m phalanx.cli.remote``
    ssh: tuple[str, ...]  # the whole ssh command line

    @property
    def name(self) -> str:
        return self.entry.name


@dataclass(frozen=True)
class HostsPlan:
    hosts: tuple[HostPlan, ...]
    rdzv_addr: str
    rdzv_port: int
    hosted_by: str  # who serves the store, in words
    run_id: str
    env: Mapping[str, str]  # forwarded, the token included
    cwd: str
    python: str
    skipped: tuple[Skipped, ...] = ()  # listed in the exclusion file: not started
    spares: int = 0  # hosts started beyond --nnodes MAX: they wait as spares
    min_nodes: int | None = None  # --nnodes MIN (None: the job needs every member it started)

    @property
    def fails_over(self) -> bool:
        """Whether the job goes on when a member host is lost, the store's host too: three
        members or more (c10d's failover: design.md, "When the store's host is lost")."""
        return len(self.hosts) - self.spares >= 3

    @property
    def goes_on_without_one(self) -> bool:
        """Whether the others can go on when one member host leaves the job: a spare takes
        its place, the store fails over, or ``--nnodes MIN`` is below the members started."""
        members = len(self.hosts) - self.spares
        fewer = self.min_nodes is not None and self.min_nodes < members
        return bool(self.spares) or self.fails_over or fewer

    @property
    def workers(self) -> int:
        return sum(h.entry.slots for h in self.hosts)

    def describe(self) -> str:
        lines = [
            f"phalanx: {len(self.hosts)} hosts, {self.workers} workers; rendezvous c10d at "
            f"{self.rdzv_addr}:{self.rdzv_port} (hosted by {self.hosted_by}), "
            f"run id {self.run_id}; in {self.cwd} with {self.python}",
            "phalanx: environment sent to every host (on ssh's stdin, not a command line):",
            *(f"  {line}" for line in shown(self.env)),
            *(skipped.line() for skipped in self.skipped),
        ]
        if self.spares:
            lines.append(f"phalanx: the last {self.spares} host(s) started wait as spares")
        for host in self.hosts:
            lines.append(f"{host.name}: {shlex.join(host.ssh[:-1])} COMMAND")
            lines.append(f"  COMMAND: {host.ssh[-1]}")
        return "\n".join(lines)


def split_argv(argv: Sequence[str], script_args: int) -> tuple[list[str], list[str]]:
    """``argv`` -> (the launcher's flags without the controller-only ones, the program and its
    arguments). ``script_args``: how many arguments the program has (argparse counted them)."""
    cut = len(argv) - script_args - 1
    options, program = list(argv[:cut]), list(argv[cut:])
    kept: list[str] = []
    skip_value = False
    for word in options:
        if skip_value:
            skip_value = False
            continue
        flag = word[2:].split("=", 1)[0].replace("_", "-") if word.startswith("--") else ""
        if flag in CONTROLLER_FLAGS:
            skip_value = CONTROLLER_FLAGS[flag] and "=" not in word
            continue
        kept.append(word)
    return kept, program


def _overrides(
    config: LaunchConfig,
    entry: HostSlots,
    addr: str,
    endpoint: str,
    run_id: str,
    first: bool,
    nnodes: str,
) -> list[str]:
    # Who hosts: the first host, unless the user's own endpoint names where the store is
    # (then c10d's usual rule: the agent on the machine the endpoint names).
    hosting = () if config.rendezvous.rdzv_endpoint else (("is_host", str(first).lower()),)
    conf = ",".join(f"{k}={v}" for k, v in (*config.rendezvous.rdzv_conf, *hosting))
    return [
        "--nnodes", nnodes,
        "--nproc-per-node", str(entry.slots),
        "--rdzv-backend", "c10d",
        "--rdzv-endpoint", endpoint,
        "--rdzv-id", run_id,
        "--rdzv-conf", conf,
        "--local-addr", addr,
    ]  # fmt: skip


def build_hosts_plan(
    config: LaunchConfig, argv: Sequence[str], token: str | None = None
) -> HostsPlan:
    """Raises ``ValueError`` when a host's ssh configuration cannot be read, or when too
    few hosts are left once the excluded ones are skipped (``hosts.skipped``)."""
    addrs = [resolve_address(entry.host, config.remote.ssh_config) for entry in config.remote.hosts]
    started, skipped = split_excluded(config.remote.hosts, addrs, config.recovery.exclude_file)
    _enough(config, len(started), skipped)
    if config.remote.host_nodes is not None and config.remote.host_nodes[1] == 1:
        started = started[:1]  # one node has no rendezvous store: no spare could wait at it
    nnodes, spares = members_text(config.remote.host_nodes, len(started))
    rdzv_addr, rdzv_port = started[0][1], DEFAULT_RDZV_PORT
    hosted_by = started[0][0].name
    if config.rendezvous.rdzv_endpoint:
        given = parsing.parse_endpoint(config.rendezvous.rdzv_endpoint)
        rdzv_addr, rdzv_port = given.host, given.port or DEFAULT_RDZV_PORT
        hosted_by = "the agent on the machine it names"
    endpoint = f"[{rdzv_addr}]:{rdzv_port}" if ":" in rdzv_addr else f"{rdzv_addr}:{rdzv_port}"
    run_id = (
        config.rendezvous.rdzv_id
        if config.rendezvous.rdzv_id != "none"
        else f"phalanx-{uuid.uuid4().hex[:12]}"
    )
    options, program = split_argv(argv, len(config.workers.program_args))
    cwd, python = os.getcwd(), sys.executable
    plans = []
    for i, (entry, addr) in enumerate(started):
        overrides = _overrides(config, entry, addr, endpoint, run_id, i == 0, nnodes)
        args = (*options, *overrides, *program)
        command = remote_command(cwd, python, REMOTE_MODULE, args)
        plans.append(HostPlan(entry, addr, args, tuple(ssh_argv(entry.host, command, config.remote.ssh_config))))  # fmt: skip
    env = {**dict(config.remote.forward_env), TOKEN_VAR: token or secrets.token_hex(16)}
    return HostsPlan(
        tuple(plans), rdzv_addr, rdzv_port, hosted_by, run_id, env, cwd, python,
        tuple(skipped), spares,
        config.remote.host_nodes[0] if config.remote.host_nodes is not None else None,
    )  # fmt: skip


def _enough(config: LaunchConfig, started: int, skipped: list[Skipped]) -> None:
    """Raise ``ValueError`` when the hosts left cannot make the job (nothing is started)."""
    needed = config.remote.host_nodes[0] if config.remote.host_nodes is not None else 1
    if started >= needed:
        return
    names = ", ".join(s.name for s in skipped)
    raise ValueError(
        f"{started} host(s) left once those excluded in {config.recovery.exclude_file} are skipped "
        f"({names}); the job needs at least {needed} (--nnodes): add hosts to the list, "
        "or remove a host's line from the exclusion file to let it in"
    )


def plan_for_dry_run(config: LaunchConfig, argv: Sequence[str]) -> HostsPlan:
    return build_hosts_plan(config, argv, token="<secret>")
